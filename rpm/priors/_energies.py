r"""Energies (coupling functions) f(z, z') of the uniform-implicit prior.

Under the implicit prior of Eq. 21-22 of Aitchison & Ganev,
:math:`P(z'|z) = Q(z') e^{f(z, z')} / Z(z)`: the energy says which latents of the second view
are likely given the first. Each energy is a :class:`~pyro.nn.PyroModule` whose learnable
quantities are constrained :class:`~pyro.nn.PyroParam` s, and whose ``forward(z, z2)`` returns
the full pairwise matrix :math:`F_{ij} = f(z_i, z'_j)` of shape (N, M) in one shot. Each
implements the hooks of :class:`~rpm.priors._base.Energy` (``paired``, ``logit_factors``), so a
subclass that keeps its parent's ``forward`` keeps the streamed normaliser; a subclass that
overrides ``forward`` gets the generic blocked path over its own ``forward`` unless it overrides
the hooks too (``rpm.priors._energy_paths``). Hyperparameters given as Python floats are held in
float64 and cast to the latents' dtype where they are used.

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
from collections.abc import Callable

import torch
from pyro.distributions import constraints
from pyro.infer.util import is_validation_enabled
from pyro.nn import PyroModule, PyroParam

from rpm._validation import check_positive_int, check_real
from rpm.ops._distances import squared_distance_factors, squared_distances
from rpm.ops._lp_distances import lp_distances, lp_paired_distances
from rpm.priors._base import Energy, positive_hyperparameter

__all__ = [
    "AnisotropicEnergy",
    "BilinearEnergy",
    "CosineEnergy",
    "Energy",
    "LpEnergy",
    "NeuralEnergy",
    "RBFEnergy",
]


# dtypes whose every norm is representable, and whose squares fit float64
_WIDE_NORM_DTYPES = (torch.float32, torch.bfloat16)


def _in_dtype(parameter: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``parameter.to(dtype)``, without the call when it has that dtype already (an energy's
    hyperparameter in the latents' dtype, read at every call)."""
    return parameter if parameter.dtype == dtype else parameter.to(dtype)


#: A row of zeros is divided by this (``F.normalize``'s ``eps``): it stays the zero vector, and
#: its gradient is the incoming one divided by it.
ZERO_ROW_EPS = 1e-12


def unit_vectors(z: torch.Tensor) -> torch.Tensor:
    r""":math:`\hat z = z / \lVert z \rVert` of each row, for rows of any representable norm:
    the one normalisation of the cosine energy, of the priors and of :mod:`rpm.losses`.

    It is invariant to the scale of a row, :math:`\widehat{c z} = \hat z` for every
    :math:`c > 0` whose :math:`c z` the dtype holds, up to the rounding of the dtype, and a row
    of zeros gives the zero vector with a finite gradient (``F.normalize``'s and lightly's
    convention: the row is divided by ``ZERO_ROW_EPS``, so its cosine with every row is 0).
    ``F.normalize`` itself divides by :math:`\max(\lVert z \rVert, \epsilon)` with the
    squares taken in the latents' dtype, so in float32 a norm above ~1.8e19 overflows (every
    :math:`\hat z` becomes 0) and one below :math:`\epsilon = 10^{-12}` is not normalised.

    Numerics: the norms of float32 and bfloat16 rows are accumulated in float64, where the
    squares of any float32 number fit, and rounded back to a norm the dtype holds (as many
    autograd nodes as ``F.normalize``). Rows of other dtypes (float64, whose squares may
    overflow float64; float16, whose norms may not be representable) are first divided by their
    largest :math:`|z_d|` (a constant for autograd: :math:`\hat z` is scale-invariant, so the
    gradient is the exact one of :math:`z / \lVert z \rVert`).

    :param torch.Tensor z: rows to normalise. Shape: (..., D).
    :return: the unit rows (zero rows stay zero). Shape: (..., D).
    """
    if z.dtype in _WIDE_NORM_DTYPES:
        norm = torch.linalg.vector_norm(z, dim=-1, keepdim=True, dtype=torch.float64)  # (N, 1)
        return z / norm.masked_fill(norm == 0, ZERO_ROW_EPS).to(z.dtype)
    scale = z.detach().abs().amax(-1, keepdim=True)                            # (N, 1)
    scale = scale.masked_fill_(scale == 0, 1.0)
    scaled = z / scale
    # F.normalize(scaled, dim=-1, eps=ZERO_ROW_EPS), without its Python layers
    return scaled / torch.linalg.vector_norm(scaled, dim=-1, keepdim=True).clamp_min(ZERO_ROW_EPS)


def _at_least_one(radius: torch.Tensor) -> torch.Tensor:
    """max(R, 1): the bounds below cover the gradients as well as the values."""
    return radius.clamp_min(1.0)


class BilinearEnergy(Energy):
    r"""The bilinear critic of CPC, :math:`f(z, z') = z^\top W z'` with W learned (Eq. 8).

    Matrix-product factors (:meth:`logit_factors`): :math:`a_i = W^\top z_i`, :math:`b_j = z'_j`.

    :param int dim: latent dimension D.
    :param float init_scale: W starts at ``init_scale * I`` (held in float64 until cast).
    """

    def __init__(self, dim: int, init_scale: float = 1.0):
        super().__init__()
        self.dim = check_positive_int("dim", dim)
        init_scale = check_real("init_scale", init_scale)
        self.weight = torch.nn.Parameter(init_scale * torch.eye(dim, dtype=torch.float64))

    def _weight(self, z: torch.Tensor) -> torch.Tensor:
        return _in_dtype(self.weight, z.dtype)

    def forward(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        self.check_latents(z, z2)
        return (z @ self._weight(z)) @ z2.T  # (N, M)

    def paired(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        self.check_latents(z, z2)
        return ((z @ self._weight(z)) * z2).sum(-1)

    def logit_factors(self, z: torch.Tensor, z2: torch.Tensor):
        self.check_latents(z, z2)
        return z @ self._weight(z), z2, None

    def logit_bound(self, radius: torch.Tensor) -> torch.Tensor:
        r""":math:`\max(\lVert W \rVert_F, 1)\, \max(R^2, R)`: :math:`|z^\top W z'| \le
        \lVert W \rVert_2 R^2`, :math:`\lVert \partial f / \partial W \rVert \le R^2`
        (:meth:`~rpm.priors._base.Energy.logit_bound`)."""
        weight = self.weight.detach().double().norm().clamp_min(1.0)
        return weight * radius * _at_least_one(radius)


class CosineEnergy(Energy):
    r"""The von Mises-Fisher energy :math:`f(z, z') = \kappa\, \hat z^\top \hat z'`, with
    :math:`\hat z = z / \lVert z \rVert` and :math:`\kappa = 1/\tau`.

    Under :class:`~rpm.priors.ImplicitPrior` its RPM ELBO is vMF-InfoNCE in the one-directional
    cross-view form (Zimmermann et al.; info-nce-pytorch), under
    :class:`~rpm.priors.PooledImplicitPrior` SimCLR's NT-Xent with :math:`\tau = 1/\kappa`;
    the conditional :math:`P(z'|z) \propto Q(z') \exp(\kappa \hat z^\top \hat z')` is a vMF tilt.
    Matrix-product factors: :math:`a_i = \kappa \hat z_i`, :math:`b_j = \hat z'_j`.

    :param float kappa: concentration :math:`\kappa > 0` (kept in float64 until cast to the
        latents' dtype, so ``kappa=1/0.07`` is exact after ``.double()``).
    :param bool learn_kappa: learn :math:`\kappa` (a positive :class:`PyroParam`).
    """

    def __init__(self, kappa: float = 1.0, learn_kappa: bool = False):
        super().__init__()
        kappa_tensor = positive_hyperparameter("kappa", kappa)
        if learn_kappa:
            self.kappa: torch.Tensor = PyroParam(  # type: ignore[assignment]  # PyroParam -> tensor
                kappa_tensor, constraints.positive)
        else:
            self.register_buffer("kappa", kappa_tensor)

    def forward(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        self.check_latents(z, z2)
        # kappa scales the N rows before the product rather than the N x M matrix after it; a
        # 0-dim kappa takes the rows' dtype in the product (torch's type promotion), as
        # kappa.to(z.dtype) would, without a cast at every call
        return (self.kappa * unit_vectors(z)) @ unit_vectors(z2).T

    def paired(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        self.check_latents(z, z2)
        return self.kappa * (unit_vectors(z) * unit_vectors(z2)).sum(-1)

    def logit_factors(self, z: torch.Tensor, z2: torch.Tensor):
        self.check_latents(z, z2)
        return self.kappa * unit_vectors(z), unit_vectors(z2), None

    def logit_bound(self, radius: torch.Tensor) -> torch.Tensor:
        r""":math:`\kappa \max(1, 1/R)` for :math:`R > 0`, :math:`\kappa \max(1, 1/\epsilon)` at
        :math:`R = 0`: :math:`|f| \le \kappa` at any norm, its gradient
        :math:`\lVert \nabla_z f \rVert \le \kappa / R`, and a row of zeros is divided by
        :math:`\epsilon` (``ZERO_ROW_EPS``, ``unit_vectors``)
        (:meth:`~rpm.priors._base.Energy.logit_bound`)."""
        kappa = self.kappa.detach().double()
        radius = radius.masked_fill(radius == 0, ZERO_ROW_EPS)
        return kappa * radius.clamp_min(torch.finfo(torch.float64).tiny).reciprocal().clamp_min(1.0)


class RBFEnergy(Energy):
    r"""The Gaussian RBF energy :math:`f(z, z') = -\lVert z - z' \rVert^2 / (2 l^2)` (Eq. 27).

    Under a uniform Q(z') this is the Gaussian conditional :math:`P(z'|z) = \mathcal{N}(z, l^2 I)`;
    it encodes "adjacent frames have nearby latents", which is what makes the bouncing-balls
    experiment work where the bilinear critic fails. Matrix-product factors: the expanded
    squared distance with weights :math:`1/l^2` (``rpm.ops._distances.squared_distance_factors``).

    :param float lengthscale: initial :math:`l > 0` (float64 until cast).
    :param bool learn_lengthscale: learn l (a positive :class:`PyroParam`).
    """

    def __init__(self, lengthscale: float = 1.0, learn_lengthscale: bool = True):
        super().__init__()
        value = positive_hyperparameter("lengthscale", lengthscale)
        if learn_lengthscale:
            self.lengthscale: torch.Tensor = PyroParam(  # type: ignore[assignment]  # PyroParam -> tensor
                value, constraints.positive)
        else:
            self.register_buffer("lengthscale", value)

    def forward(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        self.check_latents(z, z2)
        return -0.5 * squared_distances(z, z2) / _in_dtype(self.lengthscale, z.dtype).square()

    def paired(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        self.check_latents(z, z2)
        return -0.5 * (z - z2).square().sum(-1) / _in_dtype(self.lengthscale, z.dtype).square()

    def logit_factors(self, z: torch.Tensor, z2: torch.Tensor):
        self.check_latents(z, z2)
        precision = _in_dtype(self.lengthscale, z.dtype).square().reciprocal()  # 1 / l^2
        return squared_distance_factors(z, z2, precision.expand(z.shape[1]))

    def logit_bound(self, radius: torch.Tensor) -> torch.Tensor:
        r""":math:`2 \max(R^2, R) / l^2`: :math:`\lVert z - z' \rVert \le 2R`
        (:meth:`~rpm.priors._base.Energy.logit_bound`). In float32 and at l = 1 a batch of a few
        pairs is in range up to latents of norm ~1e18; beyond, the squared distances
        themselves overflow."""
        lengthscale = self.lengthscale.detach().double()
        return 2.0 * radius * _at_least_one(radius) / lengthscale.square()


class AnisotropicEnergy(Energy):
    r"""The AnInfoNCE energy :math:`f(z, z') = -\tfrac12 (z - z')^\top \operatorname{diag}(\lambda) (z - z')`.

    The positive diagonal :math:`\lambda` is learned through a softplus constraint (Rusak et
    al.): it lets dimensions whose positive pairs vary little ("style") keep their own
    concentration instead of being collapsed by a single temperature. With ``normalize`` the
    latents are first projected on the unit sphere, :math:`\hat z = z / \lVert z \rVert`.
    Matrix-product factors: the expanded squared distance of the projected latents with weights
    :math:`\lambda`.

    :param int dim: latent dimension D.
    :param bool normalize: use :math:`\hat z, \hat z'`.
    :param float init: initial value of every :math:`\lambda_d > 0` (float64 until cast).
    """

    def __init__(self, dim: int, normalize: bool = True, init: float = 1.0):
        super().__init__()
        self.dim = check_positive_int("dim", dim)
        self.normalize = normalize
        self.concentration: torch.Tensor = PyroParam(  # type: ignore[assignment]  # PyroParam -> tensor
            positive_hyperparameter("init", init) * torch.ones(dim, dtype=torch.float64),
            constraints.softplus_positive,
        )

    def project(self, z: torch.Tensor) -> torch.Tensor:
        r"""The latents the distance is measured on: :math:`\hat z` with ``normalize``, else z."""
        return unit_vectors(z) if self.normalize else z

    def forward(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        self.check_latents(z, z2)
        return -0.5 * squared_distances(
            self.project(z), self.project(z2), _in_dtype(self.concentration, z.dtype)
        )

    def paired(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        self.check_latents(z, z2)
        diff = self.project(z) - self.project(z2)
        return -0.5 * (diff.square() * _in_dtype(self.concentration, z.dtype)).sum(-1)

    def logit_factors(self, z: torch.Tensor, z2: torch.Tensor):
        self.check_latents(z, z2)
        return squared_distance_factors(
            self.project(z), self.project(z2), _in_dtype(self.concentration, z.dtype)
        )

    def logit_bound(self, radius: torch.Tensor) -> torch.Tensor:
        r""":math:`2 \max_d \lambda_d \max(1, 1/R)` with ``normalize`` (the projected latents
        are unit vectors), else :math:`2 \max_d \lambda_d \max(R^2, R)`
        (:meth:`~rpm.priors._base.Energy.logit_bound`)."""
        top = self.concentration.detach().double().amax()
        if self.normalize:
            tiny = torch.finfo(torch.float64).tiny
            return 2.0 * top * radius.clamp_min(tiny).reciprocal().clamp_min(1.0)
        return 2.0 * top * radius * _at_least_one(radius)


class LpEnergy(Energy):
    r"""The Lp energy :math:`f(z, z') = -\lVert z - z' \rVert_p^p / \tau`.

    p = 1 is the Laplace conditional and p = 3 a generalized normal one (Zimmermann et al.,
    Table 2); p = 2 with :math:`\tau = 2 l^2` is the RBF energy, and only then does it have
    matrix-product factors (the expanded squared distance with weights :math:`2/\tau`).

    Computation. For p other than 2 the matrix is
    :math:`-\sum_d |\tau^{-1/p} (z_{id} - z'_{jd})|^p` (equal to the formula above; scaling
    each difference keeps every energy that the dtype can hold representable, whatever
    :math:`\tau`), through the blocked kernel ``rpm.ops._lp_distances`` with its analytic
    gradient (``torch.cdist`` is slow and, for large p, not finite in its backward pass). At
    :math:`z_d = z'_d` the gradient is 0 for every p; for p < 1, where :math:`|d|^p` has an
    infinite slope at 0, that is a choice (see ``rpm.ops._lp_distances``).

    Valid range. p must lie in [0.5, 100]: there the float32 loss and gradients are finite for
    latents of norm 1e-20 to 1e20 whenever the energies themselves are (a test covers the
    grid). An energy :math:`\lVert z - z'\rVert_p^p / \tau` beyond the largest number of the
    dtype (float32: 3.4e38, e.g. p = 100, :math:`\tau = 1` and a coordinate difference above
    2.4) would be an infinite logit; it raises a ``ValueError`` that names the largest
    representable difference instead (use a larger :math:`\tau`, latents nearer each other,
    or float64). The check costs one host synchronisation per call: it runs on the CPU always,
    on accelerators under Pyro's validation (``pyro.enable_validation``), and never while
    tracing or compiling.

    :param float p: exponent, :math:`0.5 \le p \le 100`.
    :param float tau: temperature :math:`\tau > 0` (float64 until cast).
    :param bool learn_tau: learn :math:`\tau` (a positive :class:`PyroParam`).
    """

    #: The exponents whose float32 numerics are tested.
    P_RANGE = (0.5, 100.0)

    def __init__(self, p: float = 1.0, tau: float = 1.0, learn_tau: bool = False):
        super().__init__()
        self.p = float(positive_hyperparameter("p", p))
        low, high = self.P_RANGE
        if not low <= self.p <= high:
            raise ValueError(
                f"LpEnergy needs p in [{low:g}, {high:g}] (the range whose float32 loss and "
                f"gradients are tested finite), got p={self.p:g}"
            )
        tau_tensor = positive_hyperparameter("tau", tau)
        if learn_tau:
            self.tau: torch.Tensor = PyroParam(  # type: ignore[assignment]  # PyroParam -> tensor
                tau_tensor, constraints.positive)
        else:
            self.register_buffer("tau", tau_tensor)

    def _scale(self, z: torch.Tensor) -> torch.Tensor:
        """:math:`\tau^{-1/p}` in the latents' dtype (computed in float64)."""
        return self.tau.double().pow(-1.0 / self.p).to(z.dtype)

    def _check_range(self, distances: torch.Tensor, z: torch.Tensor, z2: torch.Tensor) -> None:
        """Raises if some energy overflowed the dtype (see the class docstring)."""
        if torch.jit.is_tracing() or torch.compiler.is_compiling():
            return
        if distances.device.type != "cpu" and not is_validation_enabled():
            return  # on an accelerator the check synchronises: only under Pyro's validation
        if not bool(torch.isinf(distances.detach().abs().amax())):  # one reduction, no mask
            return
        with torch.no_grad():
            spread = torch.maximum(z.amax(0) - z2.amin(0), z2.amax(0) - z.amin(0)).max()
            limit = (self.tau.double() * torch.finfo(z.dtype).max / z.shape[1]) ** (1.0 / self.p)
        raise ValueError(
            f"LpEnergy(p={self.p:g}, tau={float(self.tau):.3g}): |z - z'|_p^p / tau overflows "
            f"{z.dtype} for some pair (coordinate differences up to {float(spread):.3g}); it "
            f"holds every energy only while |z_d - z'_d| <= (tau * {torch.finfo(z.dtype).max:.3g}"
            f" / D)^(1/p) = {float(limit):.3g}: use a larger tau, latents nearer each other, or "
            "float64"
        )

    def forward(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        self.check_latents(z, z2)
        if self.p == 2.0:
            energy = -squared_distances(z, z2) / self.tau.to(z.dtype)
            self._check_range(energy, z, z2)
            return energy
        scale = self._scale(z)
        distances = lp_distances(z, z2, self.p, scale)  # (N, M)
        self._check_range(distances, z, z2)
        return -distances

    def paired(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        self.check_latents(z, z2)
        scale = self._scale(z)
        distances = lp_paired_distances(z, z2, self.p, scale)  # (N,)
        self._check_range(distances, z, z2)
        return -distances

    def logit_factors(self, z: torch.Tensor, z2: torch.Tensor):
        self.check_latents(z, z2)
        if self.p != 2.0:
            return None
        return squared_distance_factors(z, z2, (2.0 / self.tau.to(z.dtype)).expand(z.shape[1]))


class NeuralEnergy(Energy):
    r"""A learned energy :math:`f_\theta(z, z') = w_2^\top \operatorname{act}(W_a z + W_b z' + b_1) + b_2`.

    A one-hidden-layer MLP on the concatenation :math:`[z; z']`; the first layer is split as
    :math:`W [z; z'] = W_a z + W_b z'` so that the (N, M) matrix needs an (N, M, H) hidden
    tensor rather than an (N, M, 2D) input. It has no matrix-product factors, so its InfoNCE
    normaliser is the log-sum-exp of the full matrix.

    :param int dim: latent dimension D.
    :param int hidden: hidden width H.
    """

    def __init__(self, dim: int, hidden: int = 64):
        super().__init__()
        self.dim = check_positive_int("dim", dim)
        hidden = check_positive_int("hidden", hidden)
        # Pyro types PyroModule[Linear] as a PyroModule class, not a Linear one
        linear: Callable[..., torch.nn.Linear] = PyroModule[torch.nn.Linear]  # type: ignore[assignment]
        self.first = linear(dim, hidden)  # W_a z + b_1
        self.second = linear(dim, hidden, bias=False)  # W_b z'
        self.out = linear(hidden, 1)

    def forward(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        self.check_latents(z, z2)
        hidden = torch.nn.functional.softplus(
            self.first(z)[:, None, :] + self.second(z2)[None, :, :]
        )  # (N, M, H)
        return self.out(hidden).squeeze(-1)  # (N, M)

    def paired(self, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        self.check_latents(z, z2)
        hidden = torch.nn.functional.softplus(self.first(z) + self.second(z2))  # (N, H)
        return self.out(hidden).squeeze(-1)

    def logit_bound(self, radius: torch.Tensor) -> torch.Tensor:
        r""":math:`\lVert w_2 \rVert_1 \big((\lVert W_a \rVert_F + \lVert W_b \rVert_F)
        \max(R, 1) + \lVert b_1 \rVert_\infty + \log 2\big) + |b_2|`, since
        :math:`\operatorname{softplus}(x) \le |x| + \log 2`
        (:meth:`~rpm.priors._base.Energy.logit_bound`)."""
        with torch.no_grad():
            inner = (self.first.weight.double().norm() + self.second.weight.double().norm())
            hidden = inner * _at_least_one(radius) + self.first.bias.double().abs().amax() + math.log(2)
            return self.out.weight.double().abs().sum() * hidden + self.out.bias.double().abs().sum()
