"""``rpm.data.synthetic.marginals``: the marginal laws against closed forms, scipy and a numpy
construction.

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
from tests.data.synthetic.helpers import ALPHA, gen


def test_uniform_sphere_moments():
    z = LatentProcess(dim=5).sample_marginal(40000, gen()).double()
    # E[z] = 0 and E[z z^T] = I / n; entries of z z^T have std <= 1/sqrt(N)
    assert float(z.mean(0).abs().max()) < 5 / math.sqrt(40000)
    second = z.T @ z / len(z)
    assert float((second - torch.eye(5) / 5).abs().max()) < 5 / math.sqrt(40000)


@pytest.mark.parametrize("marginal", ["normal", "laplace"])
def test_sphere_concentrated_marginal_matches_numpy_construction(marginal):
    scale = 0.5
    z = LatentProcess(dim=4, marginal=marginal, marginal_param=scale).sample_marginal(4000, gen())
    rng = np.random.default_rng(0)
    draw = rng.normal if marginal == "normal" else rng.laplace
    ref = draw(0.0, scale, size=(4000, 4)) + np.eye(4)[0]
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    assert stats.ks_2samp(z[:, 0].numpy(), ref[:, 0]).pvalue > ALPHA
    assert stats.ks_2samp(z[:, 2].numpy(), ref[:, 2]).pvalue > ALPHA


def test_box_and_unbounded_marginals_against_scipy():
    u = LatentProcess(dim=3, space="box", conditional="normal").sample_marginal(4000, gen())
    assert stats.kstest(u[:, 1].numpy(), stats.uniform(-1, 2).cdf).pvalue > ALPHA
    s = 0.7
    for marginal, ref in [("normal", stats.norm(scale=s)), ("laplace", stats.laplace(scale=s))]:
        z = LatentProcess(dim=3, space="unbounded", marginal=marginal, marginal_param=s,
                          conditional="normal").sample_marginal(4000, gen())
        assert stats.kstest(z[:, 0].numpy(), ref.cdf).pvalue > ALPHA
        zb = LatentProcess(dim=3, space="box", marginal=marginal, marginal_param=s,
                           conditional="normal").sample_marginal(4000, gen())
        mass = ref.cdf(1) - ref.cdf(-1)
        assert stats.kstest(zb[:, 2].numpy(),
                            lambda x, r=ref, m=mass: (r.cdf(x) - r.cdf(-1)) / m).pvalue > ALPHA
