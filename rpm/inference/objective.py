r"""The RPM ELBO as functions of the prior, the views' recognition distributions, the latents and
the candidates (``docs/theory.md``, the ELBO; J views).

For N instances with J views each, recognition distributions :math:`Q(z|x_{i,j})`, a guide
:math:`Q(z_{1:J}|x_{1:J})` and the recognition marginals :math:`Q_j` (Eq. 11 of Aitchison &
Ganev), the ELBO (Eq. 12, with the likelihood of Eq. 10) is

.. math::

    \mathcal{L} = \sum_i \mathbb{E}_{Q(z_{i,1:J}|x_{i,1:J})}\Big[\log P(z_{i,1:J})
        + \sum_j \big(\log Q(z_{i,j}|x_{i,j}) - \log Q_j(z_{i,j})\big)
        - \log Q(z_{i,1:J}|x_{i,1:J})\Big] + \text{const}.

With the recognition models as the guide (Eq. 14) the recognition log-densities cancel and

.. math::

    \mathcal{L} = \sum_i \mathbb{E}\Big[\log P(z_{i,1:J}) - \sum_j \log Q_j(z_{i,j})\Big]
    \qquad\text{(Eq. 15; J = 2: } \log P(z_i, z'_i) - \log Q(z_i) - \log Q(z'_i)\text{)},

whose terms :func:`~rpm.priors.base.prior_log_ratio` evaluates (the prior's analytic
log-ratio, e.g. InfoNCE's :math:`f(z_i, z'_i) - \log \frac1M \sum_m e^{f(z_i, z'_m)}` for the
implicit prior, Eq. 23-25, or the traced prior minus the mixture marginals). The Pyro model of
:class:`~rpm.RPM` declares the same terms as sample sites and likelihood factors through the
same functions of :mod:`rpm.priors.base` (:func:`~rpm.priors.base.declare_prior`,
:func:`~rpm.priors.base.likelihood_factor`), so ``Trace_ELBO`` on it and :func:`elbo` agree.

:func:`elbo` is what :class:`~rpm.RPMELBO` computes for a model; :func:`rpm_elbo` is the same
number for embeddings computed in a plain PyTorch loop.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from pyro.distributions import Delta, Independent, TorchDistribution

from rpm._validation import check_bool, check_positive_int
from rpm.marginals.candidates import Candidates
from rpm.marginals.sequence_marginal import SequenceMixtureMarginal
from rpm.models.base import ObjectiveInputs
from rpm.models.views import stack_views
from rpm.priors.base import Prior, delta_with_density_message, hook, prior_log_ratio

__all__ = ["elbo", "rpm_elbo"]


def elbo(inputs: ObjectiveInputs, num_particles: int = 1,
         block_size: int | None = None) -> torch.Tensor:
    r"""The ELBO summed over the batch, averaged over ``num_particles`` reparameterised samples.

    .. math::

        \mathcal{L} = \frac1S \sum_{s=1}^S \sum_i \Big[\log P(z^s_{i,1:J})
            - \sum_j \log Q_j(z^s_{i,j})
            + \sum_j \log Q(z^s_{i,j}|x_{i,j}) - \log Q(z^s_{i,1:J}|x_{i,1:J})\Big],

    the last two terms cancelling for the recognition guide (Eq. 14-15) and kept for a
    structured one. The samples are drawn from ``inputs.guides`` in order, as the model's guide
    draws them, so with the same random numbers this equals ``-Trace_ELBO`` on the model.

    :param inputs: a batch's :class:`~rpm.models.base.ObjectiveInputs`
        (:meth:`rpm.RPM.objective_inputs <rpm.models.rpm.RPM.objective_inputs>`).
    :param int num_particles: S.
    :param block_size: block edge for the O(N^2) kernels; None decides by size.
    :return: a scalar tensor.
    """
    check_positive_int("num_particles", num_particles)
    joint = hook(inputs.prior, "joint_views")
    total = 0.0
    for _ in range(num_particles):
        latents = tuple(_rsample(guide) for guide in inputs.guides)
        if joint:
            (z,) = latents  # (N, J, D): the guide's site "z"
            q, marginal = inputs.recognitions
            terms = None
            if inputs.structured and isinstance(inputs.prior, Prior):
                terms = inputs.prior.posterior_log_ratio(z, q, inputs.guides[0])
            if terms is not None:  # log P + sum log Q(z|x) - log guide, in closed form
                value = terms.sum() - marginal.log_prob(z).sum()
            else:
                value = prior_log_ratio(inputs.prior, z, inputs.recognitions, inputs.plate,
                                        inputs.candidates, block_size)
                if inputs.structured:
                    value = value + (q.log_prob(z).sum(-1) - inputs.guides[0].log_prob(z)).sum()
        else:  # (z, z2), each (N, D): the guide's sites "z" then "z2"
            value = prior_log_ratio(inputs.prior, latents, inputs.recognitions, inputs.plate,
                                    inputs.candidates, block_size)
        if num_particles == 1:
            return value
        total = total + value
    return total / num_particles


def _rsample(guide: TorchDistribution) -> torch.Tensor:
    """``guide.rsample()``; for a ``Delta`` (deterministic encoders), also as the independent
    views of the joint form, its point itself, which is what ``Delta.rsample()`` returns as a
    view (``v.expand(v.shape)``) at the cost of an autograd node per view and step."""
    base = guide.base_dist if type(guide) is Independent else guide
    return base.v if type(base) is Delta else guide.rsample()


def _delta(latent: torch.Tensor) -> TorchDistribution:
    return Delta(latent, event_dim=1)


def rpm_elbo(
    prior, latents: Sequence[torch.Tensor] | torch.Tensor,
    recognitions: Sequence[TorchDistribution] | TorchDistribution | None = None,
    candidates: Candidates | None = None, block_size: int | None = None,
    pooled_marginal: bool = False,
) -> torch.Tensor:
    r"""The RPM ELBO of a batch of latents, for plain PyTorch loops on embeddings.

    .. code-block:: python

        prior = rpm.priors.ImplicitPrior(rpm.priors.CosineEnergy(kappa=1 / 0.1))
        z1, z2 = encoder(x1), encoder(x2)                    # (N, D) each
        loss = -rpm.inference.rpm_elbo(prior, [z1, z2]) / len(z1)   # InfoNCE - log N
        loss.backward()

    Returns :math:`\sum_i [\log P(z_{i,1:J}) - \sum_j \log Q_j(z_{i,j})]` (Eq. 15 with the
    recognition models as the guide), the number :class:`~rpm.RPMELBO` returns (negated) for an
    :class:`~rpm.RPM` whose encoders produced these latents: with Delta recognition (the
    default here: the latents are the embeddings themselves) and the implicit prior,
    :math:`\mathcal{L}/N = -\text{InfoNCE} + \log N`.

    :param prior: a pair-form prior (``latents = [z, z2]``) or a prior over J views (the
        joint form: ``latents`` a list of J tensors (N, D) or one tensor (N, J, D)); its
        parameters (e.g. a learned temperature) train with the encoder's.
    :param latents: the latents (samples of the recognition distributions), each (N, D).
    :param recognitions: the recognition distributions the latents were drawn from: pair
        form ``[q, q2]`` (batch_shape (N,)), joint form a list of J or one distribution of
        batch_shape (N, J); default ``Delta`` at the latents (deterministic encoders).
    :param candidates: a :class:`~rpm.marginals.candidates.Candidates` (a global batch, a
        queue); default the batch.
    :param block_size: block edge for the O(N^2) kernels; None decides by size.
    :param bool pooled_marginal: joint form: pool the marginals over the views.
    :return: a scalar tensor, the ELBO summed over the N instances.
    """
    check_bool("pooled_marginal", pooled_marginal)
    if recognitions is None and not hook(prior, "accepts_delta_recognition"):
        raise ValueError(delta_with_density_message("the default Delta recognition", prior)
                         + "; pass the recognition distributions the latents were drawn from")
    if hook(prior, "joint_views"):
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
        marginal = SequenceMixtureMarginal(q, pooled=pooled_marginal, block_size=block_size,
                                           candidates=candidates)
        return prior_log_ratio(prior, z, (q, marginal), "instances", candidates, block_size)
    if isinstance(latents, torch.Tensor) or len(latents) != 2:
        got = f"a tensor {tuple(latents.shape)}" if isinstance(latents, torch.Tensor) else len(latents)
        raise ValueError(f"{type(prior).__name__} is a pair prior: pass latents [z, z2], "
                         f"two tensors (N, D); got {got}")
    z, z2 = latents
    q, q2 = (_delta(z), _delta(z2)) if recognitions is None else recognitions
    return prior_log_ratio(prior, (z, z2), (q, q2), "pairs", candidates, block_size)
