r"""The von Mises-Fisher distribution on the unit sphere :math:`S^{D-1} \subset \mathbb R^D`, any
:math:`D \ge 2`, which neither ``torch.distributions`` nor ``pyro.distributions`` provides
(Pyro's ``VonMises3D`` is :math:`D = 3` with ``log_prob`` only).

.. math::

    p(x;\ \mu, \kappa) = C_D(\kappa)\, e^{\kappa \mu^\top x}, \qquad
    \log C_D(\kappa) = \Big(\frac D2 - 1\Big) \log\kappa - \frac D2 \log 2\pi
        - \log I_{D/2-1}(\kappa)

(Mardia & Jupp, Eq. 9.3.4), mean direction :math:`\mu` (a unit vector), concentration
:math:`\kappa > 0`, :math:`I_\nu` the modified Bessel function of the first kind
(``rpm.ops._bessel``: float64, accurate to a few ulps for any order and :math:`\kappa`, with
exact derivatives). The cosine :math:`W = \mu^\top x` has mean :math:`A_D(\kappa) =
I_{D/2}(\kappa) / I_{D/2-1}(\kappa)`, the mean resultant length.

**Sampling.** :math:`x = Q\,(W, \sqrt{1 - W^2}\, V)` with :math:`V` uniform on
:math:`S^{D-2}` and :math:`Q` the Householder reflection (times :math:`\pm 1`) that maps the
first basis vector :math:`e_1` to :math:`\mu` (Wood 1994). :math:`\Omega = 1 - W \in [0, 2]` has
density :math:`p(\omega) \propto e^{-\kappa\omega} (\omega (2 - \omega))^{(D-3)/2}` and is
drawn

* for :math:`D = 3` by inverting its CDF: :math:`\Omega = -\log(1 + U (e^{-2\kappa} - 1)) /
  \kappa`, :math:`U \sim \mathcal U(0, 1)`, differentiated by autograd;
* otherwise by Wood's rejection sampler in its cancellation-free form (:func:`wood_envelope`,
  :func:`wood_proposal`, :func:`wood_log_accept_bound`, which ``rpm.data.synthetic.vmf``'s
  seeded data sampler shares): :math:`b = (D-1) / (2\kappa + \sqrt{4\kappa^2 + (D-1)^2})`,
  :math:`x_0 = (1-b)/(1+b)`, proposals :math:`\Omega = 2bG_1 / (bG_1 + G_2)` with
  :math:`G_{1,2} \sim \mathrm{Gamma}(\tfrac{D-1}2)`, accepted when
  :math:`\kappa(1 - x_0 - \Omega) + (D-1)[\log(1 + x_0\Omega/(1 - x_0)) - \log(1 + x_0)]
  \ge \log U`.

**Reparameterisation.** ``rsample`` is differentiable in both parameters: in :math:`\mu`
through the reflection, in :math:`\kappa` through :math:`\Omega`. For :math:`D \ne 3`,
:math:`d\Omega/d\kappa` is the implicit reparameterisation gradient (Figurnov et al. 2018,
Eq. 6), :math:`d\omega/d\kappa = -\partial_\kappa F(\omega; \kappa) / p(\omega; \kappa)` with
:math:`F` the CDF of :math:`\Omega`; since :math:`\partial_\kappa p(s) = p(s)(\bar\omega - s)`,
:math:`\bar\omega = 1 - A_D(\kappa)`,

.. math::

    \frac{d\omega}{d\kappa} = -\int_0^\omega \frac{p(s)}{p(\omega)} (\bar\omega - s)\, ds
        = \int_\omega^2 \frac{p(s)}{p(\omega)} (\bar\omega - s)\, ds,

the first form used for :math:`\omega \le \bar\omega` and the second above it (each integrand
then has one sign). The integral is evaluated in float64 by tanh-sinh quadrature (257 nodes,
step 1/32), which clusters nodes double-exponentially at both ends of the interval, where the
integrand peaks and where the factor :math:`(s(2-s))^{(D-3)/2}` may be singular
(:math:`D = 2`); distances to the ends are carried exactly, so :math:`\omega` near 0 (large
:math:`\kappa`) loses no digits. It runs in the backward pass only.

References:
    K. V. Mardia and P. E. Jupp, *Directional Statistics*, Wiley, 2000, Section 9.3.
    A. T. A. Wood, "Simulation of the von Mises Fisher distribution", Communications in
    Statistics - Simulation and Computation 23(1), 1994.
    M. Figurnov, S. Mohamed and A. Mnih, "Implicit reparameterization gradients", NeurIPS 2018.
    H. Takahasi and M. Mori, "Double exponential formulas for numerical integration",
    Publications of the RIMS 9(3), 1974.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from pyro.distributions import TorchDistribution, constraints
from torch.autograd.function import once_differentiable
from torch.distributions import Gamma

from rpm.ops._bessel import bessel_iv_ratio, log_bessel_ive

__all__ = ["TabulatedLogNormaliser", "VonMisesFisher", "log_normaliser_plus_concentration",
           "uniform_log_density"]

#: Rounds of Wood's rejection sampler before giving up (each accepts most proposals).
_MAX_ROUNDS = 1000
#: Tanh-sinh rule: nodes j h for |j| <= 4 / h.
_QUADRATURE_STEP = 1.0 / 32
_QUADRATURE_NODES = torch.arange(-128, 129, dtype=torch.float64) * _QUADRATURE_STEP
#: Samples per block of the quadrature (bounds each temporary to 8192 x 257 float64, 17 MB).
_QUADRATURE_BLOCK = 8192


class VonMisesFisher(TorchDistribution):
    r"""Von Mises-Fisher :math:`\mathrm{vMF}(\mu, \kappa)` on the unit sphere
    :math:`S^{D-1} \subset \mathbb R^D`, :math:`D \ge 2`: batch_shape is the broadcast of
    ``loc.shape[:-1]`` and ``concentration.shape``, event_shape ``(D,)``.

    .. math::

        \log p(x) = \kappa\, \mu^\top x + \log C_D(\kappa), \qquad
        \log C_D(\kappa) = \Big(\frac D2 - 1\Big) \log\kappa - \frac D2 \log 2\pi
            - \log I_{D/2-1}(\kappa)

    (Mardia & Jupp, Eq. 9.3.4), :math:`I_\nu` the modified Bessel function of the first kind,
    evaluated in float64 (the results are cast back to the parameters' dtype). Mean
    :math:`A_D(\kappa)\, \mu` with the mean resultant length :math:`A_D(\kappa) = E[\mu^\top x]
    = I_{D/2}(\kappa) / I_{D/2-1}(\kappa)`, mode :math:`\mu`, variance the diagonal of the
    covariance :math:`\frac{A_D}{\kappa} I + (1 - \frac{D A_D}{\kappa} - A_D^2)\, \mu\mu^\top`,
    entropy :math:`-\log C_D(\kappa) - \kappa A_D(\kappa)`.

    ``rsample`` draws :math:`x = Q\,(W, \sqrt{1 - W^2}\, V)`, :math:`V` uniform on
    :math:`S^{D-2}` and :math:`Q` a Householder reflection (up to sign) taking :math:`e_1` to
    :math:`\mu`, so it is differentiable in :math:`\mu`. The cosine :math:`W = \mu^\top x`
    is drawn by its exact inverse CDF for :math:`D = 3` (differentiated by autograd), and
    otherwise by Wood's (1994) rejection sampler with the implicit reparameterisation gradient
    :math:`dW/d\kappa = -\partial_\kappa F(W; \kappa) / p(W; \kappa)` (Figurnov et al. 2018,
    :math:`F` the CDF of :math:`W`), an exact pathwise gradient whose one-dimensional integral
    is evaluated by tanh-sinh quadrature in the backward pass. Second derivatives through
    ``rsample`` are not available for :math:`D \ne 3`.

    For :math:`D = 2` the angle of :math:`x` follows ``pyro.distributions.VonMises``.

    :param torch.Tensor loc: mean direction :math:`\mu`, unit vectors along the last
        dimension. Shape: ``(*batch, D)``, ``D >= 2``.
    :param concentration: :math:`\kappa > 0`, finite. Shape: broadcastable with
        ``loc.shape[:-1]``.
    :type concentration: torch.Tensor or float

    References:
        K. V. Mardia and P. E. Jupp, *Directional Statistics*, Wiley, 2000, Section 9.3.
        A. T. A. Wood, "Simulation of the von Mises Fisher distribution", Communications in
        Statistics - Simulation and Computation 23(1), 1994.
        M. Figurnov, S. Mohamed and A. Mnih, "Implicit reparameterization gradients",
        NeurIPS 2018.
    """

    arg_constraints = {"loc": constraints.sphere, "concentration": constraints.positive}
    support = constraints.sphere
    has_rsample = True

    def __init__(self, loc, concentration, validate_args=None):
        if not isinstance(loc, torch.Tensor) or not loc.is_floating_point() or loc.dim() < 1:
            raise ValueError("VonMisesFisher loc must be a floating tensor of unit vectors of "
                             f"shape (*batch, D), got {_describe(loc)}")
        dim = loc.shape[-1]
        if dim < 2:
            raise ValueError(f"VonMisesFisher needs D >= 2 (loc of shape (*batch, D)), got loc of "
                             f"shape {tuple(loc.shape)}; for an angle on the circle use "
                             "pyro.distributions.VonMises (or this class with D = 2)")
        concentration = torch.as_tensor(concentration, dtype=loc.dtype, device=loc.device)
        batch_shape = torch.broadcast_shapes(loc.shape[:-1], concentration.shape)
        self.loc = loc.expand(batch_shape + (dim,))
        self.concentration = concentration.expand(batch_shape)
        validate = self._validate_args if validate_args is None else validate_args
        if validate:
            self._check_parameters()
        super().__init__(batch_shape, torch.Size((dim,)), validate_args=validate_args)

    def _check_parameters(self) -> None:
        """One-line errors for the parameters (the generic messages of the constraints name
        neither the fix nor the size of the error)."""
        kappa = self.concentration.detach()
        bad = kappa[~(torch.isfinite(kappa) & (kappa > 0))]
        if bad.numel():
            raise ValueError(f"VonMisesFisher concentration must be finite and > 0, got "
                             f"{bad.numel()} invalid value(s), e.g. {bad[0].item()}")
        loc = self.loc.detach()
        if not bool(constraints.sphere.check(loc).all()):
            error = (torch.linalg.vector_norm(loc, dim=-1) - 1).abs().max().item()
            tolerance = (constraints.sphere.reltol * torch.finfo(loc.dtype).eps
                         * loc.shape[-1] ** 0.5)
            raise ValueError(f"VonMisesFisher loc must be unit vectors: max |‖loc‖ - 1| = "
                             f"{error:.3g} exceeds {tolerance:.3g}; normalise it, e.g. "
                             "torch.nn.functional.normalize(loc, dim=-1)")

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(VonMisesFisher, _instance)
        batch_shape = torch.Size(batch_shape)
        new.loc = self.loc.expand(batch_shape + self.event_shape)
        new.concentration = self.concentration.expand(batch_shape)
        super(VonMisesFisher, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def _order(self) -> float:
        """The Bessel order :math:`\\nu = D/2 - 1`."""
        return self.event_shape[0] / 2 - 1

    @property
    def mean_resultant_length(self) -> torch.Tensor:
        r""":math:`A_D(\kappa) = E[\mu^\top x] = I_{D/2}(\kappa) / I_{D/2-1}(\kappa)`.
        Shape: batch_shape."""
        return bessel_iv_ratio(self._order, self.concentration)

    @property
    def mean(self) -> torch.Tensor:
        return self.mean_resultant_length.unsqueeze(-1) * self.loc

    @property
    def mode(self) -> torch.Tensor:
        return self.loc

    @property
    def variance(self) -> torch.Tensor:
        length = self.mean_resultant_length.unsqueeze(-1)
        kappa = self.concentration.unsqueeze(-1)
        dim = self.event_shape[0]
        return length / kappa + (1 - dim * length / kappa - length**2) * self.loc**2

    def _log_normalizer_plus_kappa(self) -> torch.Tensor:
        r""":math:`\log C_D(\kappa) + \kappa` (:func:`log_normaliser_plus_concentration`)."""
        return log_normaliser_plus_concentration(self.event_shape[0], self.concentration)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        if self._validate_args:
            self._validate_sample(value)
        cosine = (value * self.loc).sum(-1)
        return self.concentration * (cosine - 1) + self._log_normalizer_plus_kappa()

    def entropy(self) -> torch.Tensor:
        r""":math:`-\log C_D(\kappa) - \kappa A_D(\kappa)`, written as
        :math:`\kappa (1 - A_D) - (\log C_D + \kappa)`."""
        return (self.concentration * (1 - self.mean_resultant_length)
                - self._log_normalizer_plus_kappa())

    def rsample(self, sample_shape=torch.Size()) -> torch.Tensor:
        shape = self._extended_shape(sample_shape)                   # (*sample, *batch, D)
        dim = shape[-1]
        kappa = self.concentration.to(torch.float64).expand(shape[:-1])
        if dim == 3:
            uniform = torch.rand(shape[:-1], dtype=torch.float64, device=kappa.device)
            omega = -torch.log1p(uniform * torch.expm1(-2 * kappa)) / kappa
            two_minus_omega = 2 - omega
        else:
            omega, two_minus_omega = _wood_cosine(kappa.detach(), dim)
            if kappa.requires_grad:
                omega = _ImplicitCosine.apply(kappa, omega, two_minus_omega, dim)
        tangent = torch.randn(shape[:-1] + (dim - 1,), dtype=torch.float64, device=kappa.device)
        tangent = tangent / torch.linalg.vector_norm(tangent, dim=-1, keepdim=True)
        sine = torch.sqrt(omega * two_minus_omega).unsqueeze(-1)
        along_e1 = torch.cat([(1 - omega).unsqueeze(-1), sine * tangent], dim=-1)
        return _reflect_e1_to(self.loc.to(torch.float64).expand(shape), along_e1).to(self.loc.dtype)


def log_normaliser_plus_concentration(dim: int, kappa: torch.Tensor) -> torch.Tensor:
    r""":math:`\log C_D(\kappa) + \kappa = \nu \log\kappa - \frac D2 \log 2\pi -
    \log\operatorname{ive}_\nu(\kappa)`, :math:`\nu = D/2 - 1`, elementwise: the vMF
    log-normaliser with :math:`\log I_\nu(\kappa) - \kappa` taken whole (``log_bessel_ive``),
    so that nothing of size :math:`\kappa` cancels; differentiable in :math:`\kappa` to any
    order, :math:`\frac{d}{d\kappa}(\log C_D(\kappa) + \kappa) = 1 - A_D(\kappa)`.

    :param int dim: D >= 2.
    :param torch.Tensor kappa: :math:`\kappa > 0`. Shape: any.
    :returns: shape and dtype of ``kappa``.
    """
    order = dim / 2 - 1
    return (order * kappa.log() - dim / 2 * math.log(2 * math.pi)
            - log_bessel_ive(order, kappa))


def uniform_log_density(dim: int) -> float:
    r""":math:`\log C_D(0) = \log\Gamma(D/2) - \log 2 - \frac D2 \log\pi`, the log-density of
    the uniform distribution on :math:`S^{D-1}` (minus the log of its area), the limit of
    :math:`\log C_D(\kappa)` as :math:`\kappa \to 0`."""
    return math.lgamma(dim / 2) - math.log(2.0) - dim / 2 * math.log(math.pi)


class TabulatedLogNormaliser(torch.nn.Module):
    r""":math:`g(\kappa) = \log C_D(\kappa) + \kappa` by piecewise cubic Hermite interpolation
    in :math:`s = \log\kappa`, for energies that evaluate it on a whole (N, M) matrix of
    concentrations at every step, where the exact series
    (:func:`log_normaliser_plus_concentration`) costs tens of float64 passes over the matrix
    and three more in the backward pass.

    At construction the exact :math:`g` and its slope in :math:`s`,

    .. math::

        \frac{dg}{ds} = \kappa\,\big(1 - A_D(\kappa)\big),

    are computed in float64 at ``points`` equally spaced nodes :math:`s_k` from :math:`\log`
    ``low`` to :math:`\log` ``high``. For :math:`\kappa` in that range, with :math:`s_k \le s
    \le s_{k+1}`, :math:`h = s_{k+1} - s_k` and :math:`u = (s - s_k)/h`, the Hermite cubic that
    matches :math:`g` and :math:`dg/ds` at both nodes is

    .. math::

        g \approx (1 + 2u)(1 - u)^2 g_k + u (1 - u)^2 h g'_k + u^2 (3 - 2u) g_{k+1}
            + u^2 (u - 1) h g'_{k+1},

    held as the coefficients of :math:`1, u, u^2, u^3` (rounded to the input's dtype) and
    evaluated by Horner's rule in the input's dtype; autograd differentiates the interpolant.
    The slope rises from 0 to :math:`(D-1)/2` and every derivative of :math:`g` in :math:`s`
    stays bounded, so the error falls as :math:`h^4`: in float64, with the defaults, it is
    within :math:`10^{-11}` of the exact function (its derivative in :math:`\kappa` within
    :math:`10^{-8}`) for :math:`D \le 64`; in float32 the rounding of :math:`s` and of
    :math:`g` dominates. Concentrations outside the range (or not finite) are evaluated by the
    exact function.

    :param int dim: D >= 2.
    :param float low: the smallest tabulated :math:`\kappa > 0`.
    :param float high: the largest tabulated :math:`\kappa`, above ``low``.
    :param int points: table nodes, >= 2.
    """

    coefficients: torch.Tensor

    def __init__(self, dim: int, low: float = 1e-2, high: float = 1e4, points: int = 4096):
        super().__init__()
        if not (isinstance(dim, int) and dim >= 2):
            raise ValueError(f"TabulatedLogNormaliser needs an integer dim >= 2, got {dim!r}")
        if not (0 < low < high < math.inf):
            raise ValueError(f"TabulatedLogNormaliser needs 0 < low < high < inf, got low "
                             f"{low!r}, high {high!r}")
        if not (isinstance(points, int) and points >= 2):
            raise ValueError(f"TabulatedLogNormaliser needs an integer points >= 2, got "
                             f"{points!r}")
        self.dim = dim
        self.intervals = points - 1
        self.low, self.high = float(low), float(high)
        self.log_low = math.log(low)
        self.step = (math.log(high) - self.log_low) / (points - 1)
        nodes = torch.linspace(self.log_low, math.log(high), points, dtype=torch.float64)
        kappa = nodes.exp()
        values = log_normaliser_plus_concentration(dim, kappa)
        slopes = self.step * kappa * (1 - bessel_iv_ratio(dim / 2 - 1, kappa))  # h dg/ds
        rise = values[1:] - values[:-1]
        self.register_buffer("coefficients", torch.stack([
            values[:-1], slopes[:-1], 3 * rise - 2 * slopes[:-1] - slopes[1:],
            -2 * rise + slopes[:-1] + slopes[1:]], dim=-1))                # (points - 1, 4)

    def forward(self, kappa: torch.Tensor) -> torch.Tensor:
        r""":math:`\log C_D(\kappa) + \kappa`, elementwise (class docstring).

        :param torch.Tensor kappa: :math:`\kappa > 0`, a floating tensor. Shape: any.
        :returns: shape and dtype of ``kappa``.
        """
        if not kappa.is_floating_point():
            raise TypeError(f"TabulatedLogNormaliser takes a floating tensor, got dtype "
                            f"{kappa.dtype}")
        position = (kappa.clamp(self.low, self.high).log() - self.log_low) / self.step
        index = position.detach().floor().clamp(max=self.intervals - 1).long()
        u = position - index
        c = self.coefficients.to(kappa.dtype)[index]                     # (..., 4)
        result = c[..., 0] + u * (c[..., 1] + u * (c[..., 2] + u * c[..., 3]))
        inside = (kappa >= self.low) & (kappa <= self.high)
        if not bool(inside.all()):  # the exact function where the table does not reach
            outside = ~inside
            result = result.masked_scatter(
                outside, log_normaliser_plus_concentration(self.dim, kappa[outside]))
        return result

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, low={self.low}, high={self.high}, "
                f"points={self.intervals + 1}")


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"{type(value).__name__} {value!r}"


def _reflect_e1_to(loc: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    r""":math:`Q v` for the orthogonal :math:`Q = -s H_{e_1 + s\mu}`, :math:`s = \pm 1` the sign
    of :math:`\mu_1` (:math:`H_u = I - 2uu^\top / u^\top u`), which maps :math:`e_1` to
    :math:`\mu`; the sign keeps :math:`u^\top u = 2(1 + |\mu_1|) \ge 2`.
    Shapes: ``(..., D)`` both."""
    sign = torch.where(loc[..., :1] >= 0, 1.0, -1.0).to(loc.dtype)           # (..., 1)
    u = sign * loc
    u = torch.cat([u[..., :1] + 1, u[..., 1:]], dim=-1)                        # e1 + s mu
    reflected = value - 2 * u * (u * value).sum(-1, keepdim=True) / (u * u).sum(-1, keepdim=True)
    return -sign * reflected


def wood_envelope(kappa, dim: int):
    r"""The constants of Wood's sampler for concentration :math:`\kappa` on :math:`S^{D-1}`:
    :math:`b = (D-1) / (2\kappa + \sqrt{4\kappa^2 + (D-1)^2})`, :math:`x_0 = (1-b)/(1+b)` and
    :math:`1 - x_0 = 2b/(1+b)` (without the cancellation of :math:`1 - x_0` at large
    :math:`\kappa`). The one home of these formulas: :class:`VonMisesFisher` (a tensor of
    concentrations) and ``rpm.data.synthetic.vmf`` (one Python float) both use it.

    :param kappa: :math:`\kappa > 0`, a float or a tensor.
    :param int dim: D.
    :return: ``(b, x0, one_minus_x0)``, of the type of ``kappa``.
    """
    m = dim - 1
    sqrt = torch.sqrt if isinstance(kappa, torch.Tensor) else math.sqrt
    b = m / (2 * kappa + sqrt(4 * kappa**2 + m**2))
    return b, (1 - b) / (1 + b), 2 * b / (1 + b)


def wood_proposal(b, g1: torch.Tensor, g2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Wood's proposal :math:`(\Omega, 2 - \Omega)` from two :math:`\mathrm{Gamma}((D-1)/2)`
    variates, :math:`\Omega = 2bG_1 / (bG_1 + G_2)`, :math:`2 - \Omega = 2G_2 / (bG_1 + G_2)`:
    ratios of non-negative terms, so :math:`\Omega` never leaves :math:`[0, 2]`."""
    scaled = b * g1
    denominator = scaled + g2
    return 2 * scaled / denominator, 2 * g2 / denominator


def wood_log_accept_bound(omega, kappa, dim: int, x0, one_minus_x0):
    r"""The acceptance threshold of Wood's sampler (a proposal is kept when
    :math:`\log U` is at most this),
    :math:`\kappa(1 - x_0 - \omega) + (D-1)[\log(1 + x_0\omega/(1 - x_0)) - \log(1 + x_0)]`.

    :param omega: the proposals :math:`\Omega`, a tensor or a NumPy value.
    :param kappa: :math:`\kappa`, with ``x0`` and ``one_minus_x0`` from :func:`wood_envelope`
        (floats, or tensors broadcasting with ``omega``).
    :param int dim: D.
    """
    log1p_proposal = torch.log1p if isinstance(omega, torch.Tensor) else np.log1p
    log1p_constant = torch.log1p if isinstance(x0, torch.Tensor) else math.log1p
    return (kappa * (one_minus_x0 - omega)
            + (dim - 1) * (log1p_proposal(x0 * omega / one_minus_x0) - log1p_constant(x0)))


def _wood_cosine(kappa: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Wood's rejection sampler for :math:`\Omega = 1 - \mu^\top x` (module docstring), one
    draw per entry of ``kappa`` (float64, no gradient). Returns :math:`(\Omega, 2 - \Omega)`,
    each of the shape of ``kappa``, both free of cancellation."""
    b, x0, one_minus_x0 = wood_envelope(kappa, dim)
    gamma = Gamma(torch.full_like(kappa, (dim - 1) / 2), torch.ones_like(kappa))
    omega = torch.zeros_like(kappa)
    two_minus_omega = torch.zeros_like(kappa)
    done = torch.zeros_like(kappa, dtype=torch.bool)
    for _ in range(_MAX_ROUNDS):
        proposal, proposal_complement = wood_proposal(b, gamma.sample(), gamma.sample())
        bound = wood_log_accept_bound(proposal, kappa, dim, x0, one_minus_x0)
        accept = ~done & (torch.rand_like(kappa).log() <= bound)
        omega = torch.where(accept, proposal, omega)
        two_minus_omega = torch.where(accept, proposal_complement, two_minus_omega)
        done = done | accept
        if bool(done.all()):
            return omega, two_minus_omega
    raise RuntimeError(f"VonMisesFisher: Wood's rejection sampler did not finish in {_MAX_ROUNDS} "
                       "rounds (concentration or D out of floating-point range?)")


def _cosine_kappa_derivative(kappa: torch.Tensor, omega: torch.Tensor,
                             two_minus_omega: torch.Tensor, dim: int) -> torch.Tensor:
    r""":math:`d\omega/d\kappa` of the implicit reparameterisation (module docstring), by
    tanh-sinh quadrature on :math:`[0, \omega]` where :math:`\omega \le \bar\omega` and on
    :math:`[\omega, 2]` elsewhere. float64; all shapes equal."""
    m = (dim - 3) / 2
    mean = 1 - bessel_iv_ratio(dim / 2 - 1, kappa)                        # E[Omega]
    nodes = _QUADRATURE_NODES.to(kappa.device)                            # tau_j
    # s = a + (b - a) f with f = sigmoid(pi sinh tau); ds = (b - a) pi cosh(tau) f (1 - f) dtau
    scaled = math.pi * torch.sinh(nodes)
    f = torch.sigmoid(scaled)
    log_f = torch.nn.functional.logsigmoid(scaled)
    log_1mf = torch.nn.functional.logsigmoid(-scaled)
    log_weight = math.log(math.pi * _QUADRATURE_STEP) + torch.log(torch.cosh(nodes)) + log_f + log_1mf
    lower = omega <= mean
    result = torch.empty_like(kappa)
    for on_lower in (True, False):
        select = lower == on_lower
        k, w, c, a = (t[select].unsqueeze(-1) for t in (kappa, omega, two_minus_omega, mean))
        parts = []
        for start in range(0, k.shape[0], _QUADRATURE_BLOCK):
            block = slice(start, start + _QUADRATURE_BLOCK)
            kb, wb, cb, ab = k[block], w[block], c[block], a[block]                # (B, 1) each
            if on_lower:
                # s = w f: log p(s)/p(w) = k w (1 - f) + m [log f + log(2 - s) - log(2 - w)]
                log_ratio = kb * wb * (1 - f)
                if m:
                    log_ratio = log_ratio + m * (log_f + torch.log1p(wb * (1 - f) / cb))
                integral = wb * (torch.exp(log_weight + log_ratio) * (ab - wb * f)).sum(-1, keepdim=True)
                parts.append(-integral)
            else:
                # s = w + c f: log p(s)/p(w) = -k c f + m [log s - log w + log(1 - f)]
                log_ratio = -kb * cb * f
                if m:
                    log_ratio = log_ratio + m * (torch.log1p(cb * f / wb) + log_1mf)
                integral = cb * (torch.exp(log_weight + log_ratio) * (ab - wb - cb * f)).sum(-1, keepdim=True)
                parts.append(integral)
        if parts:
            result[select] = torch.cat(parts).squeeze(-1)
    return result


class _ImplicitCosine(torch.autograd.Function):
    r"""Identity on :math:`\omega` in the forward pass; in the backward pass the gradient in
    :math:`\kappa` is ``grad * dω/dκ`` (:func:`_cosine_kappa_derivative`)."""

    @staticmethod
    def forward(ctx, kappa: torch.Tensor, omega: torch.Tensor, two_minus_omega: torch.Tensor,
                dim: int) -> torch.Tensor:
        ctx.save_for_backward(kappa, omega, two_minus_omega)
        ctx.dim = dim
        return omega.clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        kappa, omega, two_minus_omega = ctx.saved_tensors
        derivative = _cosine_kappa_derivative(kappa, omega, two_minus_omega, ctx.dim)
        return grad * derivative, None, None, None
