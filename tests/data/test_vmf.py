"""Numerical robustness and goodness of fit of the von Mises-Fisher sampler.

Independent references: the mean cosine :math:`E[\\mu^\\top x] = A_p(\\kappa) =
I_{p/2}(\\kappa) / I_{p/2-1}(\\kappa)` (scipy.special.ive; mpmath where ive underflows at large
p), scipy's von Mises law of the angle on the circle, and the closed-form cosine CDF on
:math:`S^2`, :math:`F(w) = \\mathrm{expm1}(\\kappa (w + 1)) / \\mathrm{expm1}(2 \\kappa)`.
Monte Carlo tolerances: means to 5 standard errors, distributions by a Kolmogorov-Smirnov test
at level 1e-3; every draw is seeded.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch
from scipy import special, stats

from rpm.data.synthetic import VonMisesFisherSampler

ALPHA = 1e-3


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def mean_cosine(p: int, kappa: float) -> float:
    """A_p(kappa) = I_{p/2}(kappa) / I_{p/2-1}(kappa)."""
    num, den = special.ive(p / 2, kappa), special.ive(p / 2 - 1, kappa)
    if num > 0 and den > 0:
        return num / den
    return float(mpmath.besseli(p / 2, kappa) / mpmath.besseli(p / 2 - 1, kappa))


def unit_means(n: int, p: int, dtype: torch.dtype, seed: int = 1) -> torch.Tensor:
    return torch.nn.functional.normalize(torch.randn(n, p, generator=gen(seed), dtype=dtype), dim=1)


def test_circle_float32_million_draws_are_finite_unit_and_von_mises():
    n, kappa = 10**6, 1.0
    mu = unit_means(n, 2, torch.float32)
    x = VonMisesFisherSampler(kappa, 2).sample(mu, gen())
    assert x.dtype == torch.float32
    assert bool(torch.isfinite(x).all())
    assert float((torch.linalg.vector_norm(x, dim=1) - 1).abs().max()) <= 1e-5
    # the angle of x from mu is von Mises(0, kappa) on the circle
    xd, mud = x.double(), mu.double()
    perp = torch.stack([-mud[:, 1], mud[:, 0]], 1)
    w = (xd * mud).sum(1)
    angle = torch.atan2((xd * perp).sum(1), w).numpy()
    assert stats.kstest(angle, stats.vonmises(kappa).cdf).pvalue > ALPHA
    assert abs(float(w.mean()) - mean_cosine(2, kappa)) < 5 * float(w.std()) / math.sqrt(n)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kappa", [1e-3, 0.1, 1.0, 30.0, 1e4])
@pytest.mark.parametrize("p", [2, 3, 5, 64, 1000])
def test_grid_is_finite_on_the_sphere_with_the_right_mean_cosine(p, kappa, dtype):
    n = 2000 if p == 1000 else 8000
    mu = unit_means(n, p, dtype)
    sampler = VonMisesFisherSampler(kappa, p)
    x = sampler.sample(mu, gen())
    assert x.dtype == dtype
    assert bool(torch.isfinite(x).all())
    norm_tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert float((torch.linalg.vector_norm(x, dim=1) - 1).abs().max()) <= norm_tol
    omega = sampler.sample_cosine(n, generator=gen(2), dtype=dtype)
    assert float(omega.min()) >= 0.0 and float(omega.max()) <= 2.0
    w = (x.double() * mu.double()).sum(1)
    assert abs(float(w.mean()) - mean_cosine(p, kappa)) < 5 * float(w.std()) / math.sqrt(n)


@pytest.mark.parametrize("kappa", [0.5, 30.0])
def test_sphere_cosine_matches_its_closed_form_cdf_in_float32(kappa):
    n = 100000
    mu = unit_means(n, 3, torch.float32)
    x = VonMisesFisherSampler(kappa, 3).sample(mu, gen())
    w = (x.double() * mu.double()).sum(1).clamp(-1, 1).numpy()

    def cdf(t):
        return np.expm1(kappa * (t + 1)) / np.expm1(2 * kappa)

    assert stats.kstest(w, cdf).pvalue > ALPHA


def test_sample_rejects_wrong_inputs():
    sampler = VonMisesFisherSampler(1.0, 3)
    with pytest.raises(ValueError, match=r"shape \(B, 3\)"):
        sampler.sample(torch.ones(4, 2))
    with pytest.raises(TypeError, match="floating"):
        sampler.sample(torch.ones(4, 3, dtype=torch.long))
