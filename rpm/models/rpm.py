r"""The recognition parameterised model (RPM) as a Pyro model and guide
(``docs/theory.md#pyro-model-and-guide``).

Generative model (Eq. 9 of Aitchison & Ganev): :math:`P(x, x', z, z') = P(z, z') P(x|z) P(x'|z')`
with the likelihood defined from the recognition joint (Eq. 10):

.. math::

    P(x|z) = \frac{Q(z|x)\, P_\text{true}(x)}{Q(z)},

where :math:`Q(z)` is the minibatch-mixture recognition marginal (the prior may choose another
estimate of it, :meth:`~rpm.priors.base.Prior.likelihood_marginals`). :math:`P_\text{true}(x)` is
constant in every parameter and is left out, so the likelihood enters the model as the factor
:math:`\log Q(z|x) - \log Q(z)`. The guide is the recognition models themselves,
:math:`Q(z, z'|x, x') = Q(z|x) Q(z'|x')` (Eq. 14), so Pyro's ``Trace_ELBO`` on ``(model, guide)``
computes Eq. 15 summed over the batch:

.. math::

    \sum_i \mathbb{E}_{Q(z_i|x_i) Q(z'_i|x'_i)}\big[\log P(z_i, z'_i) - \log Q(z_i) - \log Q(z'_i)\big].
"""

from __future__ import annotations

import pyro
import torch
from pyro import poutine
from pyro.distributions import Delta, TorchDistribution
from pyro.infer.util import is_validation_enabled
from pyro.nn import pyro_method

from rpm.distributed import all_gather_with_grad
from rpm.marginals import (
    MixtureMarginal,
    delta_mixture_log_prob,
    gaussian_mixture_log_prob,
)
from rpm.models.base import RPMBase
from rpm.models.recognition import DeltaRecognition
from rpm.priors.base import Prior

__all__ = ["RPM"]


def _accepts_delta(prior) -> bool:
    """The prior's :attr:`~rpm.priors.base.Prior.accepts_delta_recognition` (False, the
    default, for a plain callable)."""
    return isinstance(prior, Prior) and prior.accepts_delta_recognition


def _joint_over_batch(prior) -> bool:
    """The prior's :attr:`~rpm.priors.base.Prior.joint_over_batch` (False for a plain callable)."""
    return isinstance(prior, Prior) and prior.joint_over_batch


def _likelihood_marginals(
    prior, q: TorchDistribution, q2: TorchDistribution
) -> tuple[MixtureMarginal, MixtureMarginal]:
    """The prior's :meth:`~rpm.priors.base.Prior.likelihood_marginals` (each view's own
    :class:`~rpm.marginals.MixtureMarginal` for a plain callable), checked."""
    if not isinstance(prior, Prior):
        return MixtureMarginal(q), MixtureMarginal(q2)
    marginals = prior.likelihood_marginals(q, q2)
    if not (isinstance(marginals, tuple) and len(marginals) == 2
            and all(isinstance(m, MixtureMarginal) for m in marginals)):
        raise TypeError(
            f"{type(prior).__name__}.likelihood_marginals(q, q2) must return a pair of "
            f"rpm.MixtureMarginal (the marginals of the likelihood factors 'x' and 'x2'), got "
            f"{_kinds(marginals)}"
        )
    for name, marginal, view in (("first", marginals[0], q), ("second", marginals[1], q2)):
        if marginal.batch_shape != view.batch_shape or marginal.event_shape != view.event_shape:
            raise ValueError(
                f"{type(prior).__name__}.likelihood_marginals returned for the {name} view a "
                f"marginal of batch_shape {tuple(marginal.batch_shape)} and event_shape "
                f"{tuple(marginal.event_shape)}; it must match the view's recognition, "
                f"{tuple(view.batch_shape)} and {tuple(view.event_shape)} (expand it)"
            )
    return marginals


def _kinds(value) -> str:
    """The type of ``value``, or of each item of a tuple or list, for an error message."""
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__} of " + ", ".join(type(v).__name__ for v in value)
    return type(value).__name__


def _log_likelihood(q: TorchDistribution, marginal: MixtureMarginal, z: torch.Tensor) -> torch.Tensor:
    r"""The likelihood factor :math:`\log Q(z|x) - \log Q_v(z)` of Eq. 10 (without
    :math:`\log P_\text{true}(x)`), shape of ``q.log_prob(z)``; :math:`Q_v` is the view's
    likelihood marginal (:meth:`~rpm.priors.base.Prior.likelihood_marginals`).

    For Delta recognition a latent off the view's atoms has :math:`\log Q(z|x) = -\infty`
    (and :math:`\log Q_v(z)` may be :math:`-\infty` too; its own prior site is
    :math:`-\infty`): the factor is :math:`-\infty` there, not :math:`-\infty - (-\infty)` =
    NaN."""
    log_q = q.log_prob(z)
    ratio = log_q - marginal.log_prob(z)
    return torch.where(torch.isneginf(log_q), log_q, ratio)


def _marginal_log_prob(
    marginal: MixtureMarginal, z: torch.Tensor, global_batch: bool, block_size: int | None
) -> torch.Tensor:
    """log Q_v(z_i) under the mixture ``marginal`` (Eq. 11), its components gathered from every
    rank if asked; shape (N,)."""
    if not global_batch and block_size is None:
        return marginal.log_prob(z)
    if marginal.exclude_self:
        raise ValueError(
            "a likelihood marginal with exclude_self cannot be evaluated over a global batch or "
            "in blocks; return a MixtureMarginal without exclude_self from likelihood_marginals"
        )
    if marginal.family == "generic":  # components of another family: their own log_prob
        if global_batch:
            family = type(getattr(marginal.q, "base_dist", marginal.q)).__name__
            raise ValueError(
                f"a global batch gathers the parameters of Gaussian or Delta recognition; "
                f"{family} recognition has no such gather: train it without "
                "global_batch (or use rpm.GaussianRecognition / rpm.DeltaRecognition)"
            )
        return marginal.log_prob_rows(z, block_size=block_size)
    loc, scale = marginal.loc, marginal.scale  # (K, D), (K, D) or None
    if global_batch:
        if scale is None:
            loc = all_gather_with_grad(loc)
        else:  # one collective for both
            loc, scale = all_gather_with_grad(torch.cat([loc, scale], dim=1)).chunk(2, dim=1)
    if scale is None:
        return delta_mixture_log_prob(z, loc)
    return gaussian_mixture_log_prob(z, loc, scale, block_size=block_size)


class RPM(RPMBase):
    r"""A recognition parameterised model with a prior over a pair of latents.

    .. code-block:: python

        rpm = RPM(DeltaRecognition(encoder), ImplicitPrior(CosineEnergy(kappa=10.0)))
        svi = pyro.infer.SVI(rpm.model, rpm.guide, pyro.optim.Adam({"lr": 1e-3}), RPMELBO())
        svi.step(x, x2)   # x, x2: (N, ...) paired views

    ``model(x, x2)`` declares the prior's sample sites ``"z"`` and ``"z2"`` and, inside
    ``pyro.plate("pairs", N)``, the likelihood factors ``"x"`` and ``"x2"`` with log-densities
    :math:`\log Q(z|x) - \log Q(z)` and :math:`\log Q(z'|x') - \log Q(z')` (Eq. 10), Q being the
    marginals the prior names (:meth:`~rpm.priors.base.Prior.likelihood_marginals`; by default
    each view's own minibatch mixture). ``guide(x, x2)`` samples ``"z" ~ Q(z|x)`` and
    ``"z2" ~ Q(z'|x')``. The prior's sites are per pair (inside the plate, batch_shape (N,))
    unless the prior couples the pairs (:attr:`~rpm.priors.base.Prior.joint_over_batch`, the
    implicit prior): then ``"z"`` and ``"z2"`` are whole-batch events of shape (N, D) in model
    and guide alike. Either way Pyro's ``Trace_ELBO``, ``TraceGraph_ELBO``, ``JitTrace_ELBO``,
    vectorised particles and ``Predictive`` see honest shapes.

    **Parameters.** The model's ``name`` prefixes its parameters in Pyro's param store
    (``"a.prior.energy.lengthscale"``, ``"a.recognition.net$$$0.weight"`` for ``name="a"``), as
    a :class:`~pyro.nn.PyroModule`'s do; the default names are unique in the process. So two
    RPMs, or two RPMs sharing one encoder network, train side by side under ``SVI`` (with
    ``Trace_ELBO``, ``TraceGraph_ELBO``, ``JitTrace_ELBO`` or :class:`~rpm.RPMELBO`) or a
    ``torch.optim`` loop over ``rpm.parameters()``, with no ``pyro.clear_param_store()``
    between them, and ``pyro.get_param_store().save()`` holds all of them. To restore a model,
    use ``rpm.state_dict()`` and ``load_state_dict()`` (learned hyperparameters included):
    Pyro does not copy a loaded param store back into a module's ``nn.Parameter`` s (see the
    README's section on parameters).

    :param recognition: Q(z|x), a :class:`~rpm.GaussianRecognition` or
        :class:`~rpm.DeltaRecognition` (any module returning a batch of distributions with
        batch_shape (N,) and event_shape (D,)).
    :param prior: a :class:`~rpm.priors.base.Prior` (or a plain callable ``prior(q, q2) ->
        (z, z2)`` declaring the sites ``"z"`` and ``"z2"``, which gets the hooks' defaults).
    :param recognition2: Q(z'|x') for the second view; by default the first view's model is
        shared.
    :param name: the prefix of the model's parameters in Pyro's param store; by default
        ``"rpm"``, ``"rpm_1"``, ... (unique in the process, :class:`~rpm.models.base.RPMBase`).
    :raises ValueError: for a deterministic encoder (Delta, no noise) with a prior that is an
        explicit continuous density (Appendix B of Aitchison & Ganev).
    """

    def __init__(self, recognition, prior, recognition2=None, name: str | None = None):
        super().__init__(name)
        for name, module in (("recognition", recognition), ("recognition2", recognition2)):
            if module is not None and not callable(module):
                raise TypeError(f"{name} must be callable (x -> distribution), got {module!r}")
        if not callable(prior):
            raise TypeError(f"prior must be callable as prior(q, q2), got {prior!r}")
        self.adopt(recognition=recognition, recognition2=recognition2, prior=prior)
        if not _accepts_delta(prior):
            for name, module in (("recognition", recognition), ("recognition2", recognition2)):
                if isinstance(module, DeltaRecognition) and module.is_deterministic:
                    raise ValueError(_delta_with_density_message(name, prior))

    def recognise(
        self, x: torch.Tensor, x2: torch.Tensor
    ) -> tuple[TorchDistribution, TorchDistribution]:
        """Validates a batch of pairs and returns the recognition distributions (q, q2),
        each with batch_shape (N,) and event_shape (D,)."""
        for name, value in (("x", x), ("x2", x2)):
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
            if value.dim() < 1:
                raise ValueError(f"{name} must have a batch dimension, got a scalar")
        if x.shape[0] != x2.shape[0]:
            raise ValueError(
                f"x and x2 are paired views and need the same batch size, got {x.shape[0]} and "
                f"{x2.shape[0]}; pass the two views of the same N pairs (x[i] and x2[i] form "
                "pair i)"
            )
        if x.shape[0] < 2:
            raise ValueError(
                f"a batch of {x.shape[0]} pair has nothing to contrast: the recognition marginal "
                "is a mixture over the batch, so use at least 2 pairs (in practice many more)"
            )
        if is_validation_enabled():
            for name, value in (("x", x), ("x2", x2)):
                _check_finite_input(name, value)
        q = self.recognition(x)
        q2 = (self.recognition2 or self.recognition)(x2)
        for name, dist in (("recognition", q), ("recognition2", q2)):
            if dist.batch_shape != (x.shape[0],) or len(dist.event_shape) != 1:
                raise ValueError(
                    f"{name} must return a distribution with batch_shape (N,) = ({x.shape[0]},) "
                    f"and event_shape (D,), got batch_shape {tuple(dist.batch_shape)} and "
                    f"event_shape {tuple(dist.event_shape)}"
                )
        if q.event_shape != q2.event_shape:
            raise ValueError(
                f"the two views' latents have different dimensions {q.event_shape[0]} and "
                f"{q2.event_shape[0]}; both encoders must output the same latent dimension"
            )
        prior_dim = self.prior.dim if isinstance(self.prior, Prior) else None
        if prior_dim is not None and prior_dim != q.event_shape[0]:
            raise ValueError(
                f"the prior was built for latent dimension {prior_dim} but the encoder outputs "
                f"dimension {q.event_shape[0]}; make them agree (e.g. dim={q.event_shape[0]})"
            )
        if not _accepts_delta(self.prior):
            for name, dist in (("recognition", q), ("recognition2", q2)):
                if isinstance(dist, Delta):
                    raise ValueError(_delta_with_density_message(name, self.prior))
        return q, q2

    @pyro_method
    def sample_prior(self, q: TorchDistribution, q2: TorchDistribution):
        """Runs the prior inside the current plate and checks it declared ``"z"`` and ``"z2"``."""
        with poutine.trace() as tracer:
            result = self.prior(q, q2)
        missing = [name for name in ("z", "z2") if name not in tracer.trace.nodes]
        if missing:
            raise ValueError(
                f"the prior {type(self.prior).__name__} did not declare the sample site(s) "
                f"{missing}; a prior must call pyro.sample('z', ...) and pyro.sample('z2', ...) "
                "and return (z, z2)"
            )
        if not (isinstance(result, tuple) and len(result) == 2):
            got = type(result).__name__
            if isinstance(result, (tuple, list)):
                got += f" of length {len(result)}"
            raise ValueError(
                f"the prior {type(self.prior).__name__} must return the pair (z, z2), got "
                f"{got}; end its forward with `return z, z2`"
            )
        return result

    @pyro_method
    def model(self, x: torch.Tensor, x2: torch.Tensor):
        r"""The generative model of Eq. 9-10: prior sites "z", "z2"; likelihood factors "x", "x2".

        The factors are per pair, inside ``pyro.plate("pairs", N)``; so are the prior's sites,
        unless the prior is :attr:`~rpm.priors.base.Prior.joint_over_batch` (the implicit
        prior), whose sites are whole-batch events declared outside the plate."""
        q, q2 = self.recognise(x, x2)
        pairs = pyro.plate("pairs", x.shape[0])
        if _joint_over_batch(self.prior):
            z, z2 = self.sample_prior(q, q2)
            # A whole-batch event under an outer plate (vectorised particles, Predictive) has
            # batch_shape (..., 1): the 1 is this plate's slot. Its N rows take that slot.
            rows, rows2 = (value.squeeze(-3) if value.dim() > 2 else value for value in (z, z2))
        else:
            with pairs:
                z, z2 = self.sample_prior(q, q2)
            rows, rows2 = z, z2
        marginal, marginal2 = _likelihood_marginals(self.prior, q, q2)
        with pairs:
            pyro.factor("x", _log_likelihood(q, marginal, rows))
            pyro.factor("x2", _log_likelihood(q2, marginal2, rows2))
        return z, z2

    @pyro_method
    def guide(self, x: torch.Tensor, x2: torch.Tensor):
        r"""The approximate posterior of Eq. 14: the recognition models, Q(z|x) Q(z'|x').

        Per pair inside ``pyro.plate("pairs", N)``, or, for a prior that is
        :attr:`~rpm.priors.base.Prior.joint_over_batch`, as whole-batch events
        ``Q(z|x).to_event(1)`` (the same draws, the same log-density summed over the pairs)."""
        q, q2 = self.recognise(x, x2)
        if _joint_over_batch(self.prior):
            z = pyro.sample("z", q.to_event(1))
            z2 = pyro.sample("z2", q2.to_event(1))
        else:
            with pyro.plate("pairs", x.shape[0]):
                z = pyro.sample("z", q)
                z2 = pyro.sample("z2", q2)
        return z, z2

    @pyro_method
    def log_ratio(
        self, z: torch.Tensor, z2: torch.Tensor, q: TorchDistribution, q2: TorchDistribution,
        global_batch: bool = False, block_size: int | None = None,
    ) -> torch.Tensor:
        r"""Total :math:`\sum_i \log P(z_i, z'_i) - \log Q(z_i) - \log Q(z'_i)` over the batch.

        The prior's own :meth:`~rpm.priors.base.Prior.log_ratio` (analytic cancellations) when
        it returns one; otherwise the prior traced with ``"z"``, ``"z2"`` conditioned on the
        given values, minus the marginals of the likelihood factors
        (:meth:`~rpm.priors.base.Prior.likelihood_marginals`; by default each view's own
        minibatch mixture, Eq. 11).

        :param torch.Tensor z: first-view latents, shape (N, D).
        :param torch.Tensor z2: second-view latents, shape (N, D).
        :param q: first-view recognition distributions, batch_shape (N,).
        :param q2: second-view recognition distributions, batch_shape (N,).
        :param bool global_batch: evaluate the marginals (and the prior's normaliser) over the
            batches of every rank, gathered with :func:`~rpm.distributed.all_gather_with_grad`;
            the return value is this rank's share.
        :param block_size: stream the O(N^2) parts in blocks of this size (``None``: by size).
        :return: a scalar.
        """
        if isinstance(self.prior, Prior):
            negatives = all_gather_with_grad(z2) if global_batch else None
            ratio = self.prior.log_ratio(z, z2, q, q2, negatives=negatives,
                                         block_size=block_size)
            if ratio is not None:
                return ratio.sum()
        conditioned = poutine.condition(self.sample_prior, data={"z": z, "z2": z2})
        if _joint_over_batch(self.prior):
            trace = poutine.trace(conditioned).get_trace(q, q2)
        else:
            with pyro.plate("pairs", z.shape[0]):
                trace = poutine.trace(conditioned).get_trace(q, q2)
        trace.compute_log_prob()
        log_prior = sum(
            site["log_prob"].sum() for site in trace.nodes.values() if site["type"] == "sample"
        )
        marginal, marginal2 = _likelihood_marginals(self.prior, q, q2)
        log_marginals = (_marginal_log_prob(marginal, z, global_batch, block_size).sum()
                         + _marginal_log_prob(marginal2, z2, global_batch, block_size).sum())
        return log_prior - log_marginals

    @pyro_method
    def elbo(self, x: torch.Tensor, x2: torch.Tensor, num_particles: int = 1,
             global_batch: bool = False, block_size: int | None = None) -> torch.Tensor:
        r"""The ELBO of Eq. 15 summed over the N pairs, each encoder evaluated once.

        .. math::

            \mathcal{L} = \frac1S \sum_{s=1}^S \sum_i \big[\log P(z^s_i, z'^s_i)
            - \log Q(z^s_i) - \log Q(z'^s_i)\big], \qquad z^s_i \sim Q(z|x_i),\
            z'^s_i \sim Q(z'|x'_i),

        the recognition log-densities of the likelihood (Eq. 10) and of the guide cancelled
        analytically; the samples are drawn as :meth:`guide` draws them (``"z"`` then ``"z2"``),
        so with the same random numbers it equals ``-Trace_ELBO`` on ``(model, guide)``. See
        :meth:`~rpm.models.base.RPMBase.elbo` for the contract.

        :param torch.Tensor x: first views, shape (N, ...).
        :param torch.Tensor x2: second views, shape (N, ...).
        :param int num_particles: S, the number of samples averaged.
        :param bool global_batch: marginals and normaliser over every rank's batch.
        :param block_size: block edge for the O(N^2) kernels; None decides by size.
        :return: a scalar tensor.
        """
        q, q2 = self.recognise(x, x2)
        total = 0.0
        for _ in range(num_particles):
            z = q.rsample()  # (N, D): the guide's site "z"
            z2 = q2.rsample()  # (N, D): the guide's site "z2"
            total = total + self.log_ratio(z, z2, q, q2, global_batch=global_batch,
                                           block_size=block_size)
        return total / num_particles

    @pyro_method
    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """The recognition mean of the first view, shape (N, D): the learned representation."""
        return self.recognition(x).mean


def _check_finite_input(name: str, value: torch.Tensor) -> None:
    """Raises ValueError naming the rows of ``value`` (N, ...) that hold NaN or infinite entries."""
    if not value.is_floating_point() and not value.is_complex():
        return
    if torch.isfinite(value).all():  # one reduction per step; the rows only for the message
        return
    finite = torch.isfinite(value).reshape(value.shape[0], -1).all(-1)  # (N,)
    if not finite.all():
        rows = torch.nonzero(~finite).flatten().tolist()
        shown = ", ".join(str(row) for row in rows[:5]) + (", ..." if len(rows) > 5 else "")
        raise ValueError(
            f"{name} has NaN or infinite entries in {len(rows)} of its {value.shape[0]} rows "
            f"(rows {shown}); clean or drop those pairs before training (this check runs "
            "under pyro.enable_validation)"
        )


def _delta_with_density_message(name: str, prior) -> str:
    return (
        f"{name} is deterministic (DeltaRecognition with noise_scale=0) but the prior "
        f"{type(prior).__name__} is an explicit continuous density: the recognition marginal "
        "Q(z) is then a discrete distribution on the batch points and log P(z) - log Q(z) is "
        "ill-defined (Appendix B of Aitchison & Ganev). Use DeltaRecognition(net, "
        "noise_scale=1e-2) (any eps > 0) or a GaussianRecognition, or an ImplicitPrior"
    )
