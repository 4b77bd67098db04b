r"""RP-GSSM's objective for the stationary state-space prior (Hromadka et al. 2025;
``docs/theory.md``, *Stationary state-space prior*), the measured alternative to the RPM ELBO.

RP-GSSM reads the encoder's Gaussian output :math:`\tilde f_t(z) = \mathcal{N}(\tilde\mu_t;\ z,
\tilde\Sigma_t)` as a *factor* and folds the prior's marginal :math:`p_t(z) = \mathcal{N}(b,
C C^\top + R)` (:meth:`~rpm.priors.StationaryStateSpacePrior.marginal`) into the recognition
distribution,

.. math::

    f(z_t | x_t) = \frac{p_t(z_t)\, \tilde f_t(z_t)}{Z_t}, \qquad
    Z_t = \int p_t\, \tilde f_t = \mathcal{N}(\tilde\mu_t;\ b,\ C C^\top + R + \tilde\Sigma_t),

with :math:`F_t` the mixture of :math:`f(\cdot|x_{n,t})` over the batch's n (per frame t). With
the guide :math:`q(z_{1:T}) = p(z_{1:T}) \prod_t \tilde f_t(z_t) / Z_q`
(:class:`~rpm.distributions.StateSpacePosterior` conditioned on :math:`\tilde\mu, \tilde\Sigma`,
:math:`Z_q` the Kalman likelihood of :math:`\tilde\mu_{1:T}` under noise :math:`R +
\tilde\Sigma_t`), the RPM ELBO of this recognition model, :math:`\mathbb{E}_q[\log p(z_{1:T})
+ \sum_t (\log f(z_t|x_t) - \log F_t(z_t)) - \log q(z_{1:T})]`, is exactly

.. math::

    \mathcal{L} = \log Z_q - \sum_t \log Z_t
        + \sum_t \mathbb{E}_q\big[\log p_t(z_t) - \log F_t(z_t)\big],

because :math:`\log p + \sum_t \log f_t - \log q = \log Z_q - \sum_t \log Z_t + \sum_t \log
p_t(z_t)` for every :math:`z_{1:T}`. :math:`\log Z_q - \sum_t \log Z_t` is the gain of
explaining the factors jointly over each frame's own marginal likelihood: only temporal
structure is rewarded, so the scale of the factors cannot raise it.
"""

from __future__ import annotations

import math

import torch
from pyro.distributions import MultivariateNormal, TorchDistribution

from rpm.distributions._state_space import StateSpacePosterior
from rpm.marginals._sequence_marginal import sequence_components
from rpm.ops._logsumexp import safe_logsumexp
from rpm.priors._stationary import StationaryStateSpacePrior

__all__ = ["folded_recognition", "rp_gssm_elbo"]


def folded_recognition(prior: StationaryStateSpacePrior, loc: torch.Tensor, scale: torch.Tensor
                       ) -> tuple[MultivariateNormal, torch.Tensor]:
    r"""RP-GSSM's recognition distributions :math:`f(z_t|x_t) \propto p_t(z_t) \tilde f_t(z_t)`
    and the normalisers :math:`\log Z_t` (module docstring).

    .. math::

        f(z_t|x_t) = \mathcal{N}\big(z_t;\ V_t (P^{-1} b + \tilde\Sigma_t^{-1} \tilde\mu_t),\
            V_t\big), \qquad V_t = (P^{-1} + \tilde\Sigma_t^{-1})^{-1},\ P = C C^\top + R.

    :param prior: the stationary prior (its marginal p_t).
    :param torch.Tensor loc: the factors' means :math:`\tilde\mu`, shape (N, T, D).
    :param torch.Tensor scale: their standard deviations, shape (N, T, D).
    :return: f with batch_shape (N, T), event_shape (D,), and :math:`\log Z_t`, shape (N, T).
    """
    marginal = prior.marginal()
    covariance = marginal.covariance_matrix  # P, (D, D)
    precision_p = torch.cholesky_inverse(torch.linalg.cholesky(covariance))
    precision = precision_p + torch.diag_embed(scale.pow(-2))  # (N, T, D, D)
    tril = torch.linalg.cholesky(precision)
    natural = precision_p @ marginal.loc + loc / scale.square()  # (N, T, D)
    mean = torch.cholesky_solve(natural.unsqueeze(-1), tril).squeeze(-1)
    folded = MultivariateNormal(mean, precision_matrix=precision)
    normaliser = MultivariateNormal(marginal.loc, covariance + torch.diag_embed(scale.square()))
    return folded, normaliser.log_prob(loc)


def rp_gssm_elbo(prior: StationaryStateSpacePrior, q: TorchDistribution) -> torch.Tensor:
    r"""RP-GSSM's ELBO of N sequences, one reparameterised sample (module docstring),

    .. math::

        \mathcal{L}_i = \log Z_q - \sum_t \log Z_t
            + \sum_t \big[\log p_t(z_{i,t}) - \log F_t(z_{i,t})\big],
        \qquad z_{i,1:T} \sim q,\quad
        F_t(z) = \frac1N \sum_n f(z | x_{n,t}).

    :param prior: a :class:`~rpm.priors.StationaryStateSpacePrior` over T views.
    :param q: the encoder's factors as ``Normal(loc, scale).to_event(1)``, batch_shape (N, T),
        event_shape (D,) (what :class:`~rpm.GaussianRecognition` returns).
    :return: :math:`\mathcal{L}_i`, shape (N,); its negative sum is the loss.
    """
    if not isinstance(prior, StationaryStateSpacePrior):
        raise TypeError("RP-GSSM's objective folds the stationary marginal p_t into the "
                        "recognition; it needs a StationaryStateSpacePrior, got "
                        f"{type(prior).__name__}")
    loc, scale = sequence_components(q)
    if scale is None:
        raise ValueError("RP-GSSM's objective needs Gaussian factors (GaussianRecognition), got "
                         "Delta recognition")
    num, duration = loc.shape[:2]
    guide = StateSpacePosterior(prior.distribution(duration), loc, scale)
    z = guide.rsample()  # (N, T, D)
    folded, log_normaliser = folded_recognition(prior, loc, scale)
    # F_t(z_{i,t}) = mean_n f(z_{i,t} | x_{n,t}): components (1, N, T), values (N, 1, T, D)
    components = folded.log_prob(z.unsqueeze(1))  # (N_i, N_n, T)
    log_marginal = safe_logsumexp(components, dim=1) - math.log(num)  # (N, T)
    log_prior_marginal = prior.marginal().log_prob(z)  # (N, T)
    return (guide.filtered.log_prob.to(z.dtype) - log_normaliser.sum(-1)
            + (log_prior_marginal - log_marginal).sum(-1))
