r"""Explicit learned priors P_theta(z, z') = P_theta(z) P_theta(z'|z).

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
from pyro.distributions import Laplace, MultivariateNormal, Normal, TorchDistribution
from pyro.nn import PyroParam
from torch.distributions import constraints

from rpm._validation import check_positive_int
from rpm.priors.base import Prior, positive_hyperparameter
from rpm.priors.generalized_normal import GeneralizedNormal

__all__ = ["GaussianRandomWalkPrior", "GeneralizedNormalRandomWalkPrior", "LaplaceRandomWalkPrior",
           "LinearDynamicsPrior"]


def _latent_dtype(q: TorchDistribution | None, parameter: torch.Tensor) -> torch.dtype:
    """The dtype to compute in: the recognition distributions' when given, else the parameter's."""
    return parameter.dtype if q is None else q.mean.dtype


class _RandomWalkPrior(Prior):
    r"""Base of the random walks :math:`P(z) = \mathcal{N}(0, s^2 I)`,
    :math:`P(z'|z) = \prod_d p(z'_d - z_d)` with s learned: a subclass declares the step's
    parameters and implements :meth:`_step`, the distribution of :math:`z'` given z
    (event_shape (D,)). No analytic cancellation (:meth:`~rpm.priors.base.Prior.log_ratio` is
    None): the ELBO traces it. As a sequence prior, ``MarkovPrior(prior)`` is the walk along the
    T views, :math:`P(z_{1:T}) = P(z_1) \prod_t P(z_{t+1}|z_t)`.

    :param int dim: latent dimension D.
    :param float scale: initial s > 0 (float64 until cast to the latents' dtype).
    """

    def __init__(self, dim: int, scale: float = 1.0):
        super().__init__()
        self.dim = check_positive_int("dim", dim)
        self.scale = PyroParam(positive_hyperparameter("scale", scale), constraints.positive)

    def _step(self, z: torch.Tensor, dtype: torch.dtype) -> TorchDistribution:
        raise NotImplementedError(f"{type(self).__name__} must implement _step(z, dtype)")

    def forward(self, q=None, q2=None):
        """Declares ``z ~ N(0, s^2 I)`` and ``z2`` from the step's distribution given z;
        returns ``(z, z2)``."""
        scale = self.scale
        dtype = _latent_dtype(q, scale)
        scale = scale.to(dtype)
        z = pyro.sample("z", Normal(scale.new_zeros(self.dim), scale).to_event(1))
        z2 = pyro.sample("z2", self._step(z, dtype))
        return z, z2


class GaussianRandomWalkPrior(_RandomWalkPrior):
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
        super().__init__(dim, scale)
        self.step = PyroParam(positive_hyperparameter("step", step), constraints.positive)

    def _step(self, z, dtype):
        return Normal(z, self.step.to(dtype)).to_event(1)


class LaplaceRandomWalkPrior(_RandomWalkPrior):
    r"""A random walk with Laplace steps: :math:`P(z) = \mathcal{N}(0, s^2 I)`,

    .. math::

        P(z'|z) = \prod_{d=1}^D \frac{1}{2b} e^{-|z'_d - z_d| / b},

    with s and b learned: the explicit counterpart of the Lp energy with p = 1, whose sparse
    steps (most coordinates barely move) break the rotation symmetry of the Gaussian walk, so
    the latents are identified up to permutation and sign (Zimmermann et al. 2021, Table 3;
    Klindt et al. 2021).

    :param int dim: latent dimension D.
    :param float scale: initial s > 0 (float64 until cast to the latents' dtype).
    :param float step: initial b > 0 (likewise).
    """

    def __init__(self, dim: int, scale: float = 1.0, step: float = 0.1):
        super().__init__(dim, scale)
        self.step = PyroParam(positive_hyperparameter("step", step), constraints.positive)

    def _step(self, z, dtype):
        return Laplace(z, self.step.to(dtype)).to_event(1)


class GeneralizedNormalRandomWalkPrior(_RandomWalkPrior):
    r"""A random walk with generalized-normal steps: :math:`P(z) = \mathcal{N}(0, s^2 I)`,

    .. math::

        P(z'|z) = \prod_{d=1}^D \frac{\beta}{2 \alpha \Gamma(1/\beta)}
            \exp\Big(-\Big|\frac{z'_d - z_d}{\alpha}\Big|^\beta\Big)

    (:class:`~rpm.priors.GeneralizedNormal`), with s, the step scale :math:`\alpha` and, with
    ``learn_shape``, the shape :math:`\beta` learned: :math:`\beta = 2` is the Gaussian walk,
    1 the Laplace walk, and :math:`\beta < 1` the sparser steps of natural video (Klindt et
    al. 2021).

    :param int dim: latent dimension D.
    :param float scale: initial s > 0 (float64 until cast to the latents' dtype).
    :param float step: initial :math:`\alpha > 0` (likewise).
    :param float shape: initial (or, without ``learn_shape``, fixed) :math:`\beta > 0`.
    :param bool learn_shape: learn :math:`\beta` (default True); else it is a buffer.
    """

    def __init__(self, dim: int, scale: float = 1.0, step: float = 0.1, shape: float = 1.0,
                 learn_shape: bool = True):
        super().__init__(dim, scale)
        self.step = PyroParam(positive_hyperparameter("step", step), constraints.positive)
        shape = positive_hyperparameter("shape", shape)
        if learn_shape:
            self.shape = PyroParam(shape, constraints.positive)
        else:
            self.register_buffer("shape", shape)

    def _step(self, z, dtype):
        return GeneralizedNormal(z, self.step.to(dtype), self.shape.to(dtype)).to_event(1)


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
