r"""Von Mises-Fisher sampling on :math:`S^{p-1}` by Wood's (1994) rejection algorithm, vectorised
over the batch.

.. math::

    \mathrm{vMF}(x; \mu, \kappa) = C_p(\kappa)\, e^{\kappa \mu^\top x}, \qquad
    C_p(\kappa) = \frac{\kappa^{p/2-1}}{(2\pi)^{p/2} I_{p/2-1}(\kappa)}.

Write :math:`x = W \mu + \sqrt{1 - W^2}\, V` with :math:`V` uniform on the unit sphere of the
tangent space :math:`\mu^\perp`; :math:`W = \mu^\top x` has density proportional to
:math:`e^{\kappa w} (1 - w^2)^{(p-3)/2}` on :math:`[-1, 1]`. Wood's sampler for :math:`W`, with

.. math::

    b = \frac{p - 1}{2\kappa + \sqrt{4\kappa^2 + (p-1)^2}}, \quad
    x_0 = \frac{1 - b}{1 + b}, \quad c = \kappa x_0 + (p - 1)\log(1 - x_0^2),

proposes :math:`Z \sim \mathrm{Beta}(\tfrac{p-1}2, \tfrac{p-1}2)`,
:math:`W = \frac{1 - (1+b)Z}{1 - (1-b)Z}` and accepts when
:math:`\kappa W + (p-1)\log(1 - x_0 W) - c \ge \log U`, :math:`U \sim \mathcal U(0, 1)`.
The test is evaluated in the cancellation-free form

.. math::

    t = \kappa\,(1 - x_0 - \omega) + (p-1)\Big[\log\big(1 + \tfrac{x_0\, \omega}{1 - x_0}\big)
        - \log(1 + x_0)\Big], \qquad \omega = 1 - W = \frac{2bZ}{1 - (1-b)Z}.

With the Beta variate written as :math:`Z = G_1 / (G_1 + G_2)`, independent
:math:`G_i \sim \mathrm{Gamma}(\tfrac{p-1}2)`, both :math:`\omega` and :math:`2 - \omega` are
ratios of non-negative terms,

.. math::

    \omega = \frac{2 b G_1}{b G_1 + G_2}, \qquad 2 - \omega = 1 + W = \frac{2 G_2}{b G_1 + G_2},
    \qquad \sqrt{1 - W^2} = \sqrt{\omega (2 - \omega)},

so no difference of rounded numbers is formed and :math:`\omega` never leaves :math:`[0, 2]`
(computed from :math:`Z`, :math:`\omega` rounds above 2 in float32 when :math:`Z` rounds to 1,
about 7 draws in :math:`10^5` at :math:`p = 2, \kappa = 1`); large :math:`\kappa` stays accurate
in float32. The tangent direction is orthogonalised against :math:`\mu` twice (classical
Gram-Schmidt with re-orthogonalisation), so :math:`\|x\| = 1` to a few ulps even when the
Gaussian draw is nearly parallel to :math:`\mu`.

**One algorithm, two samplers.** The constants, the proposal and the acceptance threshold above
are those of :class:`rpm.distributions.VonMisesFisher` (``wood_envelope``, ``wood_proposal``,
``wood_log_accept_bound`` in ``rpm.distributions._von_mises_fisher``, their one home). The
sampler is kept apart from the distribution's ``rsample`` because a data set needs what a
reparameterised recognition sample does not: every draw from an explicit
``torch.Generator`` (the data sets are reproducible from their seed, whatever else drew from the
global generator), one concentration fixed per sampler with its exact acceptance probability
computed once, so that each call draws enough proposals at once for one host synchronisation,
and float32 draws. ``VonMisesFisher.rsample`` draws from the global generator, in float64, with
a concentration per entry and one round of proposals at a time; drawing the data through it
would change every seeded data set.

References: A. T. A. Wood, "Simulation of the von Mises Fisher distribution", Communications in
Statistics - Simulation and Computation 23(1), 1994.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy import integrate, special

from rpm._validation import check_int, check_positive
from rpm.data.synthetic.rejection import first_accepted, oversampling_factor
from rpm.data.synthetic.spaces import project_to_sphere
from rpm.distributions._von_mises_fisher import (
    wood_envelope,
    wood_log_accept_bound,
    wood_proposal,
)

__all__ = ["VonMisesFisherSampler", "sample_vmf"]


class VonMisesFisherSampler:
    r"""Wood's vMF sampler for a fixed concentration :math:`\kappa` and ambient dimension :math:`p`.

    The constants :math:`b, x_0` and the exact acceptance probability
    :math:`a = E_Z[\min(1, e^{t(Z)})]` (one-dimensional quadrature, once) are computed here in
    float64; each call draws :math:`K` proposals per sample with :math:`(1 - a)^K \le 10^{-9}`,
    so a fallback round is rare (see :func:`~rpm.data.synthetic.rejection.oversampling_factor`).

    :param float kappa: concentration :math:`\kappa > 0`.
    :param int dim: ambient dimension :math:`p \ge 2`.
    """

    def __init__(self, kappa: float, dim: int) -> None:
        kappa = check_positive("kappa (the vMF concentration)", kappa)
        dim = check_int("dim", dim)
        if dim < 2:
            raise ValueError(f"vMF needs an ambient dimension dim >= 2, got {dim}")
        self.kappa = float(kappa)
        self.dim = dim
        self._b, self._x0, self._one_minus_x0 = wood_envelope(self.kappa, dim)
        self.acceptance = self._acceptance_probability()
        self.oversample = oversampling_factor(self.acceptance)

    def _log_accept_bound(self, omega: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
        """The acceptance threshold t(omega) of the module docstring (torch or numpy)."""
        return wood_log_accept_bound(omega, self.kappa, self.dim, self._x0, self._one_minus_x0)

    def _omega(self, z: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
        """omega = 1 - W as a function of the Beta proposal Z (float64 quadrature and tests)."""
        return 2.0 * self._b * z / (1.0 - (1.0 - self._b) * z)

    def _omega_pair(self, g1: torch.Tensor, g2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(omega, 2 - omega) from the two Gamma variates of Z = g1 / (g1 + g2), free of
        cancellation (module docstring)."""
        return wood_proposal(self._b, g1, g2)

    def _acceptance_probability(self) -> float:
        half = (self.dim - 1) / 2.0
        log_norm = special.betaln(half, half)

        def integrand(z: float) -> float:               # Beta(half, half) density * min(1, e^t)
            t = self._log_accept_bound(self._omega(np.float64(z)))
            log_pdf = (half - 1.0) * (math.log(z) + math.log1p(-z)) - log_norm
            return math.exp(log_pdf + min(float(t), 0.0))

        value, _ = integrate.quad(integrand, 0.0, 1.0, limit=200, points=[0.5])
        return min(max(value, 1e-6), 1.0)

    def _sample_omega(self, batch_size: int, generator: torch.Generator | None,
                      device: torch.device | str, dtype: torch.dtype
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """Accepted (omega, 2 - omega), each of shape (B,)."""
        kw = {"device": device, "dtype": dtype}
        shape = (self.oversample, batch_size)
        conc = torch.full((2, *shape), (self.dim - 1) / 2.0, **kw)
        out = torch.zeros(2, batch_size, **kw)
        done = torch.zeros(batch_size, device=device, dtype=torch.bool)
        for _ in range(1000):
            g = torch._standard_gamma(conc, generator=generator)                 # (2, K, B)
            omega, two_minus_omega = self._omega_pair(g[0], g[1])                # (K, B) each
            log_u = torch.rand(shape, generator=generator, **kw).log()
            ok = log_u <= self._log_accept_bound(omega)                          # (K, B)
            candidate, found = first_accepted(torch.stack([omega, two_minus_omega], 1),
                                              ok.unsqueeze(1).expand(-1, 2, -1))  # (2, B)
            out = torch.where(found & ~done, candidate, out)
            done = done | found[0]
            if bool(done.all()):        # the single host synchronisation per call
                return out[0], out[1]
        raise RuntimeError("vMF rejection sampling did not finish in 1000 rounds")

    def sample_cosine(self, batch_size: int, *, generator: torch.Generator | None = None,
                      device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
                      ) -> torch.Tensor:
        r"""Sample :math:`\omega = 1 - W = 1 - \mu^\top x` (returned in this form for accuracy).

        :param int batch_size: number of samples :math:`B`.
        :param generator: optional random generator on ``device``.
        :type generator: torch.Generator or None
        :param device: device of the samples.
        :type device: torch.device or str
        :param torch.dtype dtype: floating dtype.
        :returns: :math:`1 - W \in [0, 2]`. Shape: ``(B,)``.
        :rtype: torch.Tensor
        """
        return self._sample_omega(batch_size, generator, device, dtype)[0]

    def sample(self, mu: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        r"""One sample :math:`x_i \sim \mathrm{vMF}(\mu_i, \kappa)` per row of ``mu``:
        :math:`x = (1 - \omega)\, \mu + \sqrt{\omega (2 - \omega)}\, V`.

        :param torch.Tensor mu: unit mean directions (not re-normalised here).
            Shape: ``(B, p)``.
        :param generator: optional random generator on the device of ``mu``.
        :type generator: torch.Generator or None
        :returns: unit vectors. Shape: ``(B, p)``.
        :rtype: torch.Tensor
        """
        if mu.ndim != 2 or mu.shape[1] != self.dim:
            raise ValueError(f"mu must have shape (B, {self.dim}), got {tuple(mu.shape)}")
        if not mu.is_floating_point():
            raise TypeError(f"mu must be a floating tensor, got dtype {mu.dtype}")
        omega, two_minus_omega = self._sample_omega(mu.shape[0], generator, mu.device, mu.dtype)
        v = torch.randn(mu.shape, generator=generator, dtype=mu.dtype, device=mu.device)
        for _ in range(2):              # Gram-Schmidt twice: orthogonal to working precision
            v = v - (v * mu).sum(-1, keepdim=True) * mu
        v = project_to_sphere(v)                                           # uniform in mu-perp
        sine = torch.sqrt(omega * two_minus_omega).unsqueeze(1)            # sqrt(1 - W^2) >= 0
        return (1.0 - omega).unsqueeze(1) * mu + sine * v


def sample_vmf(mu: torch.Tensor, kappa: float,
               generator: torch.Generator | None = None) -> torch.Tensor:
    r"""Sample :math:`x_i \sim \mathrm{vMF}(\mu_i, \kappa)`; a convenience wrapper around
    :class:`VonMisesFisherSampler` (which caches the constants; prefer it inside loops).

    :param torch.Tensor mu: unit mean directions. Shape: ``(B, p)``.
    :param float kappa: concentration :math:`\kappa > 0`.
    :param generator: optional random generator on the device of ``mu``.
    :type generator: torch.Generator or None
    :returns: unit vectors. Shape: ``(B, p)``.
    :rtype: torch.Tensor
    """
    if mu.ndim != 2:
        raise ValueError(f"mu must have shape (B, p), got {tuple(mu.shape)}")
    return VonMisesFisherSampler(kappa, mu.shape[1]).sample(mu, generator)
