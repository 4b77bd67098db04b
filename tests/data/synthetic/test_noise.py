"""``rpm.data.synthetic.noise.FactorisedNoise``: its draws, interval probabilities and exact
interval sampling against scipy's laws (``gennorm(beta, scale=alpha)``, ``laplace(scale=b)``,
``norm(scale=s)``).

Monte Carlo tolerances: distributions by a Kolmogorov-Smirnov test at level 1e-3; every draw is
seeded, so the tests are deterministic."""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from rpm.data.synthetic.noise import FactorisedNoise
from tests.data.synthetic.helpers import ALPHA, gen

SCALES = [0.5, 2.0]
KINDS = [("normal", None), ("laplace", None), ("gennorm", 3.0), ("gennorm", 0.8)]


def _scipy_law(kind, beta, scale):
    if kind == "normal":
        return stats.norm(scale=scale)
    if kind == "laplace":
        return stats.laplace(scale=scale)
    return stats.gennorm(beta, scale=scale)


@pytest.mark.parametrize("kind, beta", KINDS)
def test_samples_follow_the_scaled_law_in_each_coordinate(kind, beta):
    noise = FactorisedNoise(kind, torch.tensor(SCALES), beta, dtype=torch.float64)
    eps = noise.sample((4000, 2), gen(3)).numpy()
    for d, scale in enumerate(SCALES):
        assert stats.kstest(eps[:, d], _scipy_law(kind, beta, scale).cdf).pvalue > ALPHA


@pytest.mark.parametrize("kind, beta", KINDS)
def test_prob_in_matches_the_scipy_cdf(kind, beta):
    noise = FactorisedNoise(kind, torch.tensor(SCALES), beta)
    for low, high in [(-1.0, 1.0), (-0.2, 3.0), (0.5, 0.7), (-4.0, -0.1)]:
        expected = [_scipy_law(kind, beta, s).cdf(high) - _scipy_law(kind, beta, s).cdf(low)
                    for s in SCALES]
        torch.testing.assert_close(noise.prob_in(low, high),
                                   torch.tensor(expected, dtype=torch.float64),
                                   rtol=1e-10, atol=1e-12)
    isotropic = FactorisedNoise(kind, 0.5, beta).prob_in(-1.0, 1.0)
    assert isotropic.shape == (1,)


@pytest.mark.parametrize("kind", ["normal", "laplace"])
def test_sample_interval_is_the_law_truncated_to_the_interval(kind):
    """Exact inversion, also deep in a tail (the interval [-0.05, 6] of a scale-0.5 law) and
    for an interval on one side of 0 only in effect (low = -1e-3)."""
    intervals = [(-0.05, 6.0), (-1.0, 1.0), (-1e-3, 2.0)]
    low = torch.tensor([lo for lo, _ in intervals], dtype=torch.float64).expand(4000, 3)
    high = torch.tensor([hi for _, hi in intervals], dtype=torch.float64).expand(4000, 3)
    noise = FactorisedNoise(kind, 0.5, dtype=torch.float64)
    eps = noise.sample_interval(low, high, gen(4)).numpy()
    ref = _scipy_law(kind, None, 0.5)
    for d, (lo, hi) in enumerate(intervals):
        assert eps[:, d].min() >= lo - 1e-12 and eps[:, d].max() <= hi + 1e-12
        mass = ref.cdf(hi) - ref.cdf(lo)

        def truncated(x, lo=lo, mass=mass):
            return (ref.cdf(x) - ref.cdf(lo)) / mass

        assert stats.kstest(eps[:, d], truncated).pvalue > ALPHA


@pytest.mark.parametrize("kwargs, match", [
    ({"kind": "cauchy", "scale": 1.0}, "noise kind must be one of"),
    ({"kind": "gennorm", "scale": 1.0}, "beta must be given exactly for 'gennorm'"),
    ({"kind": "normal", "scale": 1.0, "beta": 2.0}, "beta must be given exactly for 'gennorm'"),
    ({"kind": "gennorm", "scale": 1.0, "beta": 0.0}, r"gennorm beta must be > 0.0, got 0.0"),
    ({"kind": "normal", "scale": 0.0}, r"noise scale must be > 0.0, got 0.0"),
    ({"kind": "normal", "scale": float("inf")}, "noise scale must be a finite number, got inf"),
    ({"kind": "normal", "scale": torch.tensor([1.0, -1.0])}, "finite and positive"),
    ({"kind": "normal", "scale": torch.ones(2, 2)}, "1-D"),
])
def test_bad_configurations_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FactorisedNoise(**kwargs)


def test_a_scale_that_is_not_a_number_is_a_type_error():
    with pytest.raises(TypeError, match="noise scale must be a number, got str '1'"):
        FactorisedNoise("normal", "1")


def test_sample_interval_needs_an_invertible_kind():
    noise = FactorisedNoise("gennorm", 1.0, 2.0)
    assert not noise.has_interval_inverse
    with pytest.raises(ValueError, match="truncate 'gennorm' noise by rejection"):
        noise.sample_interval(-torch.ones(3), torch.ones(3))
