r"""The recognition parameterised model over T views: a prior over the whole sequence of latents.

The pair (x, x') is the case T = 2 of a sequence of views :math:`x_{1:T}` (T frames of a video
window, T augmentations of one image; ``docs/theory.md``, sequences). With one latent per view,
the generative model is (Eq. 9-10 of Aitchison & Ganev, per view)

.. math::

    P(x_{1:T}, z_{1:T}) = P(z_{1:T}) \prod_t P(x_t|z_t), \qquad
    P(x_t|z_t) = \frac{Q(z_t|x_t)\, P_\text{true}(x_t)}{Q_t(z_t)},

and for any guide :math:`Q(z_{1:T}|x_{1:T})` the ELBO (Eq. 12) is

.. math::

    \mathcal{L}(x_{1:T}) = \mathbb{E}_{Q(z_{1:T}|x_{1:T})}\Big[\log P(z_{1:T})
        + \sum_t \big(\log Q(z_t|x_t) - \log Q_t(z_t)\big) - \log Q(z_{1:T}|x_{1:T})\Big]
        + \text{const}.

With the recognition models as the guide, :math:`\prod_t Q(z_t|x_t)`, the recognition terms
cancel (Eq. 14-15): :math:`\mathcal{L} = \mathbb{E}[\log P(z_{1:T}) - \sum_t \log Q_t(z_t)]`.

The Pyro model has one plate over the N sequences; the prior declares the site ``"z"`` with
event_shape (T, D); the likelihood is the factor ``"x"``,
:math:`\sum_t [\log Q(z_t|x_t) - \log Q_t(z_t)]`; the guide samples ``"z"``.
"""

from __future__ import annotations

import pyro
import torch
from pyro import poutine
from pyro.distributions import Delta, Normal, TorchDistribution
from pyro.infer.util import is_validation_enabled
from pyro.nn import PyroModuleList, pyro_method

from rpm._validation import check_bool, check_positive_int
from rpm.marginals.mixture_marginal import recognition_components
from rpm.marginals.sequence_marginal import SequenceMixtureMarginal
from rpm.models.base import RPMBase
from rpm.models.recognition import DeltaRecognition
from rpm.priors.sequence import SequencePrior

__all__ = ["SequenceRPM"]

_GUIDES = ("recognition", "structured")


class SequenceRPM(RPMBase):
    r"""A recognition parameterised model of N sequences of T views with a prior over
    :math:`z_{1:T}`.

    .. code-block:: python

        model = SequenceRPM(GaussianRecognition(net), StateSpacePrior(dim=6), guide="structured")
        svi = pyro.infer.SVI(model.model, model.guide, pyro.optim.Adam({"lr": 1e-3}), RPMELBO())
        svi.step(x)   # x: (N, T, ...), N sequences of T views

    ``model(x)`` declares, inside ``pyro.plate("sequences", N)``, the prior's site ``"z"``
    (event_shape (T, D)) and the likelihood factor ``"x"``,
    :math:`\sum_t [\log Q(z_t|x_t) - \log Q_t(z_t)]` (Eq. 10 per view). ``guide(x)`` samples
    ``"z"`` from the recognition distributions made independent over t (event_shape (T, D)), or,
    with ``guide="structured"``, from the prior's own structured posterior
    (:meth:`~rpm.priors.sequence.SequencePrior.posterior`, e.g. the Kalman smoother of the
    state-space prior given the recognition factors).

    Its ``name`` prefixes its parameters in Pyro's param store (:class:`~rpm.models.base.RPMBase`),
    and :class:`~rpm.RPMELBO` evaluates it through :meth:`elbo`, each encoder once per frame.

    **Marginals.** By default :math:`Q_t` is the mixture over the t-th views of the batch (N
    components per view): it is the direct generalisation of the pair model (with T = 2 the
    model *is* the pair RPM, for every prior) and it stays correct when the views are not
    exchangeable (one encoder per view, augmentations of different kinds, a non-stationary
    sequence). ``pooled_marginal=True`` uses the mixture over all N T frames for every view
    instead: when the views are exchangeable (a stationary video through one shared encoder)
    it estimates the same Q with T times as many components, a lower-variance estimate.

    :param recognition: :math:`Q(z_t|x_t)`, a :class:`~rpm.GaussianRecognition` or
        :class:`~rpm.DeltaRecognition` shared over the views (called once on all N T frames),
        or a list of T of them, one per view.
    :param SequencePrior prior: the prior :math:`P(z_{1:T})`, e.g.
        :class:`~rpm.priors.StateSpacePrior` or :class:`~rpm.priors.MarkovImplicitPrior`.
    :param bool pooled_marginal: pool the marginals over all frames (see above).
    :param str guide: ``"recognition"`` (Eq. 14) or ``"structured"`` (the prior's posterior).
    :param name: the prefix of the model's parameters in Pyro's param store; by default
        ``"rpm"``, ``"rpm_1"``, ... (unique in the process, :class:`~rpm.models.base.RPMBase`).
    :raises ValueError: for Delta recognition with a prior that is an explicit density
        (Appendix B of Aitchison & Ganev), or a structured guide the prior does not have.
    """

    def __init__(self, recognition, prior: SequencePrior, pooled_marginal: bool = False,
                 guide: str = "recognition", name: str | None = None):
        super().__init__(name)
        per_view = isinstance(recognition, (list, tuple, torch.nn.ModuleList))
        modules = list(recognition) if per_view else [recognition]
        if per_view and len(modules) < 2:
            raise ValueError("a list of recognition models needs one per view (T >= 2), "
                             f"got {len(modules)}; pass a single module to share it")
        for module in modules:
            if not callable(module):
                raise TypeError(f"recognition must be callable (x -> distribution), got {module!r}")
        if not isinstance(prior, SequencePrior):
            raise TypeError(
                "prior must be a sequence prior (rpm.priors.SequencePrior, e.g. StateSpacePrior, "
                f"MarkovImplicitPrior or MarkovPrior(pair_prior)), got {type(prior).__name__}")
        self.adopt(recognition=PyroModuleList(modules) if per_view else recognition,
                   prior=prior)
        self.per_view = per_view
        check_bool("pooled_marginal", pooled_marginal)
        if guide not in _GUIDES:
            raise ValueError(f"guide must be one of {_GUIDES}, got {guide!r}")
        self.pooled_marginal = pooled_marginal
        self.guide_kind = guide
        if not prior.accepts_delta_recognition:
            for module in modules:
                if isinstance(module, DeltaRecognition) and module.is_deterministic:
                    raise ValueError(_delta_message(prior))
        if guide == "structured" and type(prior).posterior is SequencePrior.posterior:
            raise ValueError(
                f"guide='structured' needs a prior with a structured posterior; "
                f"{type(prior).__name__} has none (use guide='recognition', or StateSpacePrior)")

    def recognise(self, x: torch.Tensor) -> TorchDistribution:
        """Validates a batch of sequences x (N, T, ...) and returns the recognition
        distributions with batch_shape (N, T) and event_shape (D,), each encoder evaluated once
        per frame."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() < 2:
            raise ValueError(f"x must have shape (N, T, ...) (N sequences of T views), got "
                             f"{tuple(x.shape)}")
        num_sequences, num_views = x.shape[:2]
        if num_sequences < 2:
            raise ValueError(f"a batch of {num_sequences} sequence has nothing to contrast: the "
                             "marginals are mixtures over the batch, so use at least 2 sequences")
        if num_views < 2:
            raise ValueError(f"a sequence model needs T >= 2 views per sequence, got T = {num_views}")
        if self.per_view and num_views != len(self.recognition):
            raise ValueError(f"the model has {len(self.recognition)} per-view recognition models "
                             f"but x has T = {num_views} views")
        if is_validation_enabled() and x.is_floating_point() and not torch.isfinite(x).all():
            raise ValueError("x has NaN or infinite entries; clean or drop those sequences")
        if self.per_view:
            parts = [_components(module(x[:, t]), num_sequences)
                     for t, module in enumerate(self.recognition)]
            loc = torch.stack([p[0] for p in parts], dim=1)  # (N, T, D)
            scales = [p[1] for p in parts]
            if any(s is None for s in scales) and not all(s is None for s in scales):
                raise ValueError("the per-view recognition models must all be Delta or all "
                                 "Gaussian")
            scale = None if scales[0] is None else torch.stack(scales, dim=1)
        else:
            flat = x.reshape(num_sequences * num_views, *x.shape[2:])
            dist = self.recognition(flat)
            loc, scale = _components(dist, num_sequences * num_views)
            loc = loc.reshape(num_sequences, num_views, -1)  # (N, T, D)
            scale = None if scale is None else scale.reshape(loc.shape)
        if scale is None:
            if not self.prior.accepts_delta_recognition:
                raise ValueError(_delta_message(self.prior))
            q = Delta(loc, event_dim=1)
        else:
            q = Normal(loc, scale).to_event(1)
        if self.prior.dim is not None and self.prior.dim != loc.shape[-1]:
            raise ValueError(
                f"the prior was built for latent dimension {self.prior.dim} but the encoder "
                f"outputs dimension {loc.shape[-1]}; make them agree")
        return q

    def marginal(self, q: TorchDistribution, block_size: int | None = None
                 ) -> SequenceMixtureMarginal:
        r"""The recognition marginals :math:`\prod_t Q_t` of the batch (per view or pooled)."""
        return SequenceMixtureMarginal(q, pooled=self.pooled_marginal, block_size=block_size)

    def guide_distribution(self, q: TorchDistribution) -> TorchDistribution:
        """The guide's distribution of ``"z"``: batch_shape (N,), event_shape (T, D)."""
        if self.guide_kind == "structured":
            return self.prior.posterior(q)
        return q.to_event(1)

    @pyro_method
    def model(self, x: torch.Tensor) -> torch.Tensor:
        r"""Prior site ``"z"`` (event (T, D)); likelihood factor ``"x"`` (Eq. 10 per view)."""
        q = self.recognise(x)
        marginal = self.marginal(q)
        with pyro.plate("sequences", x.shape[0]):
            z = self.prior(q, marginal)
            pyro.factor("x", q.log_prob(z).sum(-1) - marginal.log_prob(z))
        return z

    @pyro_method
    def guide(self, x: torch.Tensor) -> torch.Tensor:
        """Samples ``"z"`` (N, T, D) from the recognition models or the structured posterior."""
        q = self.recognise(x)
        with pyro.plate("sequences", x.shape[0]):
            return pyro.sample("z", self.guide_distribution(q))

    @pyro_method
    def log_prior_ratio(self, z: torch.Tensor, q: TorchDistribution,
                        marginal: SequenceMixtureMarginal) -> torch.Tensor:
        r"""Per-sequence :math:`\log P(z_{1:T}) - \sum_t \log Q_t(z_t)`, shape (N,): the
        prior's :meth:`~rpm.priors.sequence.SequencePrior.log_ratio` when it has one, else the
        log-density of a trace of the prior with ``"z"`` conditioned on z minus the marginals."""
        ratio = self.prior.log_ratio(z, q, marginal)
        if ratio is not None:
            return ratio
        conditioned = poutine.condition(self.prior, data={"z": z})
        with pyro.plate("sequences", z.shape[0]):
            trace = poutine.trace(conditioned).get_trace(q, marginal)
        log_prior = 0.0
        for site in trace.nodes.values():
            if site["type"] == "sample":
                log_prior = log_prior + site["fn"].log_prob(site["value"])
        return log_prior - marginal.log_prob(z)

    @pyro_method
    def elbo(self, x: torch.Tensor, num_particles: int = 1, global_batch: bool = False,
             block_size: int | None = None) -> torch.Tensor:
        r"""The ELBO summed over the sequences, averaged over ``num_particles`` reparameterised
        samples (a differentiable scalar), each encoder evaluated once per frame:

        .. math::

            \sum_n \Big[\log P(z_n) - \sum_t \log Q_t(z_{n,t})
                + \sum_t \log Q(z_{n,t}|x_{n,t}) - \log Q(z_n|x_n)\Big],
            \qquad z_n \sim Q(z_{1:T}|x_n),

        where the last two terms cancel analytically for the recognition guide (Eq. 14-15).
        It draws the same random numbers as ``Trace_ELBO`` on ``(model, guide)`` and agrees
        with it to floating-point accuracy.

        :param torch.Tensor x: N sequences of T views, shape (N, T, ...).
        :param int num_particles: number of samples averaged.
        :param bool global_batch: not available for sequences (raises when True).
        :param block_size: evaluate the Gaussian mixture marginals in blocks of this many rows
            (:mod:`rpm.ops`); None decides by size.
        """
        if global_batch:
            raise NotImplementedError(
                "SequenceRPM evaluates its marginals over the local batch only; "
                "global_batch=True is available for the pair rpm.RPM")
        check_positive_int("num_particles", num_particles)
        q = self.recognise(x)
        marginal = self.marginal(q, block_size=block_size)
        guide = self.guide_distribution(q)
        total = 0.0
        for _ in range(num_particles):
            z = guide.rsample()  # (N, T, D): the guide's site "z"
            value = self.log_prior_ratio(z, q, marginal)
            if self.guide_kind == "structured":
                value = value + q.log_prob(z).sum(-1) - guide.log_prob(z)
            total = total + value.sum()
        return total / num_particles

    @pyro_method
    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """The recognition means of every view, shape (N, T, D)."""
        return self.recognise(x).mean


def _components(dist: TorchDistribution, batch_size: int):
    loc, scale = recognition_components(dist)
    if loc.shape[0] != batch_size:
        raise ValueError(f"the recognition model returned {loc.shape[0]} rows for {batch_size} "
                         "frames; it must return batch_shape (N,) for N frames")
    return loc, scale


def _delta_message(prior) -> str:
    return (
        f"the recognition model is deterministic (DeltaRecognition with noise_scale=0) but the "
        f"prior {type(prior).__name__} is an explicit continuous density: the marginals Q_t "
        "are then discrete and log P(z) - log Q_t(z_t) is ill-defined (Appendix B of Aitchison "
        "& Ganev). Use DeltaRecognition(net, noise_scale=1e-2) or GaussianRecognition, or an "
        "implicit prior (MarkovImplicitPrior)"
    )
