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
from pyro.distributions import Laplace, MultivariateNormal, Normal, TorchDistribution
from pyro.nn import PyroParam
from torch.distributions import constraints

from rpm._validation import check_positive_int
from rpm.distributions._generalized_normal import GeneralizedNormal
from rpm.priors._base import Energy, Prior, positive_hyperparameter

__all__ = ["GaussianRandomWalkPrior", "GeneralizedNormalRandomWalkPrior", "LaplaceRandomWalkPrior",
           "LinearDynamicsPrior", "RandomWalkEnergy"]


def _latent_dtype(q: TorchDistribution | None, parameter: torch.Tensor) -> torch.dtype:
    """The dtype to compute in: the recognition distributions' when given, else the parameter's."""
    return parameter.dtype if q is None else q.mean.dtype


class _RandomWalkPrior(Prior):
    r"""Base of the random walks :math:`P(z) = \mathcal{N}(0, s^2 I)`,
    :math:`P(z'|z) = \prod_d p(z'_d - z_d)` with s and the step's scale learned: a subclass
    declares any further parameter of the step (a shape) and implements
    :meth:`step_distribution`, the law of each coordinate of :math:`z'` given z. No analytic
    cancellation (:meth:`~rpm.priors._base.Prior.log_ratio` is None): the ELBO traces it. As a
    sequence prior, ``MarkovPrior(prior)`` is the walk along the T views,
    :math:`P(z_{1:T}) = P(z_1) \prod_t P(z_{t+1}|z_t)`.

    :param int dim: latent dimension D.
    :param float scale: initial s > 0 (float64 until cast to the latents' dtype).
    :param float step: initial scale of the step > 0 (likewise), the parameter ``step``.
    """

    dim: int  # given to the constructor (PriorBase's None: a prior for any dimension)

    def __init__(self, dim: int, scale: float = 1.0, step: float = 0.1):
        super().__init__()
        self.dim = check_positive_int("dim", dim)
        self.scale: torch.Tensor = PyroParam(  # type: ignore[assignment]  # PyroParam -> tensor
            positive_hyperparameter("scale", scale), constraints.positive)
        self.step: torch.Tensor = PyroParam(  # type: ignore[assignment]  # PyroParam -> tensor
            positive_hyperparameter("step", step), constraints.positive)

    def step_distribution(self, loc: torch.Tensor) -> TorchDistribution:
        r"""The distribution of :math:`z'` given :math:`z` = ``loc``, per coordinate: batch_shape
        ``loc.shape``, event_shape (), in ``loc``'s dtype (``loc`` = 0: the step
        :math:`z' - z` itself).

        :param torch.Tensor loc: z, shape (..., D).
        """
        raise NotImplementedError(f"{type(self).__name__} must implement step_distribution(loc)")

    def forward(self, q=None, q2=None):
        """Declares ``z ~ N(0, s^2 I)`` and ``z2`` from the step's distribution given z;
        returns ``(z, z2)``."""
        scale = self.scale
        dtype = _latent_dtype(q, scale)
        scale = scale.to(dtype)
        z = pyro.sample("z", Normal(scale.new_zeros(self.dim), scale).to_event(1))
        z2 = pyro.sample("z2", self.step_distribution(z).to_event(1))
        return z, z2


class GaussianRandomWalkPrior(_RandomWalkPrior):
    r"""A Gaussian random walk: :math:`P(z) = \mathcal{N}(0, s^2 I)`,
    :math:`P(z'|z) = \mathcal{N}(z, l^2 I)`, with s and l learned.

    The explicit counterpart of the RBF energy: adjacent views have nearby latents, with a
    learned step length l, and the latents spread with a learned scale s. No analytic
    cancellation (:meth:`~rpm.priors._base.Prior.log_ratio` is None): the ELBO traces it.

    :param int dim: latent dimension D.
    :param float scale: initial s > 0 (float64 until cast to the latents' dtype).
    :param float step: initial l > 0 (likewise).
    """

    def step_distribution(self, loc):
        return Normal(loc, self.step.to(loc.dtype))


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

    def step_distribution(self, loc):
        return Laplace(loc, self.step.to(loc.dtype))


class GeneralizedNormalRandomWalkPrior(_RandomWalkPrior):
    r"""A random walk with generalized-normal steps: :math:`P(z) = \mathcal{N}(0, s^2 I)`,

    .. math::

        P(z'|z) = \prod_{d=1}^D \frac{\beta}{2 \alpha \Gamma(1/\beta)}
            \exp\Big(-\Big|\frac{z'_d - z_d}{\alpha}\Big|^\beta\Big)

    (:class:`~rpm.distributions.GeneralizedNormal`), with s, the step scale :math:`\alpha` and, with
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
        super().__init__(dim, scale, step)
        initial = positive_hyperparameter("shape", shape)
        if learn_shape:
            self.shape: torch.Tensor = PyroParam(  # type: ignore[assignment]  # PyroParam -> tensor
                initial, constraints.positive)
        else:
            self.register_buffer("shape", initial)

    def step_distribution(self, loc):
        return GeneralizedNormal(loc, self.step.to(loc.dtype), self.shape.to(loc.dtype))


class RandomWalkEnergy(Energy):
    r"""A random walk's step density as the energy of the implicit prior,

    .. math::

        f(z, z') = \log P(z'|z) = \sum_{d=1}^D \log p(z'_d - z_d),

    so that :math:`P(z'|z) \propto Q(z')\, p(z' - z)` (Eq. 21-22 of Aitchison & Ganev): the
    walk's transition reweighting the recognition marginal instead of a normalised density.
    Its ELBO is InfoNCE with this critic (Eq. 23-25), which needs no recognition noise and
    leaves the latents' scale to the step's learned scale. The Laplace walk gives the Lp
    energy with p = 1 and :math:`\tau = b`, the Gaussian walk the RBF energy with l the step,
    up to constants that cancel in the normaliser; the generalized-normal walk learns the
    exponent as well (Zimmermann et al. 2021, Table 3). The walk's parameters (step scale,
    shape) are this energy's; its marginal scale s is not used.

    :param walk: a random walk (:class:`GaussianRandomWalkPrior`,
        :class:`LaplaceRandomWalkPrior`, :class:`GeneralizedNormalRandomWalkPrior`).
    """

    def __init__(self, walk: _RandomWalkPrior):
        super().__init__()
        if not isinstance(walk, _RandomWalkPrior):
            raise TypeError(f"RandomWalkEnergy needs a random-walk prior (e.g. "
                            f"LaplaceRandomWalkPrior(dim)), got {type(walk).__name__}")
        self.walk = walk
        self.dim = walk.dim

    def forward(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        r""":math:`F_{ij} = \sum_d \log p(z'_{jd} - z_{id})`, shape (N, M), from the (N, M, D)
        differences."""
        steps = z2.unsqueeze(0) - z.unsqueeze(1)                                   # (N, M, D)
        return self.walk.step_distribution(torch.zeros_like(steps)).log_prob(steps).sum(-1)

    def paired(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        r""":math:`\sum_d \log p(z'_{id} - z_{id})`, shape (N,)."""
        if z.shape != z2.shape:
            raise ValueError(f"paired energies need z and z2 of equal shapes, got "
                             f"{tuple(z.shape)} and {tuple(z2.shape)}")
        steps = z2 - z
        return self.walk.step_distribution(torch.zeros_like(steps)).log_prob(steps).sum(-1)


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

    dim: int  # given to the constructor (PriorBase's None: a prior for any dimension)

    def __init__(self, dim: int, scale: float = 1.0, noise: float = 0.1):
        super().__init__()
        self.dim = check_positive_int("dim", dim)
        eye = torch.eye(dim, dtype=torch.float64)
        self.transition = torch.nn.Parameter(eye.clone())  # A, (D, D)
        self.initial_scale_tril: torch.Tensor = PyroParam(  # type: ignore[assignment]  # PyroParam -> tensor
            positive_hyperparameter("scale", scale) * eye, constraints.lower_cholesky
        )  # chol(S)
        self.noise_scale_tril: torch.Tensor = PyroParam(  # type: ignore[assignment]  # PyroParam -> tensor
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
