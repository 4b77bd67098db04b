"""``rpm.data.synthetic.conditionals``: the conditional laws on each space against scipy,
closed-form moments and a numpy construction.

Monte Carlo tolerances: moments to 5 standard errors, distributions by a Kolmogorov-Smirnov
test at level 1e-3; every draw is seeded, so the tests are deterministic."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from rpm.data.synthetic import (
    LatentProcess,
)
from tests.data.synthetic.helpers import ALPHA, gen, make, truncated_cdf


def test_unbounded_normal_and_laplace_moments():
    n, scale = 40000, 0.3
    z = torch.zeros(n, 3, dtype=torch.float64)
    for kind, var, mad in [("normal", scale**2, scale * math.sqrt(2 / math.pi)),
                           ("laplace", 2 * scale**2, scale)]:
        d = make("unbounded", "normal", kind, dim=3, conditional_param=scale,
                 dtype=torch.float64).sample_conditional(z, gen()) - z
        assert float(d.mean(0).abs().max()) < 5 * math.sqrt(var / n)
        # standard error of the sample variance: sqrt((mu4 - var^2) / n); mu4 = 3 var^2 (normal),
        # 6 var^2 (laplace); mean absolute deviation: sqrt((var - mad^2) / n)
        kurt = 3.0 if kind == "normal" else 6.0
        assert float((d.var(0) - var).abs().max()) < 5 * var * math.sqrt((kurt - 1) / n)
        assert float((d.abs().mean(0) - mad).abs().max()) < 5 * math.sqrt((var - mad**2) / n)


@pytest.mark.parametrize("beta", [3.0, 0.8])
def test_unbounded_gennorm_against_scipy(beta):
    z = torch.zeros(4000, 2)
    process = make("unbounded", "normal", "gennorm", dim=2, conditional_param=0.2,
                   gennorm_beta=beta)
    d = (process.sample_conditional(z, gen()) - z).numpy()
    for k in range(2):
        assert stats.kstest(d[:, k], stats.gennorm(beta, scale=0.2).cdf).pvalue > ALPHA


def test_unbounded_anisotropic_variances_are_inverse_concentrations():
    lam = torch.tensor([5.0, 5.0, 25.0, 25.0, 100.0], dtype=torch.float64)
    n = 40000
    z = torch.randn(n, 5, dtype=torch.float64)
    process = LatentProcess(dim=5, space="unbounded", marginal="normal",
                            conditional="anisotropic", concentrations=lam, dtype=torch.float64)
    d = process.sample_conditional(z, gen()) - z
    torch.testing.assert_close(d.var(0), 1 / lam, rtol=5 * math.sqrt(2 / n), atol=0)
    corr = torch.corrcoef(d.T)
    assert float((corr - torch.eye(5)).abs().max()) < 5 / math.sqrt(n)





@pytest.mark.parametrize("kind, scale, ref", [
    ("normal", 0.3, stats.norm(scale=0.3)),
    ("laplace", 0.3, stats.laplace(scale=0.3)),
    ("gennorm", 0.3, stats.gennorm(3.0, scale=0.3)),
    ("normal", 2.0, stats.norm(scale=2.0)),
    ("gennorm", 2.0, stats.gennorm(3.0, scale=2.0)),
])
def test_box_conditional_is_the_truncated_law(kind, scale, ref):
    centres = torch.tensor([0.97, -0.5, 0.0, -1.0])
    z = centres.expand(3000, 4).contiguous()
    process = make("box", "uniform", kind, conditional_param=scale)
    z_pos = process.sample_conditional(z, gen()).numpy()
    for k, c in enumerate(centres.tolist()):
        assert stats.kstest(z_pos[:, k], truncated_cdf(ref, c)).pvalue > ALPHA


def test_box_anisotropic_is_truncated_normal_per_dimension():
    lam = torch.tensor([5.0, 25.0, 1.0])
    centre = torch.tensor([0.95, -0.3, 0.5])
    process = LatentProcess(dim=3, space="box", conditional="anisotropic", concentrations=lam)
    out = process.sample_conditional(centre.expand(3000, 3).contiguous(), gen()).numpy()
    for k in range(3):
        ref = stats.norm(scale=float(lam[k]) ** -0.5)
        assert stats.kstest(out[:, k], truncated_cdf(ref, float(centre[k]))).pvalue > ALPHA


def test_sphere_additive_conditional_matches_numpy_construction():
    lam = np.array([5.0, 5.0, 25.0, 25.0])
    process = LatentProcess(dim=4, conditional="anisotropic", concentrations="5,25")
    mu = torch.tensor([[0.5, -0.5, 0.5, 0.5]]).expand(4000, 4).contiguous()
    out = process.sample_conditional(mu, gen()).numpy()
    rng = np.random.default_rng(1)
    ref = mu.numpy() + rng.normal(size=(4000, 4)) / np.sqrt(lam)
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    for k in range(4):
        assert stats.ks_2samp(out[:, k], ref[:, k]).pvalue > ALPHA
