r"""Proper distributions that rpm's priors declare at Pyro sample sites and that neither
``torch.distributions`` nor ``pyro.distributions`` provides: each is a
:class:`~pyro.distributions.TorchDistribution` whose ``sample`` draws from the density its
``log_prob`` evaluates.

* :class:`GeneralizedNormal`: :math:`p(x) = \frac{\beta}{2\alpha\Gamma(1/\beta)}
  e^{-|(x - \mu)/\alpha|^\beta}`, the step of
  :class:`~rpm.priors.GeneralizedNormalRandomWalkPrior`.
* :class:`GaussianStateSpace`: :math:`P(z_{1:T})` of a linear-Gaussian state-space model, the
  Kalman filter's marginal likelihood (the state-space priors' site ``"z"``).
* :class:`StateSpacePosterior`: that model conditioned on Gaussian pseudo-observations,
  :math:`Q(z_{1:T}) \propto P(z_{1:T}) \prod_t \mathcal{N}(\mu_t; z_t, \operatorname{diag}
  \sigma_t^2)` (their structured guide).
* :class:`VonMisesFisher`: :math:`p(x) = C_D(\kappa) e^{\kappa \mu^\top x}` on the unit sphere
  :math:`S^{D-1}`, any :math:`D \ge 2`, sampled with gradients in :math:`\mu` and
  :math:`\kappa` (``pyro.distributions.VonMises3D`` is :math:`D = 3` with ``log_prob`` only).

The minibatch-mixture marginals :math:`Q(z)` are in :mod:`rpm.marginals`.
"""

from rpm.distributions._generalized_normal import GeneralizedNormal
from rpm.distributions._state_space import GaussianStateSpace, StateSpacePosterior
from rpm.distributions._von_mises_fisher import VonMisesFisher

__all__ = ["GaussianStateSpace", "GeneralizedNormal", "StateSpacePosterior", "VonMisesFisher"]
