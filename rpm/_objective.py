r"""The RPM ELBO, once: functions of the prior, the views' recognition distributions, the latents
and the candidates (``docs/theory.md``, the ELBO; J views).

For N instances with J views each, recognition distributions :math:`Q(z|x_{i,j})`, a guide
:math:`Q(z_{1:J}|x_{1:J})` and the recognition marginals :math:`Q_j` (Eq. 11 of Aitchison &
Ganev), the likelihood of view j is (Eq. 10)

.. math::

    P(x_{i,j}|z_{i,j}) = \frac{Q(z_{i,j}|x_{i,j})\, P_\text{true}(x_{i,j})}{Q_j(z_{i,j})},

:math:`P_\text{true}` constant in every parameter and left out (``likelihood_factor``,
with the marginals of ``likelihood_marginals``), and the ELBO (Eq. 12) is

.. math::

    \mathcal{L} = \sum_i \mathbb{E}_{Q(z_{i,1:J}|x_{i,1:J})}\Big[\log P(z_{i,1:J})
        + \sum_j \big(\log Q(z_{i,j}|x_{i,j}) - \log Q_j(z_{i,j})\big)
        - \log Q(z_{i,1:J}|x_{i,1:J})\Big] + \text{const}.

With the recognition models as the guide (Eq. 14) the recognition log-densities cancel and

.. math::

    \mathcal{L} = \sum_i \mathbb{E}\Big[\log P(z_{i,1:J}) - \sum_j \log Q_j(z_{i,j})\Big]
    \qquad\text{(Eq. 15; J = 2: } \log P(z_i, z'_i) - \log Q(z_i) - \log Q(z'_i)\text{)},

whose terms ``prior_log_ratio`` evaluates: the prior's own analytic part
(:meth:`Prior.log_ratio <rpm.priors._base.Prior.log_ratio>` of a pair prior, e.g. the implicit
prior's :math:`f(z_i, z'_i) - \log \frac1M \sum_m e^{f(z_i, z'_m)}`, Eq. 23-25;
:meth:`SequencePrior.sequence_log_ratio <rpm.priors._base.SequencePrior.sequence_log_ratio>` of a
prior over J views) or, when it has none, the prior's traced log-density minus the marginals
(``marginal_log_prob``).

Every route to the ELBO computes it here: the Pyro model of :class:`~rpm.RPM` declares its
likelihood factors with ``likelihood_marginals`` and ``likelihood_factor`` (so
``Trace_ELBO`` on it evaluates the expression above), :class:`~rpm.RPMELBO` calls ``elbo``
on the model's :class:`ObjectiveInputs`, and :func:`rpm_elbo` (for embeddings in a plain
PyTorch loop, used by :mod:`rpm.losses`) calls ``prior_log_ratio``.

This module reads the priors and marginals only; :mod:`rpm.models` builds on it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import pyro
import torch
from pyro import poutine
from pyro.distributions import Delta, Independent, TorchDistribution
from pyro.poutine.util import site_is_subsample

from rpm._validation import check_bool, check_positive_int
from rpm.marginals import MixtureMarginal
from rpm.marginals._candidates import Candidates
from rpm.marginals._mixture_marginal import delta_mixture_log_prob
from rpm.marginals._moment_matched import GAUSSIAN_TAKES_NO_QUEUE, MomentMatchedMarginal
from rpm.marginals._sequence_marginal import SequenceMixtureMarginal, stack_views
from rpm.ops._gaussian_mixture import gaussian_mixture_log_prob
from rpm.priors._base import (
    Prior,
    SequencePrior,
    declare_prior,
    delta_with_density_message,
    hook,
    is_sequence_prior,
)
from rpm.priors._energy_paths import energy_paired
from rpm.priors._implicit import ImplicitPrior

#: The normalisers of the importance-weighted bound (:func:`elbo`'s ``normaliser``).
NORMALISERS = ("particle", "anchor")

__all__ = [
    "MARGINALS",
    "NORMALISERS",
    "ObjectiveInputs",
    "check_marginal",
    "check_normaliser",
    "elbo",
    "likelihood_factor",
    "likelihood_marginals",
    "marginal_log_prob",
    "prior_log_ratio",
    "refuses_delta",
    "rpm_elbo",
]

#: The estimates of the recognition marginals a model may choose (``RPM(..., marginal=)``,
#: ``rpm_elbo(..., marginal=)``): the minibatch mixture (Eq. 11) or its moment-matched Gaussian
#: (:class:`~rpm.marginals.MomentMatchedMarginal`).
MARGINALS = ("mixture", "gaussian")


@dataclasses.dataclass
class ObjectiveInputs:
    r"""What the RPM ELBO of one batch needs (``elbo``), with each encoder evaluated once.

    ``elbo`` draws the latents from ``guides`` (with ``rsample``, in this order: the order
    in which the model's guide samples its sites) and evaluates ``prior_log_ratio`` on them.
    """

    #: The prior.
    prior: object
    #: The guide's distributions in the guide's order: ``(q, q2)`` (a pair prior) or one
    #: distribution of ``"z"`` with batch_shape (N,) and event_shape (J, D) (a prior over J
    #: views).
    guides: tuple
    #: ``(q, q2)`` (a pair prior) or ``(q, marginal)`` (a prior over J views: q of batch_shape
    #: (N, J)).
    recognitions: tuple
    #: The name of the model's plate over the N instances.
    plate: str
    #: The step's :class:`~rpm.marginals._candidates.Candidates`.
    candidates: Candidates | None
    #: True when the guide is not the recognition models (a structured posterior): the
    #: recognition log-densities then no longer cancel (a prior over J views).
    structured: bool = False
    #: The prior is a prior over J views (``rpm.priors._base.is_sequence_prior``); None:
    #: decided here from the prior.
    sequence: bool | None = None
    #: A pair prior: the marginals :math:`(Q_1, Q_2)` the model divides by when the model
    #: chose them (``marginal="gaussian"``); None: the prior's ``likelihood_marginals``.
    marginals: tuple | None = None


# -- the choice of marginal ---------------------------------------------------------------------

def check_normaliser(normaliser, importance_weighted: bool) -> str:
    """``normaliser`` (one of :data:`NORMALISERS`) checked against ``importance_weighted``:
    ``"anchor"`` averages the normaliser inside the importance-weighted bound only.

    :raises ValueError: for an unknown normaliser, or ``"anchor"`` without
        ``importance_weighted``.
    """
    if normaliser not in NORMALISERS:
        raise ValueError(f"normaliser must be one of {NORMALISERS}, got {normaliser!r}")
    if normaliser == "anchor" and not importance_weighted:
        raise ValueError("normaliser='anchor' averages each anchor's normaliser over its "
                         "particles inside the importance-weighted bound: pass "
                         "importance_weighted=True as well")
    return normaliser


def check_marginal(marginal, prior) -> str:
    r"""``marginal`` (one of :data:`MARGINALS`) checked against ``prior``.

    ``"gaussian"`` replaces the recognition marginals :math:`Q_j` of the ELBO (Eq. 15) by their
    moment-matched Gaussians (:class:`~rpm.marginals.MomentMatchedMarginal`): a choice for a
    prior that is a density of its own, whose :math:`\log P - \sum_j \log Q_j` keeps the
    marginals. A prior defined relative to the recognition marginals (the implicit priors,
    :attr:`~rpm.priors.PriorBase.accepts_delta_recognition`) cancels them analytically against
    the minibatch mixture, so no other estimate can enter: it is refused.

    :raises ValueError: for an unknown string, or ``"gaussian"`` with such a prior.
    """
    if not isinstance(marginal, str) or marginal not in MARGINALS:
        raise ValueError(f"marginal must be one of {MARGINALS} (the minibatch mixture of Eq. 11, "
                         f"or its moment-matched Gaussian), got {marginal!r}")
    if marginal == "gaussian" and hook(prior, "accepts_delta_recognition"):
        raise ValueError(
            f"marginal='gaussian' replaces the marginals of an explicit prior's ELBO, but "
            f"{type(prior).__name__} is defined relative to the minibatch-mixture marginal (its "
            "log Q terms cancel analytically, so no other estimate enters): use "
            "marginal='mixture' with it, or an explicit prior (e.g. GaussianPairPrior)")
    return marginal


def refuses_delta(prior, marginal: str) -> bool:
    """True when a deterministic (Delta) encoder makes the ELBO of ``prior`` under the marginal
    estimate ``marginal`` ill-defined (Appendix B of Aitchison & Ganev): an explicit density
    prior with the minibatch mixture, a discrete distribution on the batch's points. The
    moment-matched Gaussian is a density, so under ``"gaussian"`` Delta encoders are
    accepted."""
    return not hook(prior, "accepts_delta_recognition") and marginal != "gaussian"


# -- the likelihood (Eq. 10) ----------------------------------------------------------------------

def _kinds(value) -> str:
    """The type of ``value``, or of each item of a tuple or list, for an error message."""
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__} of " + ", ".join(type(v).__name__ for v in value)
    return type(value).__name__


def likelihood_marginals(
    prior, q: TorchDistribution, q2: TorchDistribution
) -> tuple[MixtureMarginal, MixtureMarginal]:
    r"""The recognition marginals :math:`(Q_1, Q_2)` that a pair prior's likelihood factors
    divide by (Eq. 10): the prior's :meth:`~rpm.priors._base.Prior.likelihood_marginals`
    (each view's own minibatch mixture :math:`Q_v = \frac1N \sum_n Q(z|x_{n,v})`, Eq. 11, for
    a plain callable), checked.

    :param prior: a pair prior (:class:`~rpm.priors._base.Prior`) or plain callable.
    :param q: first-view recognition distributions, batch_shape (N,), event_shape (D,).
    :param q2: second-view recognition distributions, likewise.
    :raises TypeError: when the hook returns anything but two :class:`~rpm.MixtureMarginal`.
    :raises ValueError: when a marginal's shapes differ from its view's recognition.
    """
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


def likelihood_factor(log_q: torch.Tensor, log_marginal: torch.Tensor) -> torch.Tensor:
    r"""The likelihood factor :math:`\log Q(z|x) - \log Q_v(z)` of Eq. 10 (without
    :math:`\log P_\text{true}(x)`).

    For Delta recognition a latent off the view's atoms has :math:`\log Q(z|x) = -\infty`
    (and :math:`\log Q_v(z)` may be :math:`-\infty` too; its own prior site is
    :math:`-\infty`): the factor is :math:`-\infty` there, not :math:`-\infty - (-\infty)` =
    NaN.

    :param torch.Tensor log_q: :math:`\log Q(z|x)`.
    :param torch.Tensor log_marginal: :math:`\log Q_v(z)`, of the same shape.
    """
    return torch.where(torch.isneginf(log_q), log_q, log_q - log_marginal)


def marginal_log_prob(marginal: MixtureMarginal, z: torch.Tensor, candidates: Candidates | None,
                      block_size: int | None) -> torch.Tensor:
    r""":math:`\log Q_v(z_i) = \log \frac1K \sum_k Q(z_i|x_k)` under the mixture ``marginal``
    (Eq. 11), its K components gathered from every process when the candidates are a global
    batch, streamed in blocks of ``block_size``; shape (N,)."""
    is_global = candidates is not None and candidates.is_global
    if marginal.family == "generic":  # components of another family: their own log_prob
        if candidates is not None and candidates.global_batch:
            family = type(getattr(marginal.q, "base_dist", marginal.q)).__name__
            raise ValueError(
                f"a global batch gathers the parameters of Gaussian or Delta recognition; "
                f"{family} recognition has no such gather: train it without "
                "global_batch (or use rpm.GaussianRecognition / rpm.DeltaRecognition)"
            )
        if block_size is None:
            return marginal.log_prob(z)
    if not is_global and block_size is None:
        return marginal.log_prob(z)
    if marginal.exclude_self:
        raise ValueError(
            "a likelihood marginal with exclude_self cannot be evaluated over a global batch or "
            "in blocks; return a MixtureMarginal without exclude_self from likelihood_marginals"
        )
    loc, scale = marginal.loc, marginal.scale  # (K, D), (K, D) or None; None, None: "generic"
    if loc is None:
        return marginal.log_prob_rows(z, block_size=block_size)
    if candidates is not None and candidates.is_global:
        if scale is None:
            loc = candidates.gather(loc)
        else:  # one collective for both
            loc, scale = candidates.gather(torch.cat([loc, scale], dim=1)).chunk(2, dim=1)
    if scale is None:
        return delta_mixture_log_prob(z, loc)
    return gaussian_mixture_log_prob(z, loc, scale, block_size=block_size)


# -- the terms of Eq. 15 ----------------------------------------------------------------------------

def prior_log_ratio(prior, latents, recognitions, plate: str, candidates: Candidates | None = None,
                    block_size: int | None = None, sequence: bool | None = None,
                    per_instance: bool = False, marginals: tuple | None = None) -> torch.Tensor:
    r"""The batch's total :math:`\sum_i \log P(z_{i,1:J}) - \sum_j \log Q_j(z_{i,j})`, the
    terms of the RPM ELBO (Eq. 15 of Aitchison & Ganev; with J views, ``docs/theory.md``) that
    do not cancel against the recognition guide; with ``per_instance`` the N terms themselves,
    :math:`\log P(z_{i,1:J}) - \sum_j \log Q_j(z_{i,j})` for each instance i.

    The prior's own analytic term when it returns one (a pair prior's
    :meth:`~rpm.priors._base.Prior.log_ratio_sum`, or with ``per_instance`` its
    :meth:`~rpm.priors._base.Prior.log_ratio`; a prior over J views'
    :meth:`~rpm.priors._base.SequencePrior.sequence_log_ratio`); otherwise the prior run with its
    sites conditioned on the latents (inside ``pyro.plate(plate, N)`` unless it is
    :attr:`~rpm.priors._base.PriorBase.joint_over_batch`), its log-density summed, minus the
    marginals (a pair prior: ``likelihood_marginals`` through ``marginal_log_prob``; a
    prior over J views: the model's marginal).

    :param prior: a pair prior (:class:`~rpm.priors._base.Prior` or a plain callable) or a prior
        over J views (:class:`~rpm.priors._base.SequencePrior`).
    :param latents: a pair prior's ``(z, z2)``, each (N, D); a prior over J views' z,
        (N, J, D).
    :param recognitions: a pair prior's ``(q, q2)``, each batch_shape (N,); a prior over J
        views' ``(q, marginal)``, q of batch_shape (N, J), marginal the model's
        :class:`~rpm.marginals.SequenceMixtureMarginal`.
    :param str plate: the name of the model's plate over the N instances.
    :param candidates: the step's :class:`~rpm.marginals._candidates.Candidates`; None: the
        batch.
    :param block_size: stream the O(N^2) parts in blocks of this size (``None``: by size).
    :param sequence: whether the prior is a prior over J views
        (``rpm.priors._base.is_sequence_prior``; None: decided here).
    :param bool per_instance: return the terms of each instance, shape (N,), not their sum;
        a prior without an analytic log-ratio whose log-density does not split over the
        instances (:attr:`~rpm.priors._base.PriorBase.joint_over_batch`) has no such terms
        (ValueError).
    :param marginals: a pair prior: the marginals :math:`(Q_1, Q_2)` to subtract (distributions
        of batch_shape (N,), e.g. :class:`~rpm.marginals.MomentMatchedMarginal`); None: the
        prior's ``likelihood_marginals``, the minibatch mixtures.
    :return: a scalar, or shape (N,) with ``per_instance``.
    """
    if sequence is None:
        sequence = is_sequence_prior(prior)
    if sequence:
        z, (q, marginal) = latents, recognitions
        if not isinstance(prior, SequencePrior):
            raise TypeError(f"latents of J views need a prior over J views "
                            f"(rpm.priors.SequencePrior); got {type(prior).__name__}")
        ratio = prior.sequence_log_ratio(z, q, marginal, candidates, block_size)
        if ratio is not None:
            return ratio if per_instance else ratio.sum()
        sites: tuple[str, ...] = ("z",)
        data, args, num = {"z": z}, (q, marginal), z.shape[0]
    else:
        (z, z2), (q, q2) = latents, recognitions
        if isinstance(prior, Prior):
            if per_instance:
                ratio = prior.log_ratio(z, z2, q, q2, candidates, block_size)
            else:
                ratio = prior.log_ratio_sum(z, z2, q, q2, candidates, block_size)
            if ratio is not None:
                return ratio
        data, args, sites, num = {"z": z, "z2": z2}, (q, q2), ("z", "z2"), z.shape[0]
    joint_over_batch = hook(prior, "joint_over_batch")
    if per_instance and joint_over_batch:
        raise ValueError(f"{type(prior).__name__} has no analytic log-ratio and its log-density "
                         "is one event over the batch: it has no per-instance terms; take the "
                         "batch's sum (per_instance=False)")
    # The traced prior (a trace context, not poutine.trace(fn), which would append Pyro's
    # shape table to the one-line errors of declare_prior's checks).
    with poutine.trace() as tracer, poutine.condition(data=data):
        if joint_over_batch:
            declare_prior(prior, *args, sites=sites)
        else:
            with pyro.plate(plate, num):
                declare_prior(prior, *args, sites=sites)
    trace = tracer.trace
    trace.compute_log_prob()
    reduce = (lambda terms: _instance_terms(prior, terms, num)) if per_instance else torch.sum
    log_prior = sum(
        reduce(site["log_prob"]) for site in trace.nodes.values()
        if site["type"] == "sample" and not site_is_subsample(site)  # not the plate's own node
    )
    if sequence:  # the model's marginal already runs over the candidates (a global batch)
        return log_prior - reduce(marginal.log_prob(z))
    if marginals is not None:  # the model's own estimate (marginal="gaussian")
        return log_prior - reduce(marginals[0].log_prob(z)) - reduce(marginals[1].log_prob(z2))
    marginal, marginal2 = likelihood_marginals(prior, q, q2)
    log_marginals = (reduce(marginal_log_prob(marginal, z, candidates, block_size))
                     + reduce(marginal_log_prob(marginal2, z2, candidates, block_size)))
    return log_prior - log_marginals


def _instance_terms(prior, terms: torch.Tensor, num: int) -> torch.Tensor:
    """``terms`` of shape (N,), the per-instance log-densities of a site inside the plate."""
    if terms.shape != (num,):
        raise ValueError(f"{type(prior).__name__} declares a site whose log-density has shape "
                         f"{tuple(terms.shape)}, not one term per instance ({num},): it has no "
                         "per-instance terms; take the batch's sum (per_instance=False)")
    return terms


# -- the ELBO ----------------------------------------------------------------------------------------

def elbo(inputs: ObjectiveInputs, num_particles: int = 1, block_size: int | None = None,
         importance_weighted: bool = False, normaliser: str = "particle") -> torch.Tensor:
    r"""The ELBO summed over the batch, from ``num_particles`` reparameterised samples.

    With :math:`r^s_i = \log P(z^s_{i,1:J}) - \sum_j \log Q_j(z^s_{i,j})
    + \sum_j \log Q(z^s_{i,j}|x_{i,j}) - \log Q(z^s_{i,1:J}|x_{i,1:J})` the log weight of
    instance i in particle s (the last two terms cancelling for the recognition guide, Eq.
    14-15, and kept for a structured one), the particles are averaged outside the logarithm,

    .. math::

        \mathcal{L} = \frac1S \sum_{s=1}^S \sum_i r^s_i,

    or, with ``importance_weighted``, inside it, per instance,

    .. math::

        \mathcal{L}_\text{IW} = \sum_i \log \frac1S \sum_{s=1}^S e^{r^s_i}

    (the importance-weighted bound of Burda et al. (2016) of each instance,
    ``docs/theory.md#calibrated-posteriors``, C3). Both are the ELBO for S = 1. Each particle is
    a draw of the whole batch: the implicit prior's normaliser of particle s runs over that
    particle's candidates :math:`z'^s_j`. With ``normaliser="anchor"`` (the implicit prior
    only) the anchor's normaliser is averaged over its S particles before the logarithm, apart
    from its positives,

    .. math::

        \mathcal{L}_\text{anchor} = \sum_i \Big[\log \frac1S \sum_{s=1}^S
        e^{f(z^s_i, z'^s_i)} - \log \frac{1}{S M} \sum_{s=1}^S \sum_{j=1}^M
        e^{f(z^s_i, z'^s_j)}\Big]

    (MC-InfoNCE as Kirchhof et al. (2023) estimate it; the importance-weighted bound of the
    model whose pair prior is normalised over the anchor's posterior, C6). The samples are
    drawn from ``inputs.guides`` in order, as the model's guide draws them, so with the same
    random numbers :math:`\mathcal{L}` equals ``-Trace_ELBO`` on the model.

    :param ObjectiveInputs inputs: a batch's inputs
        (:meth:`rpm.RPM.objective_inputs <rpm.models._rpm.RPM.objective_inputs>`).
    :param int num_particles: S.
    :param block_size: block edge for the O(N^2) kernels; None decides by size.
    :param bool importance_weighted: average the particles' weights inside the logarithm.
    :param str normaliser: with ``importance_weighted``, ``"particle"`` (each particle's weight
        with its own normaliser) or ``"anchor"`` (:math:`\mathcal{L}_\text{anchor}`).
    :return: a scalar tensor.
    """
    if num_particles != 1:
        check_positive_int("num_particles", num_particles)
    check_normaliser(normaliser, importance_weighted)
    if importance_weighted and num_particles > 1 and normaliser == "anchor":
        return _anchor_normalised_bound(inputs, num_particles, block_size)
    if importance_weighted and num_particles > 1:
        weights = torch.stack([_log_weights(inputs, block_size, per_instance=True)
                               for _ in range(num_particles)])              # (S, N)
        return (torch.logsumexp(weights, dim=0) - math.log(num_particles)).sum()
    total: torch.Tensor | None = None
    for _ in range(num_particles):
        value = _log_weights(inputs, block_size, per_instance=False)
        total = value if total is None else total + value
    assert total is not None  # num_particles >= 1
    return total if num_particles == 1 else total / num_particles


def _anchor_normalised_bound(inputs: ObjectiveInputs, num_particles: int,
                             block_size: int | None) -> torch.Tensor:
    r""":math:`\mathcal{L}_\text{anchor}` of :func:`elbo` from ``num_particles`` draws of the
    batch. Under the implicit prior the log weight of pair i in particle s is
    :math:`r^s_i = f(z^s_i, z'^s_i) - \log \hat Z^s_i` with
    :math:`\hat Z^s_i = \frac1M \sum_j e^{f(z^s_i, z'^s_j)}`
    (:meth:`~rpm.priors.ImplicitPrior.log_ratio`), so the positives' and the normalisers'
    log-means over the particles are taken apart."""
    prior = inputs.prior
    if (not isinstance(prior, ImplicitPrior) or type(prior).log_ratio is not ImplicitPrior.log_ratio
            or len(inputs.guides) != 2):
        raise TypeError(
            "RPMELBO(normaliser='anchor') averages the normaliser of the implicit prior's "
            "InfoNCE over each anchor's particles: it needs rpm.priors.ImplicitPrior (or a "
            f"subclass that keeps its log_ratio) over pairs; got {type(prior).__name__}. Use "
            "normaliser='particle' for other priors")
    positives, log_normalisers = [], []
    for _ in range(num_particles):
        z, z2 = (_rsample(guide) for guide in inputs.guides)
        ratio = prior.log_ratio(z, z2, None, None, inputs.candidates, block_size)
        positive = energy_paired(prior.energy, z, z2, block_size)
        positives.append(positive)
        log_normalisers.append(positive - ratio)  # log (1/M) sum_j exp f(z_i, z'_j)
    return (torch.logsumexp(torch.stack(positives), 0)
            - torch.logsumexp(torch.stack(log_normalisers), 0)).sum()


def _log_weights(inputs: ObjectiveInputs, block_size: int | None,
                 per_instance: bool) -> torch.Tensor:
    r"""One particle: latents drawn from the guides, and the log weights :math:`r_i` of
    :func:`elbo`, summed over the batch, or shape (N,) with ``per_instance``."""
    sequence = (inputs.sequence if inputs.sequence is not None
                else is_sequence_prior(inputs.prior))
    reduce = _identity if per_instance else torch.sum
    latents = tuple(_rsample(guide) for guide in inputs.guides)
    if not sequence:  # (z, z2), each (N, D): the guide's sites "z" then "z2"
        return prior_log_ratio(inputs.prior, latents, inputs.recognitions, inputs.plate,
                               inputs.candidates, block_size, sequence=False,
                               per_instance=per_instance, marginals=inputs.marginals)
    (z,) = latents  # (N, J, D): the guide's site "z"
    q, marginal = inputs.recognitions
    terms = None
    if inputs.structured:
        if not isinstance(inputs.prior, SequencePrior):
            raise TypeError(f"a structured guide is the posterior of a prior over J views "
                            f"(rpm.priors.SequencePrior); got {type(inputs.prior).__name__}")
        terms = inputs.prior.posterior_log_ratio(z, q, inputs.guides[0])
    if terms is not None:  # log P + sum log Q(z|x) - log guide, in closed form
        return reduce(terms) - reduce(marginal.log_prob(z))
    value = prior_log_ratio(inputs.prior, z, inputs.recognitions, inputs.plate,
                            inputs.candidates, block_size, sequence=True,
                            per_instance=per_instance)
    if inputs.structured:
        value = value + reduce(q.log_prob(z).sum(-1) - inputs.guides[0].log_prob(z))
    return value


def _identity(terms: torch.Tensor) -> torch.Tensor:
    return terms


def _rsample(guide: TorchDistribution) -> torch.Tensor:
    """``guide.rsample()``; for a ``Delta`` (deterministic encoders) its point itself, which is
    what ``Delta.rsample()`` returns as a view (``v.expand(v.shape)``) at the cost of an
    autograd node."""
    base = guide.base_dist if type(guide) is Independent else guide
    return base.v if type(base) is Delta else guide.rsample()


def _delta(latent: torch.Tensor) -> TorchDistribution:
    return Delta(latent, event_dim=1)


def rpm_elbo(
    prior, latents: Sequence[torch.Tensor] | torch.Tensor,
    recognitions: Sequence[TorchDistribution] | TorchDistribution | None = None,
    candidates: Candidates | None = None, block_size: int | None = None,
    pooled_marginal: bool = False, per_instance: bool = False, marginal: str = "mixture",
) -> torch.Tensor:
    r"""The RPM ELBO of a batch of latents, for plain PyTorch loops on embeddings.

    .. code-block:: python

        prior = rpm.priors.ImplicitPrior(rpm.priors.CosineEnergy(kappa=1 / 0.1))
        z1, z2 = encoder(x1), encoder(x2)                    # (N, D) each
        loss = -rpm.inference.rpm_elbo(prior, [z1, z2]) / len(z1)   # InfoNCE - log N
        loss.backward()

    Returns :math:`\sum_i [\log P(z_{i,1:J}) - \sum_j \log Q_j(z_{i,j})]` (Eq. 15 with the
    recognition models as the guide, ``prior_log_ratio``), the number :class:`~rpm.RPMELBO`
    returns (negated) for an :class:`~rpm.RPM` whose encoders produced these latents: with
    Delta recognition (the default here: the latents are the embeddings themselves) and the
    implicit prior, :math:`\mathcal{L}/N = -\text{InfoNCE} + \log N`.

    :param prior: a pair prior (:class:`~rpm.priors._base.Prior` or a plain callable,
        ``latents = [z, z2]``) or a prior over J views (:class:`~rpm.priors._base.SequencePrior`,
        ``latents`` a list of J tensors (N, D) or one tensor (N, J, D)); its parameters (e.g.
        a learned temperature) train with the encoder's.
    :param latents: the latents (samples of the recognition distributions), each (N, D).
    :param recognitions: the recognition distributions the latents were drawn from: for a
        pair prior ``[q, q2]`` (batch_shape (N,)), for a prior over J views a list of J or one
        distribution of batch_shape (N, J); default ``Delta`` at the latents (deterministic
        encoders).
    :param candidates: a :class:`~rpm.marginals._candidates.Candidates` (a global batch, a
        queue); default the batch.
    :param block_size: block edge for the O(N^2) kernels; None decides by size.
    :param bool pooled_marginal: a prior over J views: pool the marginals over the views.
    :param bool per_instance: return the N instances' terms
        :math:`\log P(z_{i,1:J}) - \sum_j \log Q_j(z_{i,j})`, shape (N,), instead of their sum
        (``prior_log_ratio``): per-example losses, e.g. ``reduction="none"``.
    :param str marginal: the estimate of the :math:`Q_j`, ``"mixture"`` (the minibatch mixture,
        Eq. 11) or ``"gaussian"`` (its moment-matched Gaussian,
        :class:`~rpm.marginals.MomentMatchedMarginal`: an explicit prior's ELBO is then defined
        for the default Delta recognition; its moments run over the batch, or a global batch of
        ``candidates``, which may hold no queue or explicit negatives).
    :return: a scalar tensor, the ELBO summed over the N instances, or shape (N,).
    """
    check_bool("pooled_marginal", pooled_marginal)
    check_bool("per_instance", per_instance)
    check_marginal(marginal, prior)
    gaussian = marginal == "gaussian"
    if gaussian and candidates is not None and candidates.appended() is not None:
        raise ValueError(GAUSSIAN_TAKES_NO_QUEUE)
    if recognitions is None and refuses_delta(prior, marginal):
        raise ValueError(delta_with_density_message("the default Delta recognition", prior)
                         + "; pass the recognition distributions the latents were drawn from")
    if is_sequence_prior(prior):
        z = latents if isinstance(latents, torch.Tensor) else torch.stack(list(latents), dim=1)
        if z.dim() != 3 or z.shape[1] < 2:
            raise ValueError(f"a prior over J views takes latents (N, J, D) with J >= 2, or a "
                             f"list of J tensors (N, D); got {tuple(z.shape)}")
        if recognitions is None:
            q = _delta(z)
        elif isinstance(recognitions, TorchDistribution):
            q = recognitions
        else:
            q = stack_views(list(recognitions))
        marginals = (MomentMatchedMarginal(q, pooled=pooled_marginal, candidates=candidates)
                     if gaussian else
                     SequenceMixtureMarginal(q, pooled=pooled_marginal, block_size=block_size,
                                             candidates=candidates))
        return prior_log_ratio(prior, z, (q, marginals), "instances", candidates, block_size,
                               sequence=True, per_instance=per_instance)
    if isinstance(latents, torch.Tensor) or len(latents) != 2:
        got = f"a tensor {tuple(latents.shape)}" if isinstance(latents, torch.Tensor) else len(latents)
        raise ValueError(f"{type(prior).__name__} is a pair prior: pass latents [z, z2], "
                         f"two tensors (N, D); got {got}")
    z, z2 = latents
    q, q2 = (_delta(z), _delta(z2)) if recognitions is None else recognitions
    pair_marginals = ((MomentMatchedMarginal(q, candidates=candidates),
                       MomentMatchedMarginal(q2, candidates=candidates)) if gaussian else None)
    return prior_log_ratio(prior, (z, z2), (q, q2), "pairs", candidates, block_size,
                           sequence=False, per_instance=per_instance, marginals=pair_marginals)
