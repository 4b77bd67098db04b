r"""Priors over a sequence of latents :math:`z_{1:T}`, one per view (``docs/theory.md``, sequences).

An RPM over T views (:class:`~rpm.RPM`) has the ELBO

.. math::

    \mathcal{L}(x_{1:T}) = \mathbb{E}_{Q(z_{1:T}|x_{1:T})}\Big[\log P(z_{1:T})
        + \sum_t \big(\log Q(z_t|x_t) - \log Q_t(z_t)\big) - \log Q(z_{1:T}|x_{1:T})\Big]
        + \text{const}

(Eq. 12 and 15 of Aitchison & Ganev with T views), with :math:`Q_t` the minibatch-mixture
marginals (:class:`~rpm.marginals._sequence_marginal.SequenceMixtureMarginal`). A sequence
prior declares one sample site ``"z"`` with event_shape (T, D) inside the model's plate over
the N sequences. :class:`~rpm.priors._base.SequencePrior` is the base class of this protocol,
with the hooks the model and :class:`~rpm.RPMELBO` call (``rpm.priors._base``); this module
holds

* :class:`MarkovImplicitPrior`: the chain of implicit conditionals,
  :math:`P(z_1) = Q_1(z_1)`, :math:`P(z_{t+1}|z_t) = Q_{t+1}(z_{t+1}) e^{f(z_t, z_{t+1})} /
  Z(z_t)`, whose ELBO is the sum of the InfoNCE terms of consecutive views (Eq. 23-25 per
  step) and, for T = 2, exactly the pair model's;
* :class:`MarkovPrior`: any pair prior applied along the chain, :math:`P(z_{1:T}) =
  P(z_1) \prod_t P(z_{t+1}|z_t)` with the pair prior's two factors, so a user's pair prior is a
  sequence prior without new code.

The linear-Gaussian state-space prior is :class:`~rpm.priors.StateSpacePrior`.
"""

from __future__ import annotations

import math

import pyro
import torch
from pyro import poutine
from pyro.distributions import Distribution, TorchDistribution
from torch.distributions import constraints

from rpm.marginals._candidates import Candidates
from rpm.marginals._sequence_marginal import SequenceMixtureMarginal, view
from rpm.ops._logsumexp import diagonal_log_softmax
from rpm.priors._base import Prior, SequencePrior, is_sequence_prior
from rpm.priors._energy_range import check_implicit_log_ratio
from rpm.priors._implicit import ImplicitPrior, tilt_factor

# The stacked path of MarkovImplicitPrior.sequence_log_ratio: at most this many entries of the
# ((T - 1) N)^2 matrix (small batches, where one kernel beats T - 1).
_STACKED_LIMIT = 2**14

__all__ = ["MarkovChain", "MarkovImplicitPrior", "MarkovPrior"]


class _BatchChain(TorchDistribution):
    """Base of the chains over a batch of N sequences whose ``log_prob`` and ``sample`` take the
    whole batch (N, T, D) at once: a value of another shape, an expansion to another batch and
    a draw are handled here; a subclass implements ``log_prob`` (after :meth:`_check_value`)
    and :meth:`_sample_batch`."""

    arg_constraints: dict = {}
    support = constraints.independent(constraints.real, 2)
    has_rsample = False
    #: How the errors name the chain.
    _what = "chain"

    def expand(self, batch_shape, _instance=None):
        if torch.Size(batch_shape) != self.batch_shape:
            raise ValueError(
                f"the {self._what} of {self.batch_shape[0]} sequences cannot be expanded to "
                f"{tuple(batch_shape)}; use a plate of the number of sequences")
        return self

    def _check_value(self, value: torch.Tensor) -> None:
        shape = self.batch_shape + self.event_shape
        if value.shape != shape:
            raise ValueError(
                f"the {self._what} is evaluated at the whole batch of sequences, shape "
                f"{tuple(shape)} (N, T, D); got {tuple(value.shape)}")

    def _sample_batch(self) -> torch.Tensor:
        """One draw of the whole batch, shape (N, T, D), without gradients."""
        raise NotImplementedError(f"{type(self).__name__} must implement _sample_batch()")

    def sample(self, sample_shape=torch.Size()) -> torch.Tensor:
        num_draws = torch.Size(sample_shape).numel()
        with torch.no_grad():
            draws = [self._sample_batch() for _ in range(num_draws)]
        return torch.stack(draws).reshape(self._extended_shape(sample_shape))


class MarkovImplicitPrior(SequencePrior):
    r"""The Markov implicit prior over T views with energy f: a chain of the pair's implicit
    conditionals (Eq. 21-22 of Aitchison & Ganev, one per step),

    .. math::

        P(z_1) = Q_1(z_1), \qquad P(z_{t+1}|z_t) = \frac{Q_{t+1}(z_{t+1})\, e^{f(z_t, z_{t+1})}}{Z(z_t)}.

    The marginals cancel in the ELBO and each sequence contributes the sum of the InfoNCE terms
    of its consecutive views (Eq. 23-25),

    .. math::

        \sum_{t=1}^{T-1} \Big[f(z_t, z_{t+1}) - \log \frac1N \sum_j e^{f(z_t, z_{j,t+1})}\Big],

    which :meth:`sequence_log_ratio` returns (through the pair prior's own
    :meth:`~rpm.priors.ImplicitPrior.log_ratio`, streamed for large batches or in blocks of the
    marginal's ``block_size``, as ``RPMELBO(block_size=...)`` asks); with T = 2 this is
    exactly the pair model's ELBO.

    Its Pyro program declares the latents from a proper distribution and the coupling as a
    factor (``docs/theory.md#normalised-sample-sites``): ``"z"`` is the N draws of the model's
    marginals :math:`\prod_t Q_t`, one event (N, T, D) over the batch (the normaliser of each
    step couples the sequences, :attr:`joint_over_batch`), and the factor ``"z_chain"`` is the
    sum of :meth:`sequence_log_ratio` (``rpm.priors._implicit.tilt_factor``), so that
    :math:`\log P(z_{1:N, 1:T}) = \sum_{n, t} \log Q_t(z_{n,t}) + \sum_n \text{log\_ratio}_n`.

    :param energy: f(z, z'), e.g. :class:`~rpm.priors.RBFEnergy`.
    """

    accepts_delta_recognition = True

    #: The normaliser of each step couples the sequences: ``"z"`` is one event (N, T, D).
    joint_over_batch = True

    def __init__(self, energy):
        super().__init__()
        self.pair = ImplicitPrior(energy)  # validates the energy
        self.dim = self.pair.dim

    @property
    def energy(self):
        """The energy f."""
        return self.pair.energy

    def forward(self, q: TorchDistribution, marginal: SequenceMixtureMarginal) -> torch.Tensor:
        """Declares ``"z"`` ~ the model's marginals, one event (N, T, D) over the batch, and
        the factor ``"z_chain"``, the sum of this class's :meth:`sequence_log_ratio`; returns
        z, (N, T, D)."""
        z = pyro.sample("z", marginal.to_event(1))
        tilt_factor("z_chain",
                    lambda z: MarkovImplicitPrior.sequence_log_ratio(self, z, q, marginal), z,
                    event_dim=3)
        return z

    def sequence_log_ratio(self, z: torch.Tensor, q: TorchDistribution,
                           marginal: SequenceMixtureMarginal,
                           candidates: Candidates | None = None,
                           block_size: int | None = None) -> torch.Tensor:
        """Per-sequence sum of the consecutive views' InfoNCE terms, shape (N,); over a global
        batch each step's normaliser runs over every process's (t+1)-th views."""
        if block_size is None:  # RPMELBO(block_size=...) reaches the marginal too
            block_size = getattr(marginal, "block_size", None)
        num, steps = z.shape[0], z.shape[1] - 1
        if (steps > 1 and block_size is None and (candidates is None or candidates.is_local)
                and (num * steps) ** 2 <= _STACKED_LIMIT):
            return self._stacked_log_ratio(z)
        total = z.new_zeros(num)
        for t in range(steps):
            total = total + self.pair.log_ratio(z[:, t], z[:, t + 1], view(q, t), view(q, t + 1),
                                                candidates, block_size)
        return total

    def _stacked_log_ratio(self, z: torch.Tensor) -> torch.Tensor:
        r""":meth:`sequence_log_ratio` of a small batch from one call of the energy: the matrix of
        :math:`f` between all (T - 1) N anchors :math:`z_{i,t}` and all partners
        :math:`z_{j,t+1}`, of which step t's (N, N) block is its InfoNCE matrix (the energy's
        ``forward`` is pairwise, so the other blocks are simply not used). One kernel instead of
        T - 1 costs (T - 1) times the entries and wins while launching kernels dominates."""
        num, steps, dim = z.shape[0], z.shape[1] - 1, z.shape[2]
        frames = z.transpose(0, 1).reshape((steps + 1) * num, dim)       # step-major rows
        anchors, partners = frames[:-num], frames[num:]                   # views 1..T-1, 2..T
        full = self.energy(anchors, partners).reshape(steps, num, steps, num)
        blocks = full.diagonal(dim1=0, dim2=2).permute(2, 0, 1)          # (T - 1, N, N)
        terms = diagonal_log_softmax(blocks, math.log(num))                 # (T - 1, N)
        ratio = terms.sum(0)
        check_implicit_log_ratio(type(self).__name__, self.energy, [frames], ratio)
        return ratio


class MarkovChain(_BatchChain):
    r"""A pair prior applied along a chain of T views.

    .. math::

        \log P(z_{1:T}) = \log P_\text{pair}(z_1) + \sum_{t=1}^{T-1}
            \log P_\text{pair}(z_{t+1} | z_t),

    where the pair prior, called as ``pair_prior(q_t, q_{t+1})`` with the recognition
    distributions of views t and t+1, declares :math:`z_1 \sim` its site ``"z"`` and
    :math:`z_{t+1} | z_t \sim` its site ``"z2"``. The log-densities are read from a trace of the
    pair prior with both sites conditioned on the value, so every pair prior works unchanged.

    :param pair_prior: a pair prior (``prior(q, q2)`` declaring ``"z"`` and ``"z2"``).
    :param q: recognition distributions, batch_shape (N, T), event_shape (D,).
    """

    _what = "Markov chain"

    def __init__(self, pair_prior, q: TorchDistribution, validate_args=None):
        self.pair_prior = pair_prior
        self.q = q
        num_sequences, num_views = q.batch_shape
        super().__init__(torch.Size([num_sequences]), torch.Size([num_views]) + q.event_shape,
                         validate_args=validate_args)

    def _step(self, t: int, data: dict) -> dict:
        """Runs the pair prior on views (t, t+1) with the sites in ``data`` (each (N, D))
        conditioned, under its own plate over the N sequences, its sample sites hidden from
        handlers outside (its params are not). Returns, for "z" and "z2", the value (N, D) and
        the log-density (N,)."""
        num_sequences = self.batch_shape[0]
        with poutine.block(hide_types=["sample", "observe"]):
            plate = pyro.plate("pairs", num_sequences)
            with plate:
                # Inside an outer plate (the model's) this plate sits further left: give the
                # conditioned values its shape (N, 1, ..., 1, D).
                assert plate.dim is not None  # set on entering the plate
                shape = (num_sequences,) + (1,) * (-1 - plate.dim)
                shaped = {name: value.reshape(shape + value.shape[-1:])
                          for name, value in data.items()}
                conditioned = poutine.condition(self.pair_prior, data=shaped)
                trace = poutine.trace(conditioned).get_trace(view(self.q, t), view(self.q, t + 1))
        names = sorted(name for name, site in trace.nodes.items() if site["type"] == "sample")
        if names != ["z", "z2"]:
            raise ValueError(
                f"MarkovPrior needs a pair prior that declares exactly the sample sites 'z' and "
                f"'z2'; {type(self.pair_prior).__name__} declared {names}")
        result = {}
        for name in names:
            fn, value = trace.nodes[name]["fn"], trace.nodes[name]["value"]
            assert isinstance(fn, Distribution) and value is not None  # a sample site's
            log_prob = fn.log_prob(value)
            if log_prob.numel() != num_sequences:
                raise ValueError(
                    f"MarkovPrior needs the pair prior's site {name!r} to have one log-density "
                    f"per pair ({num_sequences}), got shape {tuple(log_prob.shape)}")
            result[name] = (value.reshape(num_sequences, -1),
                            log_prob.reshape(num_sequences))
        return result

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        self._check_value(value)
        total: torch.Tensor | None = None
        for t in range(value.shape[1] - 1):
            step = self._step(t, {"z": value[:, t], "z2": value[:, t + 1]})
            if total is None:  # log P(z_1) + log P(z_2 | z_1)
                total = step["z2"][1] + step["z"][1]
            else:
                total = total + step["z2"][1]
        assert total is not None  # T >= 2 views
        return total

    def _sample_batch(self) -> torch.Tensor:
        step = self._step(0, {})
        values = [step["z"][0], step["z2"][0]]
        for t in range(1, self.event_shape[0] - 1):
            values.append(self._step(t, {"z": values[-1]})["z2"][0])
        return torch.stack(values, dim=1)


class MarkovPrior(SequencePrior):
    r"""Any pair prior as a sequence prior: :math:`P(z_{1:T}) = P(z_1) \prod_t P(z_{t+1}|z_t)`
    with the pair prior's :math:`P(z)` and :math:`P(z'|z)` (:class:`MarkovChain`).

    .. code-block:: python

        prior = MarkovPrior(LinearDynamicsPrior(dim=3))   # P(z'|z) = N(A z, Sigma) along t

    With T = 2 the sequence model is the pair model with this prior. For the implicit prior use
    :class:`MarkovImplicitPrior`: it cancels the marginals analytically, uses the model's own
    (per-view or pooled) marginals, and samples inside the model's plate (the pair
    ``ImplicitPrior`` couples the pairs of a batch, ``joint_over_batch``, and is refused here).

    :param pair_prior: a pair prior, ``prior(q, q2)`` declaring the sites ``"z"`` and ``"z2"``.
    """

    def __init__(self, pair_prior):
        super().__init__()
        if not callable(pair_prior):
            raise TypeError(f"pair_prior must be callable as prior(q, q2), got {pair_prior!r}")
        if is_sequence_prior(pair_prior):
            raise TypeError(
                f"MarkovPrior chains a pair prior (rpm.priors.Prior, forward(q, q2)); "
                f"{type(pair_prior).__name__} is already a prior over J views: give it to "
                "rpm.RPM directly")
        if isinstance(pair_prior, Prior) and pair_prior.joint_over_batch:
            raise ValueError(
                f"{type(pair_prior).__name__} couples the pairs of a batch (joint_over_batch): "
                "it has no per-pair factors to chain along t. For the implicit prior use "
                "MarkovImplicitPrior(energy)")
        self.pair_prior = pair_prior
        # A plain callable gets the defaults of rpm.priors.Prior's hooks.
        if isinstance(pair_prior, Prior):
            self.accepts_delta_recognition = pair_prior.accepts_delta_recognition
            self.dim = pair_prior.dim

    def forward(self, q: TorchDistribution, marginal: SequenceMixtureMarginal) -> torch.Tensor:
        """Declares ``"z"`` ~ :class:`MarkovChain` of the pair prior; returns z, (N, T, D)."""
        return pyro.sample("z", MarkovChain(self.pair_prior, q))
