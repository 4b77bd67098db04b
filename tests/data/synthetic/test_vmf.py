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
from scipy import integrate, special, stats

from rpm.data.synthetic import VonMisesFisherSampler, sample_vmf

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


@pytest.mark.slow
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


# ------------------------------------------------------------------ sample_vmf and the Wood sampler


@pytest.mark.parametrize("p, kappa", [(2, 3.0), (3, 1.0), (10, 1.0), (10, 50.0), (5, 1000.0)])
def test_vmf_mean_resultant_length(p, kappa):
    # E[mu^T x] = A_p(kappa) = I_{p/2}(kappa) / I_{p/2-1}(kappa)
    n = 60000
    mu = torch.nn.functional.normalize(torch.randn(n, p, generator=gen(5),
                                                   dtype=torch.float64), dim=1)
    x = sample_vmf(mu, kappa, gen())
    torch.testing.assert_close(x.norm(dim=1), torch.ones(n, dtype=torch.float64))
    w = (mu * x).sum(1)
    expected = special.ive(p / 2, kappa) / special.ive(p / 2 - 1, kappa)
    assert abs(float(w.mean()) - expected) < 5 * float(w.std()) / math.sqrt(n)


@pytest.mark.parametrize("p, kappa", [(10, 1.0), (4, 20.0)])
def test_vmf_against_scipy(p, kappa):
    mu = np.zeros(p)
    mu[1] = 1.0
    ref = stats.vonmises_fisher(mu, kappa).rvs(4000, random_state=np.random.default_rng(0))
    x = sample_vmf(torch.tensor(mu).expand(4000, p).contiguous(), kappa, gen()).numpy()
    assert stats.ks_2samp(x @ mu, ref @ mu).pvalue > ALPHA
    assert stats.ks_2samp(x[:, 0], ref[:, 0]).pvalue > ALPHA   # a tangent coordinate


def test_vmf_tangent_part_is_isotropic():
    p, kappa, n = 4, 5.0, 40000
    mu = torch.tensor([0.0, 0.6, 0.0, 0.8], dtype=torch.float64)
    x = sample_vmf(mu.expand(n, p).contiguous(), kappa, gen())
    w = x @ mu
    t = x - w[:, None] * mu                                     # tangent part
    cov = t.T @ t / n
    expected = (1 - float((w**2).mean())) / (p - 1) * (torch.eye(p, dtype=torch.float64)
                                                        - torch.outer(mu, mu))
    assert float(t.mean(0).abs().max()) < 5 / math.sqrt(n)
    assert float((cov - expected).abs().max()) < 5 / math.sqrt(n)


@pytest.mark.parametrize("p, kappa", [(2, 3.0), (3, 10.0), (10, 1.0), (10, 50.0), (5, 1000.0)])
def test_wood_proposal_and_acceptance_give_the_vmf_cosine_law(p, kappa):
    # Deterministic check of Wood's constants: the accepted proposals have density
    # Beta(z) e^{t(z)} / a, so E[W] = int Beta(z) e^t (1 - omega(z)) dz / a = A_p(kappa).
    sampler = VonMisesFisherSampler(kappa, p)
    half = (p - 1) / 2

    def weight(z):
        return stats.beta.pdf(z, half, half) * math.exp(sampler._log_accept_bound(
            sampler._omega(np.float64(z))))

    accept = integrate.quad(weight, 0, 1, limit=200)[0]
    mean_w = integrate.quad(lambda z: weight(z) * (1 - sampler._omega(np.float64(z))), 0, 1,
                            limit=200)[0] / accept
    expected = special.ive(p / 2, kappa) / special.ive(p / 2 - 1, kappa)
    assert abs(mean_w - expected) < 1e-6
    assert abs(accept - sampler.acceptance) < 1e-6


def test_vmf_acceptance_probability_matches_monte_carlo():
    for p, kappa in [(3, 10.0), (10, 100.0)]:
        sampler = VonMisesFisherSampler(kappa, p)
        z = torch.distributions.Beta((p - 1) / 2, (p - 1) / 2).sample((200000,)).double()
        t = sampler._log_accept_bound(sampler._omega(z))
        assert float(t.max()) <= 1e-9                      # Wood's bound: t <= 0
        assert abs(float(t.exp().mean()) - sampler.acceptance) < 0.01
