r"""Energies (coupling functions) f(z, z') of the uniform-implicit prior.

Under the implicit prior of Eq. 21-22 of Aitchison & Ganev,
:math:`P(z'|z) = Q(z') e^{f(z, z')} / Z(z)`: the energy says which latents of the second view
are likely given the first. Each energy is a :class:`~pyro.nn.PyroModule` whose learnable
quantities are constrained :class:`~pyro.nn.PyroParam` s, and whose ``forward(z, z2)`` returns
the full pairwise matrix :math:`F_{ij} = f(z_i, z'_j)` of shape (N, M) in one shot.

==============  ===============================================  ==============================
energy          f(z, z')                                         special case
==============  ===============================================  ==============================
bilinear        :math:`z^\top W z'`                              CPC / InfoNCE critic (Eq. 8)
cosine          :math:`\kappa\, \hat z^\top \hat z'`             vMF-InfoNCE; NT-Xent (pooled)
RBF             :math:`-\lVert z - z'\rVert^2 / (2 l^2)`         Eq. 27 (bouncing balls)
anisotropic     :math:`-\tfrac12 (z-z')^\top \Lambda (z-z')`     AnInfoNCE (Rusak et al.)
Lp              :math:`-\lVert z - z'\rVert_p^p / \tau`          Laplace (p=1), cl-ica Table 2
neural          :math:`f_\theta(z, z')` (an MLP)                 a learned energy
==============  ===============================================  ==============================
"""

from __future__ import annotations

import math

import torch
from pyro.distributions import constraints
from pyro.nn import PyroModule, PyroParam

from rpm.ops.distances import squared_distances

__all__ = [
    "AnisotropicEnergy",
    "BilinearEnergy",
    "CosineEnergy",
    "Energy",
    "LpEnergy",
    "NeuralEnergy",
    "RBFEnergy",
    "squared_distances",
]


def _positive(name: str, value: float) -> torch.Tensor:
    try:
        value = float(value)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{name} must be a number, got {value!r}") from None
    if not (value > 0 and value < float("inf")):
        raise ValueError(
            f"{name} must be a finite positive number, got {value}; pass a value > 0 (for a "
            "learned parameter, its initial value)"
        )
    return torch.tensor(value)


def _positive_dim(dim: int) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ValueError(f"dim must be a positive integer (the latent dimension), got {dim!r}")
    return dim


def _check_pair(z: torch.Tensor, z2: torch.Tensor, dim: int | None = None) -> None:
    if z.dim() != 2 or z2.dim() != 2 or z.shape[1] != z2.shape[1]:
        raise ValueError(
            "an energy takes latents z of shape (N, D) and z2 of shape (M, D), got "
            f"{tuple(z.shape)} and {tuple(z2.shape)}"
        )
    if dim is not None and z.shape[1] != dim:
        raise ValueError(
            f"this energy was built for latents of dimension {dim} but the encoder produced "
            f"dimension {z.shape[1]}; build the energy with dim={z.shape[1]} or change the "
            "encoder's output size"
        )


def _unit(z: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(z, dim=-1)


class Energy(PyroModule):
    r"""Base class of energies :math:`f(z, z')`.

    Subclasses implement ``forward(z, z2)`` returning :math:`F_{ij} = f(z_i, z'_j)`, shape
    (N, M) for z (N, D) and z2 (M, D). ``paired(z, z2)`` returns the diagonal
    :math:`f(z_i, z'_i)`, shape (N,), for aligned pairs.
    """

    def forward(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def paired(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        """f(z_i, z'_i) for aligned pairs, shape (N,)."""
        if z.shape != z2.shape:
            raise ValueError(f"paired energies need equal shapes, got {z.shape} and {z2.shape}")
        return torch.diagonal(self(z, z2))


class BilinearEnergy(Energy):
    r"""The bilinear critic of CPC, :math:`f(z, z') = z^\top W z'` with W learned (Eq. 8).

    :param int dim: latent dimension D.
    :param float init_scale: W starts at ``init_scale * I``.
    """

    def __init__(self, dim: int, init_scale: float = 1.0):
        super().__init__()
        self.dim = _positive_dim(dim)
        init_scale = float(init_scale)
        if not math.isfinite(init_scale):
            raise ValueError(
                f"init_scale must be a finite number, got {init_scale}; W starts at "
                "init_scale * I, e.g. init_scale=1.0"
            )
        self.weight = torch.nn.Parameter(init_scale * torch.eye(dim))

    def forward(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        _check_pair(z, z2, self.dim)
        return (z @ self.weight) @ z2.T  # (N, M)

    def paired(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        _check_pair(z, z2, self.dim)
        return ((z @ self.weight) * z2).sum(-1)


class CosineEnergy(Energy):
    r"""The von Mises-Fisher energy :math:`f(z, z') = \kappa\, \hat z^\top \hat z'`, with
    :math:`\hat z = z / \lVert z \rVert` and :math:`\kappa = 1/\tau`.

    Under :class:`~rpm.priors.ImplicitPrior` its RPM ELBO is vMF-InfoNCE in the one-directional
    cross-view form (Zimmermann et al.; info-nce-pytorch), under
    :class:`~rpm.priors.PooledImplicitPrior` SimCLR's NT-Xent with :math:`\tau = 1/\kappa`;
    the conditional :math:`P(z'|z) \propto Q(z') \exp(\kappa \hat z^\top \hat z')` is a vMF tilt.

    :param float kappa: concentration :math:`\kappa > 0`.
    :param bool learn_kappa: learn :math:`\kappa` (a positive :class:`PyroParam`).
    """

    def __init__(self, kappa: float = 1.0, learn_kappa: bool = False):
        super().__init__()
        kappa_tensor = _positive("kappa", kappa)
        if learn_kappa:
            self.kappa = PyroParam(kappa_tensor, constraints.positive)
        else:
            self.register_buffer("kappa", kappa_tensor)

    def forward(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        _check_pair(z, z2)
        return self.kappa * (_unit(z) @ _unit(z2).T)

    def paired(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        _check_pair(z, z2)
        return self.kappa * (_unit(z) * _unit(z2)).sum(-1)


class RBFEnergy(Energy):
    r"""The Gaussian RBF energy :math:`f(z, z') = -\lVert z - z' \rVert^2 / (2 l^2)` (Eq. 27).

    Under a uniform Q(z') this is the Gaussian conditional :math:`P(z'|z) = \mathcal{N}(z, l^2 I)`;
    it encodes "adjacent frames have nearby latents", which is what makes the bouncing-balls
    experiment work where the bilinear critic fails.

    :param float lengthscale: initial :math:`l > 0`.
    :param bool learn_lengthscale: learn l (a positive :class:`PyroParam`).
    """

    def __init__(self, lengthscale: float = 1.0, learn_lengthscale: bool = True):
        super().__init__()
        value = _positive("lengthscale", lengthscale)
        if learn_lengthscale:
            self.lengthscale = PyroParam(value, constraints.positive)
        else:
            self.register_buffer("lengthscale", value)

    def forward(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        _check_pair(z, z2)
        return -0.5 * squared_distances(z, z2) / self.lengthscale.square()

    def paired(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        _check_pair(z, z2)
        return -0.5 * (z - z2).square().sum(-1) / self.lengthscale.square()


class AnisotropicEnergy(Energy):
    r"""The AnInfoNCE energy :math:`f(z, z') = -\tfrac12 (z - z')^\top \operatorname{diag}(\lambda) (z - z')`.

    The positive diagonal :math:`\lambda` is learned through a softplus constraint (Rusak et
    al.): it lets dimensions whose positive pairs vary little ("style") keep their own
    concentration instead of being collapsed by a single temperature. With ``normalize`` the
    latents are first projected on the unit sphere, :math:`\hat z = z / \lVert z \rVert`.

    :param int dim: latent dimension D.
    :param bool normalize: use :math:`\hat z, \hat z'`.
    :param float init: initial value of every :math:`\lambda_d > 0`.
    """

    def __init__(self, dim: int, normalize: bool = True, init: float = 1.0):
        super().__init__()
        self.dim = _positive_dim(dim)
        self.normalize = normalize
        self.concentration = PyroParam(
            _positive("init", init) * torch.ones(dim), constraints.softplus_positive
        )

    def _project(self, z: torch.Tensor) -> torch.Tensor:
        return _unit(z) if self.normalize else z

    def forward(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        _check_pair(z, z2, self.dim)
        return -0.5 * squared_distances(self._project(z), self._project(z2), self.concentration)

    def paired(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        _check_pair(z, z2, self.dim)
        diff = self._project(z) - self._project(z2)
        return -0.5 * (diff.square() * self.concentration).sum(-1)


class LpEnergy(Energy):
    r"""The Lp energy :math:`f(z, z') = -\lVert z - z' \rVert_p^p / \tau`.

    p = 1 is the Laplace conditional and p = 3 a generalized normal one (Zimmermann et al.,
    Table 2); p = 2 with :math:`\tau = 2 l^2` is the RBF energy.

    :param float p: exponent p > 0.
    :param float tau: temperature :math:`\tau > 0`.
    :param bool learn_tau: learn :math:`\tau` (a positive :class:`PyroParam`).
    """

    def __init__(self, p: float = 1.0, tau: float = 1.0, learn_tau: bool = False):
        super().__init__()
        self.p = float(_positive("p", p))
        tau_tensor = _positive("tau", tau)
        if learn_tau:
            self.tau = PyroParam(tau_tensor, constraints.positive)
        else:
            self.register_buffer("tau", tau_tensor)

    def forward(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        _check_pair(z, z2)
        if self.p == 2.0:
            return -squared_distances(z, z2) / self.tau
        # torch.cdist computes ||.||_p with a gradient that is defined at 0 for p >= 1.
        distance = torch.cdist(z, z2, p=self.p)  # (N, M)
        return -distance.pow(self.p) / self.tau

    def paired(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        _check_pair(z, z2)
        distance = (z - z2).abs()  # (N, D)
        if self.p < 1.0:
            # |d|^p has an infinite slope at d = 0 for p < 1: take the zero subgradient there,
            # as torch.cdist does in forward, instead of inf * 0 = NaN.
            zero = distance == 0
            distance = torch.where(zero, torch.ones_like(distance), distance)
            return -distance.pow(self.p).masked_fill(zero, 0.0).sum(-1) / self.tau
        return -distance.pow(self.p).sum(-1) / self.tau


class NeuralEnergy(Energy):
    r"""A learned energy :math:`f_\theta(z, z') = w_2^\top \operatorname{act}(W_a z + W_b z' + b_1) + b_2`.

    A one-hidden-layer MLP on the concatenation :math:`[z; z']`; the first layer is split as
    :math:`W [z; z'] = W_a z + W_b z'` so that the (N, M) matrix needs an (N, M, H) hidden
    tensor rather than an (N, M, 2D) input.

    :param int dim: latent dimension D.
    :param int hidden: hidden width H.
    """

    def __init__(self, dim: int, hidden: int = 64):
        super().__init__()
        self.dim = _positive_dim(dim)
        if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
            raise ValueError(f"hidden must be a positive integer, got {hidden!r}")
        self.first = PyroModule[torch.nn.Linear](dim, hidden)  # W_a z + b_1
        self.second = PyroModule[torch.nn.Linear](dim, hidden, bias=False)  # W_b z'
        self.out = PyroModule[torch.nn.Linear](hidden, 1)

    def forward(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        _check_pair(z, z2, self.dim)
        hidden = torch.nn.functional.softplus(
            self.first(z)[:, None, :] + self.second(z2)[None, :, :]
        )  # (N, M, H)
        return self.out(hidden).squeeze(-1)  # (N, M)

    def paired(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        _check_pair(z, z2, self.dim)
        hidden = torch.nn.functional.softplus(self.first(z) + self.second(z2))  # (N, H)
        return self.out(hidden).squeeze(-1)
