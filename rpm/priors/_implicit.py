r"""The uniform-implicit prior of Aitchison & Ganev (Eq. 21-22): the prior under which the RPM
ELBO is InfoNCE.

.. math::

    P(z) = Q(z), \qquad P(z'|z) = \frac{Q(z')\, e^{f(z, z')}}{Z(z)}, \qquad
    Z(z) = \mathbb{E}_{Q(z')} e^{f(z, z')},

with Q the minibatch-mixture recognition marginal. The prior declares its latents from proper
distributions and its coupling as a factor (``docs/theory.md#normalised-sample-sites``): the
sample sites ``"z"`` and ``"z2"`` are N independent draws from the
:class:`~rpm.marginals.MixtureMarginal` of each view's recognition distributions (normalised:
``sample`` draws from the density ``log_prob`` defines), and the tilt
:math:`\sum_i f(z_i, z'_i) - \log \hat Z(z_i)` enters as the ``pyro.factor`` ``"z_to_z2"``
(``tilt_factor``), with :math:`Z(z_i)` estimated, as InfoNCE does, over the batch's own
second-view latents (positive included): :math:`\hat Z(z_i) = \frac1N \sum_j e^{f(z_i,
z'_j)}`. The model's density is then :math:`\prod_i Q(z_i) Q(z'_i) e^{f(z_i, z'_i)} / \hat
Z(z_i)`, unnormalised as any model with a factor is, and Pyro's tools read it as such: ELBOs,
importance weights and ``trace.log_prob_sum()`` include the factor, ``Predictive`` without a
guide draws the latents from the mixtures. What each ELBO bounds:
``docs/theory.md#what-each-elbo-bounds`` (with Delta encoders a tight ELBO of the batch's
empirical distribution; with stochastic encoders an estimate biased upwards; in expectation
over batches, always the InfoNCE lower bound on :math:`I_Q(z; z')`, and at most
:math:`\log N`).

In the ELBO (Eq. 15) :math:`\log Q(z)` and :math:`\log Q(z')` cancel and each pair contributes

.. math::

    f(z_i, z'_i) - \log \frac1N \sum_j e^{f(z_i, z'_j)}
    = -\text{CrossEntropy}(F_{i\cdot}, i) + \log N  \qquad\text{(Eq. 23-25)}.
"""

from __future__ import annotations

import math

import pyro
import torch
from pyro.distributions import TorchDistribution
from pyro.nn import PyroModule

from rpm.marginals import MixtureMarginal
from rpm.marginals._candidates import Candidates
from rpm.ops._dispatch import use_streaming
from rpm.ops._logsumexp import diagonal_log_softmax, safe_logsumexp, streaming_matmul_logsumexp
from rpm.priors._base import Energy, Prior
from rpm.priors._energy_paths import blocked_energy_logsumexp, energy_logit_factors, energy_paired
from rpm.priors._energy_range import check_implicit_log_ratio

__all__ = [
    "ImplicitPrior",
    "energy_log_normalizer",
    "energy_logit_factors",
    "energy_paired",
    "tilt_factor",
]

def _implicit_log_ratio(energy_matrix: torch.Tensor) -> torch.Tensor:
    r"""Per-pair :math:`\log P(z_i, z'_i) - \log Q(z_i) - \log Q(z'_i)` under the implicit prior.

    .. math::

        F_{ii} - \operatorname{logsumexp}_j F_{ij} + \log N

    :param torch.Tensor energy_matrix: :math:`F_{ij} = f(z_i, z'_j)`, shape (N, N).
    :return: shape (N,).
    """
    # one fused kernel pair (rpm.ops.diagonal_log_softmax): the same values as
    # diagonal - safe_logsumexp + log N, without autograd's dozen nodes per step
    return diagonal_log_softmax(energy_matrix, math.log(energy_matrix.shape[-1]))


def energy_log_normalizer(
    energy: Energy, z: torch.Tensor, z2: torch.Tensor, block_size: int | None = None
) -> torch.Tensor:
    r"""The InfoNCE log-normaliser :math:`\log \sum_j e^{f(z_i, z'_j)}` of each row.

    .. math::

        \log \hat Z(z_i) + \log M = \log \sum_{j=1}^M e^{f(z_i, z'_j)}

    (Eq. 23-25 of Aitchison & Ganev, without the :math:`-\log M`). Dense, the log-sum-exp of
    ``energy(z, z2)`` over its rows (:func:`~rpm.ops.safe_logsumexp`), unless ``block_size`` is
    given or the (N, M) matrix is large (``rpm.ops._dispatch.use_streaming``); then
    streamed in blocks: through the energy's matrix-product factors
    (:func:`energy_logit_factors`, O((N + M) D) memory) when they describe its ``forward``
    (``rpm.priors._energy_paths``), else from ``forward`` on tiles
    (:func:`~rpm.priors._energy_paths.blocked_energy_logsumexp`). Every path computes what the
    energy's ``forward`` computes.

    :param energy: the energy f.
    :param torch.Tensor z: first-view latents, shape (N, D).
    :param torch.Tensor z2: the candidates :math:`z'_j` (the batch's second-view latents, or a
        gathered global batch), shape (M, D).
    :param block_size: stream in blocks of this many rows and columns; ``None`` decides by size.
    :return: shape (N,).
    :rtype: torch.Tensor
    """
    if not use_streaming(z.shape[0], z2.shape[0], z.device, block_size):
        return safe_logsumexp(energy(z, z2), dim=-1)
    factors = energy_logit_factors(energy, z, z2)
    if factors is None:
        return blocked_energy_logsumexp(energy, z, z2, block_size)[0]
    return _streamed_log_normalizer(factors, block_size)


def _streamed_log_normalizer(factors: tuple, block_size: int | None) -> torch.Tensor:
    """``energy_log_normalizer`` from the factors ``(left, right, row_offset)``."""
    left, right, row_offset = factors
    lse = streaming_matmul_logsumexp(left, right, block_size)
    return lse if row_offset is None else lse + row_offset


def tilt_factor(name: str, tilt, *values: torch.Tensor, event_dim: int = 2) -> torch.Tensor:
    r"""Declares the ``pyro.factor`` ``name`` whose log-weight is ``tilt(*batch)`` summed, for
    each batch of the broadcast leading dimensions of ``values`` (e.g. a plate of particles or of
    Predictive's samples), and returns that log-weight.

    The implicit priors declare their latents from proper distributions (the recognition
    mixtures) and their coupling as this factor,

    .. math::

        \log P(z_{1:N}, z'_{1:N}) = \sum_i \log Q(z_i) + \sum_i \log Q(z'_i)
        + \underbrace{\sum_i r_i}_{\text{factor}}, \qquad
        r_i = f(z_i, z'_i) - \log \hat Z(z_i),

    so that every sample site is a normalised distribution whose ``sample`` draws from its
    ``log_prob`` (``docs/theory.md#normalised-sample-sites``), while the model's density is that
    of the prior of Eq. 21-22 with the estimated normaliser.

    :param str name: the factor's site name.
    :param tilt: maps one batch of each value (its last ``event_dim`` dimensions) to the
        per-instance tilts :math:`r_i`, shape (N,).
    :param values: the sites' values, shape (..., N, D) (``event_dim`` 2) or (..., N, J, D)
        (``event_dim`` 3).
    :param int event_dim: the dimensions of one batch of a value.
    :return: the log-weight, shape: the broadcast leading dimensions of ``values``.
    """
    lead = torch.broadcast_shapes(*(value.shape[:-event_dim] for value in values))
    flat = [value.expand(lead + value.shape[-event_dim:]).reshape(
        (-1,) + value.shape[-event_dim:]) for value in values]
    log_weight = torch.stack([tilt(*batch).sum() for batch in zip(*flat, strict=True)])
    log_weight = log_weight.reshape(lead)
    pyro.factor(name, log_weight)
    return log_weight


class ImplicitPrior(Prior):
    r"""The uniform-implicit prior with energy f (Eq. 21-22 of Aitchison & Ganev).

    .. math::

        P(z) = Q(z), \qquad P(z'|z) = Q(z') e^{f(z,z')} / Z(z).

    Called as ``prior(q, q2)``, it declares the sample sites ``"z"`` and ``"z2"``, each the N
    draws of a view's :class:`~rpm.marginals.MixtureMarginal` as one event of shape (N, D),
    and the factor ``"z_to_z2"``, the tilt :math:`\sum_i f(z_i, z'_i) - \log \hat Z(z_i)`
    (its :meth:`log_ratio` summed, ``tilt_factor``); it returns the sites' values. Every
    sample site is a normalised distribution whose ``sample`` draws from its ``log_prob``, and
    the model's density, sites and factor together, is the prior's of Eq. 21-22. Its
    normaliser couples the pairs of the batch, so it is :attr:`joint_over_batch`: the
    :class:`~rpm.RPM` calls it outside its plate over the pairs and its guide declares the same
    two sites as whole-batch events. Its ELBO is InfoNCE with critic f: per pair,
    ELBO = -CrossEntropy + log N (Eq. 23-25): the one-directional, cross-view form that
    info-nce-pytorch computes (SimCLR's NT-Xent is :class:`~rpm.priors.PooledImplicitPrior`).
    The ELBO is a tight ELBO of the batch's empirical distribution with Delta encoders, an
    upward-biased estimate with stochastic ones, and in expectation over batches the InfoNCE
    lower bound on the mutual information :math:`I_Q(z; z')`
    (``docs/theory.md#what-each-elbo-bounds``).

    :param Energy energy: f(z, z'), e.g. :class:`~rpm.priors.CosineEnergy`.
    """

    #: :math:`P(z'|z)` is a density relative to Q(z'), so deterministic (Delta) encoders are fine.
    accepts_delta_recognition = True

    #: The conditional is normalised over the batch's own z2: the sites are whole-batch events.
    joint_over_batch = True

    #: The normaliser may take a queue's latents as extra candidates (MoCo).
    accepts_queue = True

    # read-only, the energy's: PriorBase's dim is a plain attribute that other priors set
    @property
    def dim(self) -> int | None:  # type: ignore[override]
        """The energy's latent dimension (None for an energy built for any)."""
        return self.energy.dim if isinstance(self.energy, Energy) else None

    def __init__(self, energy: Energy):
        super().__init__()
        if isinstance(energy, Prior):
            walk = (" (or its step density as the energy: rpm.priors.RandomWalkEnergy(walk))"
                    if hasattr(energy, "step") else "")
            raise TypeError(
                f"{type(self).__name__} needs an energy f(z, z'), got the prior "
                f"{type(energy).__name__}: pass an explicit prior to rpm.RPM directly{walk}")
        if not isinstance(energy, torch.nn.Module) or not callable(energy):
            raise TypeError(
                f"{type(self).__name__} needs an energy module mapping (z (N, D), z2 (M, D)) to "
                f"an (N, M) matrix, e.g. rpm.priors.RBFEnergy(); got {type(energy).__name__}"
            )
        self.energy = energy

    def forward(self, q: TorchDistribution, q2: TorchDistribution,
                candidates: Candidates | None = None):
        """Declares ``z ~ Q(z)`` and ``z2 ~ Q(z')``, each one event over the batch (shape (N, D),
        outside the plate over the pairs, :attr:`joint_over_batch`), and the factor
        ``"z_to_z2"``, the sum of this class's :meth:`log_ratio` (a subclass that overrides
        :meth:`log_ratio`, e.g. to return None and have the ELBO trace this program, keeps this
        model); returns ``(z, z2)``. The queue of ``candidates``, if any, joins the normaliser."""
        z = pyro.sample("z", MixtureMarginal(q).to_event(1))
        z2 = pyro.sample("z2", MixtureMarginal(q2).to_event(1))
        tilt_factor("z_to_z2", lambda z, z2: ImplicitPrior.log_ratio(
            self, z, z2, candidates=candidates), z, z2)
        return z, z2

    def log_ratio(
        self, z: torch.Tensor, z2: torch.Tensor, q=None, q2=None,
        candidates: Candidates | torch.Tensor | None = None, block_size: int | None = None,
    ) -> torch.Tensor:
        r"""Per-pair :math:`\log P(z_i, z'_i) - \log Q(z_i) - \log Q(z'_i)`, the terms of Eq. 15
        that remain after the analytic cancellation (shape (N,)):

        .. math::

            f(z_i, z'_i) - \log \sum_{j=1}^{M} e^{f(z_i, z'_j)} + \log M,

        with the candidates :math:`z'_{1:M}` the batch's own z2 or, for a global batch across
        processes, every rank's z2 (gathered with :func:`rpm.distributed.all_gather_with_grad`)
        and a queue's latents. The normaliser is streamed for large
        batches (``energy_log_normalizer``). Under Pyro's validation a result or gradients
        that would not be finite in the latents' dtype raise a ValueError naming the valid
        range of latent norms (``rpm.priors._energy_range.check_implicit_log_ratio``).

        :param torch.Tensor z: shape (N, D).
        :param torch.Tensor z2: shape (N, D), paired with z.
        :param candidates: a :class:`~rpm.marginals._candidates.Candidates` (every process's z2,
            then a queue's latents: :meth:`~rpm.marginals._candidates.Candidates.negatives`), or
            the candidate latents themselves, shape (M, D); default the batch's z2.
        :param block_size: block edge of the streamed normaliser; ``None`` decides by size.
        """
        if isinstance(candidates, Candidates):
            negatives = None if candidates.is_local else candidates.negatives(z2)
        else:
            negatives = candidates
        rows = z2 if negatives is None else negatives
        energy = self._modules.get("energy")  # a PyroModule's __getattr__ would only return it
        if not isinstance(energy, PyroModule):
            energy = self.energy  # a plain module: registered with Pyro by the access
        ratio = self._log_ratio(z, z2, rows, negatives is None, block_size, energy)
        check_implicit_log_ratio(type(self).__name__, energy, [z, z2, rows], ratio)
        return ratio

    def log_ratio_sum(
        self, z: torch.Tensor, z2: torch.Tensor, q=None, q2=None,
        candidates: Candidates | torch.Tensor | None = None, block_size: int | None = None,
    ) -> torch.Tensor | None:
        r"""The sum over the N pairs of :meth:`log_ratio`. With the batch's own z2 as the
        candidates and the dense (N, N) matrix :math:`F_{ij} = f(z_i, z'_j)`, it is the trace
        of the row-wise log-softmax (its diagonal summed),

        .. math::

            \sum_{i=1}^N \Big[F_{ii} - \log \sum_{j=1}^N e^{F_{ij}}\Big] + N \log N
            = \operatorname{tr}\big(\log\operatorname{softmax}(F)\big) + N \log N,

        read without forming the N terms (the range check reads the sum); otherwise (other
        candidates, a streamed normaliser, or a subclass that redefines :meth:`log_ratio`) the
        sum of :meth:`log_ratio` (None when a subclass's :meth:`log_ratio` is None).
        """
        energy = self._modules.get("energy")
        own = candidates is None or (isinstance(candidates, Candidates) and candidates.is_local)
        if (type(self).log_ratio is not ImplicitPrior.log_ratio or not own
                or not isinstance(energy, PyroModule)
                or use_streaming(z.shape[0], z2.shape[0], z.device, block_size)):
            # Prior.log_ratio_sum's sum, of this class's candidates (tensors too)
            ratio: torch.Tensor | None = self.log_ratio(z, z2, q, q2, candidates, block_size)
            return None if ratio is None else ratio.sum()
        num_pairs = z.shape[0]
        # the per-pair kernel without its offset, summed; N log N added once to the sum
        total = diagonal_log_softmax(energy(z, z2)).sum() + num_pairs * math.log(num_pairs)
        check_implicit_log_ratio(type(self).__name__, energy, [z, z2], total, num_pairs=num_pairs)
        return total

    def _log_ratio(self, z: torch.Tensor, z2: torch.Tensor, candidates: torch.Tensor,
                   own: bool, block_size: int | None, energy: torch.nn.Module | None = None
                   ) -> torch.Tensor:
        """:meth:`log_ratio` with the candidates given (``own``: they are z2)."""
        if energy is None:
            energy = self.energy
        if not use_streaming(z.shape[0], candidates.shape[0], z.device, block_size):
            if own:
                # Dense: one N x N matrix gives both the positives and the normaliser.
                return _implicit_log_ratio(energy(z, z2))
            positive = energy_paired(energy, z, z2)
            normalizer = safe_logsumexp(energy(z, candidates), dim=-1)
        else:
            factors = energy_logit_factors(energy, z, candidates)
            if factors is not None:
                positive = energy_paired(energy, z, z2, block_size)
                normalizer = _streamed_log_normalizer(factors, block_size)
            else:
                # forward on tiles; the positives come from the same tiles for the batch's own z2
                normalizer, tiled = blocked_energy_logsumexp(
                    energy, z, candidates, block_size, positive_shift=0 if own else None)
                positive = energy_paired(energy, z, z2, block_size) if tiled is None else tiled
        return positive - normalizer + math.log(candidates.shape[0])
