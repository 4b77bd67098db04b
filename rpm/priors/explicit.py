r"""Explicit learned priors P_theta(z, z') = P_theta(z) P_theta(z'|z).

Unlike the implicit prior, an explicit prior is a normalised density on R^D x R^D, so in the
ELBO (Eq. 15 of Aitchison & Ganev)

.. math::

    \mathcal{L} = \mathbb{E}_{Q(z|x) Q(z'|x')}\big[\log P_\theta(z, z') - \log Q(z) - \log Q(z')\big]
    + \text{const}

the recognition marginals do not cancel: :math:`\log Q(z_i)` is the minibatch mixture evaluated
for every :math:`z_i` against every component j (SPEC section 3). Q(z) must then have a
density, so these priors need stochastic encoders or Delta encoders with ``noise_scale > 0``
(Appendix B); :class:`~rpm.RPM` refuses the ill-defined combination.
"""

from __future__ import annotations

import pyro
import torch
from pyro.distributions import MultivariateNormal, Normal
from pyro.nn import PyroModule, PyroParam
from torch.distributions import constraints

__all__ = ["GaussianRandomWalkPrior", "LinearDynamicsPrior"]


def _check_dim(dim: int) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ValueError(f"dim must be a positive integer (the latent dimension), got {dim!r}")
    return dim


def _positive(name: str, value: float) -> torch.Tensor:
    try:
        value = float(value)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{name} must be a number, got {value!r}") from None
    if not (0 < value < float("inf")):
        raise ValueError(
            f"{name} must be a finite positive number, got {value}; pass its initial value "
            "as a number > 0 (it is learned as a positive parameter)"
        )
    return torch.tensor(value)


class GaussianRandomWalkPrior(PyroModule):
    r"""A Gaussian random walk: :math:`P(z) = \mathcal{N}(0, s^2 I)`,
    :math:`P(z'|z) = \mathcal{N}(z, l^2 I)`, with s and l learned.

    The explicit counterpart of the RBF energy: adjacent views have nearby latents, with a
    learned step length l, and the latents spread with a learned scale s.

    :param int dim: latent dimension D.
    :param float scale: initial s > 0.
    :param float step: initial l > 0.
    """

    def __init__(self, dim: int, scale: float = 1.0, step: float = 0.1):
        super().__init__()
        self.dim = _check_dim(dim)
        self.scale = PyroParam(_positive("scale", scale), constraints.positive)
        self.step = PyroParam(_positive("step", step), constraints.positive)

    def forward(self, q=None, q2=None):
        """Declares ``z ~ N(0, s^2 I)`` and ``z2 ~ N(z, l^2 I)``; returns ``(z, z2)``."""
        zeros = self.scale.new_zeros(self.dim)
        z = pyro.sample("z", Normal(zeros, self.scale).to_event(1))
        z2 = pyro.sample("z2", Normal(z, self.step).to_event(1))
        return z, z2


class LinearDynamicsPrior(PyroModule):
    r"""Linear-Gaussian dynamics: :math:`P(z) = \mathcal{N}(0, S)`,
    :math:`P(z'|z) = \mathcal{N}(A z, \Sigma)`, with A, S and :math:`\Sigma` learned.

    S and :math:`\Sigma` are held through their Cholesky factors (``constraints.lower_cholesky``),
    A is unconstrained and starts at the identity.

    :param int dim: latent dimension D.
    :param float scale: S starts at ``scale^2 I``.
    :param float noise: :math:`\Sigma` starts at ``noise^2 I``.
    """

    def __init__(self, dim: int, scale: float = 1.0, noise: float = 0.1):
        super().__init__()
        self.dim = _check_dim(dim)
        eye = torch.eye(dim)
        self.transition = torch.nn.Parameter(eye.clone())  # A, (D, D)
        self.initial_scale_tril = PyroParam(
            _positive("scale", scale) * eye, constraints.lower_cholesky
        )  # chol(S)
        self.noise_scale_tril = PyroParam(
            _positive("noise", noise) * eye, constraints.lower_cholesky
        )  # chol(Sigma)

    def forward(self, q=None, q2=None):
        """Declares ``z ~ N(0, S)`` and ``z2 ~ N(A z, Sigma)``; returns ``(z, z2)``."""
        scale_tril = self.initial_scale_tril
        z = pyro.sample("z", MultivariateNormal(scale_tril.new_zeros(self.dim),
                                                scale_tril=scale_tril))
        z2 = pyro.sample("z2", MultivariateNormal(z @ self.transition.T,
                                                  scale_tril=self.noise_scale_tril))
        return z, z2
