r"""Factorised, zero-centred, symmetric noise: the building block of every non-vMF marginal and
conditional of the synthetic identifiability data.

Every coordinate is an independent scaled copy of a standard one-dimensional law,

.. math::

    \epsilon_d = s_d\, \xi_d, \qquad
    \xi_d \sim \begin{cases}
        \mathcal N(0, 1) & \text{normal:}\ p(\xi) = e^{-\xi^2/2} / \sqrt{2\pi} \\
        \mathrm{Laplace}(0, 1) & \text{laplace:}\ p(\xi) = e^{-|\xi|} / 2 \\
        \mathrm{GenNorm}(\beta) & \text{gennorm:}\ p(\xi) = \beta e^{-|\xi|^\beta} / (2\Gamma(1/\beta))
    \end{cases}

so :math:`s` is the standard deviation of a normal, the scale :math:`b` of a Laplace
(variance :math:`2b^2`) and the scale :math:`\alpha` of a generalised normal (the
parameterisation of ``scipy.stats.gennorm(beta, scale=alpha)``; :math:`\beta=2` is a normal with
standard deviation :math:`\alpha/\sqrt2`, :math:`\beta=1` a Laplace).

``torch.distributions`` samplers take no ``torch.Generator``, so the base draws use the generator
directly, with the same transforms: ``torch.randn`` (normal); :math:`\xi = -\mathrm{sign}(u)
\log(1 - |u|)`, :math:`u \sim \mathcal U(\varepsilon - 1, 1)` (Laplace, as
``torch.distributions.Laplace.rsample``); and for the generalised normal
:math:`|\xi|^\beta \sim \mathrm{Gamma}(1/\beta, 1)` with a random sign, the Gamma drawn by
``torch._standard_gamma``, the kernel behind ``torch.distributions.Gamma``.

Noise restricted to an interval :math:`[l, h] \ni 0` (truncation to the box) is sampled exactly by
inversion for the normal and the Laplace: choose the side of 0 with probability proportional to
its mass, then solve :math:`G(|\xi|) = r`, :math:`r \sim \mathcal U[0, G(\text{bound}))`, with
the half-CDF :math:`G(y) = P(0 \le \xi \le y)`,

.. math::

    G^{-1}_{\text{normal}}(r) = -\Phi^{-1}(\tfrac12 - r), \qquad
    G^{-1}_{\text{Laplace}}(r) = -\log(1 - 2r),

in float64 (``torch.special.ndtr``/``ndtri``, accurate in the tails): one uniform per
coordinate, no rejection, no host synchronisation. The generalised normal has no inverse
incomplete gamma function in torch; it is truncated by rejection
(:class:`~rpm.data.synthetic.spaces.BoxTruncation`).
"""

from __future__ import annotations

import math

import torch
from torch.distributions import Laplace, Normal

from rpm._validation import check_positive

__all__ = ["NOISE_KINDS", "FactorisedNoise"]

NOISE_KINDS = ("normal", "laplace", "gennorm")


class FactorisedNoise:
    r"""Independent symmetric noise :math:`\epsilon_d = s_d \xi_d` (see the module docstring).

    :param str kind: ``"normal"``, ``"laplace"`` or ``"gennorm"``.
    :param scale: a positive float (isotropic) or a positive tensor of shape ``(dim,)``
        (one scale per coordinate; moved to ``device`` and ``dtype`` once, here).
    :type scale: float or torch.Tensor
    :param beta: shape :math:`\beta > 0` of the generalised normal; must be None otherwise.
    :type beta: float or None
    :param device: device of the samples.
    :type device: torch.device or str
    :param torch.dtype dtype: floating dtype of the samples.
    """

    def __init__(
        self,
        kind: str,
        scale: float | torch.Tensor,
        beta: float | None = None,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if kind not in NOISE_KINDS:
            raise ValueError(f"noise kind must be one of {NOISE_KINDS}, got {kind!r}")
        if (kind == "gennorm") != (beta is not None):
            raise ValueError(f"beta must be given exactly for 'gennorm' noise; got kind={kind!r}, "
                             f"beta={beta!r}")
        if beta is not None:
            beta = check_positive("gennorm beta", beta)
        if isinstance(scale, torch.Tensor):
            if scale.ndim != 1 or not bool(torch.isfinite(scale).all() and (scale > 0).all()):
                raise ValueError("a tensor scale must be 1-D, finite and positive; got "
                                 f"shape {tuple(scale.shape)}")
            self._scale_float64 = scale.detach().to("cpu", torch.float64)
            self.scale: float | torch.Tensor = scale.detach().to(device, dtype)
            self._scale_device64: float | torch.Tensor = scale.detach().to(device, torch.float64)
        else:
            scale = check_positive("noise scale", scale)
            self._scale_float64 = torch.tensor([float(scale)], dtype=torch.float64)
            self.scale = float(scale)
            self._scale_device64 = float(scale)
        self.kind = kind
        self.beta = beta
        self.device = torch.device(device)
        self.dtype = dtype

    def sample_standard(self, shape: tuple[int, ...],
                        generator: torch.Generator | None = None) -> torch.Tensor:
        r"""Draw the unit-scale noise :math:`\xi` (i.i.d. in every entry).

        :param tuple shape: output shape.
        :param generator: optional random generator on ``device``.
        :type generator: torch.Generator or None
        :returns: :math:`\xi`. Shape: ``shape``.
        :rtype: torch.Tensor
        """
        kw = {"device": self.device, "dtype": self.dtype}
        if self.kind == "normal":
            return torch.randn(shape, generator=generator, **kw)
        if self.kind == "laplace":
            eps = torch.finfo(self.dtype).eps
            u = torch.empty(shape, **kw).uniform_(eps - 1.0, 1.0, generator=generator)
            return -u.sign() * torch.log1p(-u.abs())
        beta = self.beta
        assert beta is not None
        g = torch._standard_gamma(torch.full(shape, 1.0 / beta, **kw), generator=generator)
        magnitude = g.pow(1.0 / beta)                                 # |xi|^beta ~ Gamma(1/beta)
        negative = torch.rand(shape, generator=generator, **kw) < 0.5
        return torch.where(negative, -magnitude, magnitude)

    def sample(self, shape: tuple[int, ...], generator: torch.Generator | None = None
               ) -> torch.Tensor:
        r"""Draw :math:`\epsilon = s \xi`; a tensor scale broadcasts on the last axis.

        :param tuple shape: output shape, e.g. ``(B, dim)`` or ``(K, B, dim)``.
        :param generator: optional random generator on ``device``.
        :type generator: torch.Generator or None
        :returns: noise. Shape: ``shape``.
        :rtype: torch.Tensor
        """
        return self.sample_standard(shape, generator) * self.scale

    def prob_in(self, low: float, high: float) -> torch.Tensor:
        r"""Probability :math:`P(\mathrm{low} \le \epsilon_d \le \mathrm{high})` per coordinate, in
        float64 on the CPU (used once, at construction, to size rejection samplers).

        For the generalised normal :math:`P(0 \le \xi \le x) = \tfrac12 P(1/\beta, x^\beta)` with
        :math:`P` the regularised lower incomplete gamma function.

        :param float low: lower end.
        :param float high: upper end (``high >= low``).
        :returns: probabilities. Shape: ``(dim,)`` or ``(1,)`` for an isotropic scale.
        :rtype: torch.Tensor
        """
        s = self._scale_float64
        if self.kind == "normal":
            d = Normal(torch.zeros_like(s), s)
            return d.cdf(torch.full_like(s, high)) - d.cdf(torch.full_like(s, low))
        if self.kind == "laplace":
            d = Laplace(torch.zeros_like(s), s)
            return d.cdf(torch.full_like(s, high)) - d.cdf(torch.full_like(s, low))
        beta = self.beta
        assert beta is not None

        def cdf(x: float) -> torch.Tensor:
            half = 0.5 * torch.special.gammainc(torch.full_like(s, 1.0 / beta), (abs(x) / s) ** beta)
            return 0.5 + math.copysign(1.0, x) * half

        return cdf(high) - cdf(low)

    @property
    def has_interval_inverse(self) -> bool:
        """Whether :meth:`sample_interval` (exact inversion) is available for this kind."""
        return self.kind in ("normal", "laplace")

    def sample_interval(self, low: torch.Tensor, high: torch.Tensor,
                        generator: torch.Generator | None = None) -> torch.Tensor:
        r"""Sample :math:`\epsilon_d` conditioned on :math:`l_d \le \epsilon_d \le h_d`, exactly,
        by inversion of the half-CDFs (module docstring); normal and Laplace only.

        :param torch.Tensor low: lower ends :math:`l \le 0`. Shape: ``(..., dim)``.
        :param torch.Tensor high: upper ends :math:`h \ge 0`. Shape: as ``low``.
        :param generator: optional random generator on ``device``.
        :type generator: torch.Generator or None
        :returns: noise in :math:`[l, h]` up to rounding (callers clamp). Shape: as ``low``.
        :rtype: torch.Tensor
        """
        if not self.has_interval_inverse:
            raise ValueError(f"sample_interval needs a 'normal' or 'laplace' noise, got "
                             f"{self.kind!r}; truncate {self.kind!r} noise by rejection")
        s = self._scale_device64
        lo = (low.to(torch.float64) / s).clamp(max=0.0)                       # standardised
        hi = (high.to(torch.float64) / s).clamp(min=0.0)
        if self.kind == "normal":
            p_neg, p_pos = 0.5 - torch.special.ndtr(lo), 0.5 - torch.special.ndtr(-hi)
        else:
            p_neg, p_pos = -0.5 * torch.expm1(lo), -0.5 * torch.expm1(-hi)
        t = torch.rand(lo.shape, generator=generator, device=lo.device, dtype=torch.float64)
        t = t * (p_neg + p_pos)
        negative = t < p_neg
        r = torch.where(negative, t, t - p_neg)                 # r = G(|xi|), in [0, p_side)
        if self.kind == "normal":
            magnitude = -torch.special.ndtri(0.5 - r)
        else:
            magnitude = -torch.log1p(-2.0 * r)
        xi = torch.where(negative, -magnitude, magnitude)
        return (xi * s).to(self.dtype)
