r"""The logarithm of the exponentially scaled modified Bessel function of the first kind of any
real order :math:`\nu \ge 0`, :math:`\log \operatorname{ive}_\nu(x) = \log I_\nu(x) - x`, and
the ratio :math:`I_{\nu+1}(x) / I_\nu(x)`, differentiable in :math:`x > 0` (torch has
``i0e`` and ``i1e`` only, orders 0 and 1). They give the normaliser of the von Mises-Fisher
distribution, :math:`\log C_D(\kappa)` with :math:`\nu = D/2 - 1`, and its mean resultant length
:math:`A_D(\kappa) = I_{D/2}(\kappa) / I_{D/2-1}(\kappa)`.

Computed in float64 whatever the input's dtype (the result is cast back), from three
expansions, each used where it is accurate to a few ulps of :math:`\log I_\nu(x)`:

* :math:`\nu < 15,\ x \le 30`: the power series (DLMF 10.25.2),

  .. math::

      I_\nu(x) = \Big(\frac x2\Big)^\nu \sum_{k \ge 0} \frac{(x^2/4)^k}{k!\,\Gamma(k + \nu + 1)},

  with 64 terms (its largest term is near :math:`k = x/2`), summed in float64 without
  logarithms (for these :math:`x` the sum lies in :math:`[1, 10^{12}]`).
* :math:`\nu < 15,\ x > 30`: Hankel's large-argument expansion (DLMF 10.40.1), 40 terms,

  .. math::

      I_\nu(x) \sim \frac{e^x}{\sqrt{2\pi x}} \sum_{k \ge 0} (-1)^k
          \frac{\prod_{j=1}^{k} \big(4\nu^2 - (2j-1)^2\big)}{k!\, (8x)^k}.

* :math:`\nu \ge 15`, any :math:`x`: Debye's uniform expansion in the order (DLMF 10.41.3),
  with :math:`z = x/\nu`, :math:`t = 1/\sqrt{1+z^2}`,
  :math:`\eta = \sqrt{1+z^2} + \log\frac{z}{1 + \sqrt{1+z^2}}`,

  .. math::

      I_\nu(\nu z) \sim \frac{e^{\nu\eta}}{\sqrt{2\pi\nu}\,(1+z^2)^{1/4}}
          \sum_{k=0}^{15} \frac{u_k(t)}{\nu^k},

  the polynomials :math:`u_k` built exactly (rational coefficients) at import from
  DLMF 10.41.9, :math:`u_{k+1}(t) = \tfrac12 t^2 (1-t^2) u_k'(t) + \tfrac18 \int_0^t (1 - 5s^2)
  u_k(s)\, ds`. The first omitted term is below :math:`\max_t |u_{16}(t)| / 15^{16} < 10^{-15}`.
  The exponent is written as :math:`\nu\eta - x = \nu / (\sqrt{1+z^2} + z) + \nu \log(z / (1 +
  \sqrt{1+z^2}))`, free of the cancellation of two numbers of size :math:`x`.

The derivative is :math:`\frac{d}{dx} \log I_\nu(x) = I_{\nu+1}(x)/I_\nu(x) + \nu/x`
(DLMF 10.29.2), the ratio taken as :math:`\exp(\log\operatorname{ive}_{\nu+1} -
\log\operatorname{ive}_\nu)` of this same function, so every order of derivative is available
(the backward pass is itself differentiable).
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch

__all__ = ["bessel_iv_ratio", "log_bessel_ive"]

#: Orders at and above this use Debye's expansion; below it the series or Hankel's.
DEBYE_MIN_ORDER = 15.0
#: Below this order, arguments up to this use the power series and above it Hankel's expansion.
SERIES_MAX_ARGUMENT = 30.0
_SERIES_TERMS = 64
_HANKEL_TERMS = 40
_DEBYE_TERMS = 16  # u_0 ... u_15


def _debye_polynomials(count: int) -> list[list[float]]:
    """Coefficients (of :math:`t^0, t^1, \\dots`) of :math:`u_0, \\dots, u_{count-1}`, from
    DLMF 10.41.9 in exact rational arithmetic, rounded once to float64."""
    polynomials = [[Fraction(1)]]
    for _ in range(count - 1):
        u = polynomials[-1]
        new = [Fraction(0)] * (len(u) + 3)
        for i, c in enumerate(u):
            new[i + 1] += Fraction(i, 2) * c          # 1/2 t^2 (1 - t^2) d/dt (c t^i)
            new[i + 3] -= Fraction(i, 2) * c
            new[i + 1] += c / (8 * (i + 1))           # 1/8 int_0^t (1 - 5 s^2) c s^i ds
            new[i + 3] -= 5 * c / (8 * (i + 3))
        polynomials.append(new)
    return [[float(c) for c in p] for p in polynomials]


_DEBYE_U = _debye_polynomials(_DEBYE_TERMS)


def _log_ive_series(order: float, x: torch.Tensor) -> torch.Tensor:
    # sum_k (x^2/4)^k / (k! (nu+1)_k) by its term ratio, in linear space: for x <= 30 the sum
    # lies in [1, I_0(30)] (about 8e11), so no term overflows or underflows to matter
    quarter_square = x * x / 4
    term = torch.ones_like(x)
    total = torch.ones_like(x)
    for k in range(1, _SERIES_TERMS):
        term = term * quarter_square / (k * (k + order))
        total = total + term
    return order * torch.log(x / 2) - math.lgamma(order + 1) - x + torch.log(total)


def _log_ive_hankel(order: float, x: torch.Tensor) -> torch.Tensor:
    four_order_squared = 4.0 * order * order
    term = torch.ones_like(x)
    total = torch.ones_like(x)
    for k in range(1, _HANKEL_TERMS):
        term = term * (-(four_order_squared - (2 * k - 1) ** 2) / (8.0 * k)) / x
        total = total + term
    return -0.5 * torch.log(2 * math.pi * x) + torch.log(total)


def _log_ive_debye(order: float, x: torch.Tensor) -> torch.Tensor:
    z = x / order
    root = torch.sqrt(1 + z * z)                                            # sqrt(1 + z^2)
    t = root.reciprocal()
    exponent = order / (root + z) + order * torch.log(z / (1 + root))       # nu * eta - x
    total = torch.zeros_like(x)
    for k in reversed(range(_DEBYE_TERMS)):                                 # sum u_k(t) / nu^k
        u = torch.zeros_like(x)
        for c in reversed(_DEBYE_U[k]):
            u = u * t + c
        total = total / order + u
    return exponent - 0.5 * math.log(2 * math.pi * order) + 0.5 * torch.log(t) + torch.log(total)


def _log_ive_value(order: float, x: torch.Tensor) -> torch.Tensor:
    if order >= DEBYE_MIN_ORDER:
        return _log_ive_debye(order, x)
    small = x <= SERIES_MAX_ARGUMENT
    # each expansion is evaluated at an argument inside its own range (the other entries get a
    # stand-in), so no discarded branch produces an overflow or a NaN
    series = _log_ive_series(order, torch.where(small, x, 1.0))
    hankel = _log_ive_hankel(order, torch.where(small, 2 * SERIES_MAX_ARGUMENT, x))
    return torch.where(small, series, hankel)


class _LogIve(torch.autograd.Function):
    """:math:`\\log\\operatorname{ive}_\\nu(x)` in float64; backward :math:`I_{\\nu+1}/I_\\nu +
    \\nu/x - 1`, written with this function again (so it is differentiable in turn)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, order: float) -> torch.Tensor:
        ctx.order = order
        ctx.save_for_backward(x)
        return _log_ive_value(order, x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (x,) = ctx.saved_tensors
        ratio = torch.exp(_LogIve.apply(x, ctx.order + 1) - _LogIve.apply(x, ctx.order))
        return grad * (ratio + ctx.order / x - 1), None


def _check(order: float, x: torch.Tensor) -> None:
    if not order >= 0:
        raise ValueError(f"the Bessel order must be >= 0, got {order!r}")
    if not x.is_floating_point():
        raise TypeError(f"the Bessel argument must be a floating tensor, got dtype {x.dtype}")


def log_bessel_ive(order: float, x: torch.Tensor) -> torch.Tensor:
    r""":math:`\log I_\nu(x) - x` for :math:`x > 0`, elementwise (module docstring), computed
    in float64 and returned in the dtype of ``x``; differentiable in ``x`` to any order.

    :param float order: :math:`\nu \ge 0`.
    :param torch.Tensor x: arguments :math:`x > 0`. Shape: any.
    :returns: :math:`\log\operatorname{ive}_\nu(x)`. Shape: as ``x``.
    """
    _check(order, x)
    return _LogIve.apply(x.to(torch.float64), float(order)).to(x.dtype)


def bessel_iv_ratio(order: float, x: torch.Tensor) -> torch.Tensor:
    r""":math:`I_{\nu+1}(x) / I_\nu(x) \in (0, 1)` for :math:`x > 0`, elementwise, computed in
    float64 as :math:`\exp(\log\operatorname{ive}_{\nu+1}(x) - \log\operatorname{ive}_\nu(x))`
    and returned in the dtype of ``x``; differentiable in ``x``. For :math:`\nu = D/2 - 1` it is
    the mean resultant length :math:`A_D(x)` of the von Mises-Fisher distribution on
    :math:`S^{D-1}`.

    :param float order: :math:`\nu \ge 0`.
    :param torch.Tensor x: arguments :math:`x > 0`. Shape: any.
    :returns: the ratio. Shape: as ``x``.
    """
    _check(order, x)
    x64 = x.to(torch.float64)
    order = float(order)
    return torch.exp(_LogIve.apply(x64, order + 1) - _LogIve.apply(x64, order)).to(x.dtype)
