r"""Explicit learned priors :math:`P_\theta(z, z') = P_\theta(z) P_\theta(z'|z)`.

Unlike the implicit prior, an explicit prior is a normalised density on R^D x R^D, so in the
ELBO (Eq. 15 of Aitchison & Ganev)

.. math::

    \mathcal{L} = \mathbb{E}_{Q(z|x) Q(z'|x')}\big[\log P_\theta(z, z') - \log Q(z) - \log Q(z')\big]
    + \text{const}

the recognition marginals do not cancel: :math:`\log Q(z_i)` is the minibatch mixture evaluated
for every :math:`z_i` against every component j (``docs/theory.md#explicit-priors``). Q(z)
must then have a density, so these priors need stochastic encoders or Delta encoders with ``noise_scale > 0``
(Appendix B); :class:`~rpm.RPM` refuses the ill-defined combination.
"""

from __future__ import annotations

import pyro
import torch
from pyro.distributions import MultivariateNormal, Normal, TorchDistribution
from pyro.nn import PyroParam
from torch.distributions import constraints

from rpm._validation import check_positive_int
from rpm.priors.base import Prior, positive_hyperparameter

__all__ = ["GaussianRandomWalkPrior", "LinearDynamicsPrior"]


def _latent_dtype(q: TorchDistribution | None, parameter: torch.Tensor) -> torch.dtype:
    """The dtype to compute in: the recognition distributions' when given, else the parameter's."""
    return parameter.dtype if q is None else q.mean.dtype


class GaussianRandomWalkPrior(Prior):
    r"""A Gaussian random walk: :math:`P(z) = \mathcal{N}(0, s^2 I)`,
    :math:`P(z'|z) = \mathcal{N}(z, l^2 I)`, with s and l learned.

    The explicit counterpart of the RBF energy: adjacent views have nearby latents, with a
    learned step length l, and the latents spread with a learned scale s. No analytic
    cancellation (:meth:`~rpm.priors.base.Prior.log_ratio` is None): the ELBO traces it.

    :param int dim: latent dimension D.
    :param float scale: initial s > 0 (float64 until cast to the latents' dtype).
    :param float step: initial l > 0 (likewise).
    """

    def __init__(self, dim: int, scale: float = 1.0, step: float = 0.1):
        super().__init__()
        self.dim = check_positive_int("dim", dim)
        self.scale = PyroParam(positive_hyperparameter("scale", scale), constraints.positive)
        self.step = PyroParam(positive_hyperparameter("step", step), constraints.positive)

    def forward(self, q=None, q2=None):
        """Declares ``z ~ N(0, s^2 I)`` and ``z2 ~ N(z, l^2 I)``; returns ``(z, z2)``."""
        scale = self.scale
        dtype = _latent_dtype(q, scale)
        scale, step = scale.to(dtype), self.step.to(dtype)
        z = pyro.sample("z", Normal(scale.new_zeros(self.dim), scale).to_event(1))
        z2 = pyro.sample("z2", Normal(z, step).to_event(1))
        return z, z2


class LinearDynamicsPrior(Prior):
    r"""Linear-Gaussian dynamics: :math:`P(z) = \mathcal{N}(0, S)`,
    :math:`P(z'|z) = \mathcal{N}(A z, \Sigma)`, with A, S and :math:`\Sigma` learned.

    S and :math:`\Sigma` are held through their Cholesky factors (``constraints.lower_cholesky``),
    A is unconstrained and starts at the identity. The ELBO traces it (no analytic
    cancellation).

    :param int dim: latent dimension D.
    :param float scale: S starts at ``scale^2 I`` (float64 until cast to the latents' dtype).
    :param float noise: :math:`\Sigma` starts at ``noise^2 I`` (likewise).
    """

    def __init__(self, dim: int, scale: float = 1.0, noise: float = 0.1):
        super().__init__()
        self.dim = check_positive_int("dim", dim)
        eye = torch.eye(dim, dtype=torch.float64)
        self.transition = torch.nn.Parameter(eye.clone())  # A, (D, D)
        self.initial_scale_tril = PyroParam(
            positive_hyperparameter("scale", scale) * eye, constraints.lower_cholesky
        )  # chol(S)
        self.noise_scale_tril = PyroParam(
            positive_hyperparameter("noise", noise) * eye, constraints.lower_cholesky
        )  # chol(Sigma)

    def forward(self, q=None, q2=None):
        """Declares ``z ~ N(0, S)`` and ``z2 ~ N(A z, Sigma)``; returns ``(z, z2)``."""
        scale_tril = self.initial_scale_tril
        dtype = _latent_dtype(q, scale_tril)
        scale_tril = scale_tril.to(dtype)
        z = pyro.sample("z", MultivariateNormal(scale_tril.new_zeros(self.dim),
                                                scale_tril=scale_tril))
        z2 = pyro.sample("z2", MultivariateNormal(z @ self.transition.to(dtype).T,
                                                  scale_tril=self.noise_scale_tril.to(dtype)))
        return z, z2
