"""``rpm.data.synthetic.process``: parsing the concentrations, the support, dtype and
determinism of ``LatentProcess`` samples, and its argument checks.

Monte Carlo tolerances: moments to 5 standard errors, distributions by a Kolmogorov-Smirnov
test at level 1e-3; every draw is seeded, so the tests are deterministic."""

from __future__ import annotations

import pytest
import torch

from rpm.data.synthetic import (
    LatentProcess,
    parse_concentrations,
)
from tests.data.synthetic.helpers import gen, make, valid_settings


def test_parse_concentrations_halves_and_per_dimension():
    assert parse_concentrations("5,25", 4).tolist() == [5, 5, 25, 25]
    assert parse_concentrations("5, 25", 5).tolist() == [5, 5, 25, 25, 25]
    assert parse_concentrations("1,2,3", 3).tolist() == [1, 2, 3]
    assert parse_concentrations("7", 1).tolist() == [7]
    assert parse_concentrations("5,25", 4).dtype == torch.float64


@pytest.mark.parametrize("text, dim, match", [
    ("5", 4, "need 2 values"),
    ("1,2,3", 4, "got 3"),
    ("a,b", 2, "comma-separated numbers"),
    ("", 2, "comma-separated numbers"),
    ("5,-1", 2, "finite and > 0"),
    ("5,nan", 2, "finite and > 0"),
])
def test_parse_concentrations_errors(text, dim, match):
    with pytest.raises(ValueError, match=match):
        parse_concentrations(text, dim)
    with pytest.raises(TypeError, match="string"):
        parse_concentrations([5.0, 25.0], 2)  # type: ignore[arg-type]





@pytest.mark.parametrize("space, marginal, conditional", valid_settings())
def test_samples_lie_in_the_space(space, marginal, conditional):
    wide = {} if conditional in ("vmf", "anisotropic") else {"conditional_param": 1.0}
    for extra in ({}, wide):
        process = make(space, marginal, conditional, **extra)
        z, z_pos = process.sample_pairs(3000, gen())
        for x in (z, z_pos):
            assert x.shape == (3000, 4) and x.dtype == torch.float32
            assert bool(torch.isfinite(x).all())
            if space == "sphere":
                torch.testing.assert_close(x.norm(dim=1), torch.ones(3000), atol=1e-5, rtol=0)
            if space == "box":
                assert float(x.abs().max()) <= 1.0
        assert float((z - z_pos).abs().max()) > 0


def test_dtype_and_determinism():
    for space, marginal, conditional in valid_settings():
        process = make(space, marginal, conditional, dtype=torch.float64)
        a = process.sample_pairs(500, gen(1))
        b = process.sample_pairs(500, gen(1))
        c = process.sample_pairs(500, gen(2))
        assert a[0].dtype == torch.float64 and a[1].dtype == torch.float64
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert not torch.equal(a[1], c[1])
        torch.manual_seed(3)
        d = process.sample_pairs(500)
        torch.manual_seed(3)
        e = process.sample_pairs(500)
        assert torch.equal(d[1], e[1])





@pytest.mark.parametrize("kwargs, error, match", [
    ({"space": "torus"}, ValueError, "space must be one of"),
    ({"space": "box", "conditional": "vmf"}, ValueError, "lives on the sphere"),
    ({"space": "unbounded", "marginal": "uniform", "conditional": "normal"}, ValueError,
     "not normalisable"),
    ({"marginal": "uniform", "marginal_param": 1.0}, ValueError, "takes no parameter"),
    ({"marginal": "normal", "marginal_param": -1.0}, ValueError, "marginal_param"),
    ({"conditional": "vmf", "conditional_param": 0.0}, ValueError, "kappa"),
    ({"conditional": "normal", "conditional_param": "0.1"}, TypeError, "conditional_param"),
    ({"conditional": "normal", "gennorm_beta": 3.0}, ValueError, "only to the 'gennorm'"),
    ({"conditional": "gennorm", "gennorm_beta": 0.0}, ValueError, "gennorm_beta"),
    ({"conditional": "anisotropic"}, ValueError, "needs concentrations"),
    ({"conditional": "anisotropic", "concentrations": "5,25", "conditional_param": 1.0},
     ValueError, "leave it None"),
    ({"conditional": "anisotropic", "concentrations": torch.ones(3)}, ValueError, r"shape \(4,\)"),
    ({"conditional": "anisotropic", "concentrations": torch.tensor([1.0, 1, 0, 1])}, ValueError,
     "finite and > 0"),
    ({"conditional": "anisotropic", "concentrations": [5.0, 25.0]}, TypeError, "concentrations"),
    ({"conditional": "normal", "concentrations": "5,25"}, ValueError, "only to the 'anisotropic'"),
    ({"conditional": "laplace2"}, ValueError, "conditional must be one of"),
    ({"marginal": "cauchy"}, ValueError, "marginal must be one of"),
    ({"dim": 1}, ValueError, "dim >= 2"),
    ({"dim": 0, "space": "box", "conditional": "normal"}, ValueError, "positive integer"),
    ({"dtype": torch.int64}, TypeError, "floating"),
])
def test_latent_process_rejects_bad_configurations(kwargs, error, match):
    kwargs = {"dim": 4, **kwargs}
    with pytest.raises(error, match=match):
        LatentProcess(**kwargs)


def test_sampling_argument_errors():
    process = LatentProcess(dim=3)
    with pytest.raises(ValueError, match="batch_size"):
        process.sample_pairs(0)
    with pytest.raises(TypeError, match="torch.Generator"):
        process.sample_pairs(4, generator=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"shape \(B, 3\)"):
        process.sample_conditional(torch.zeros(4, 2))
    with pytest.raises(ValueError, match="float64"):
        process.sample_conditional(torch.zeros(4, 3, dtype=torch.float64))


def test_defaults_are_resolved_and_exposed():
    p = LatentProcess(dim=4, space="box", marginal="laplace", conditional="gennorm")
    assert p.marginal_sampler.param == 1.0
    assert p.conditional_sampler.param == 0.05 and p.conditional_sampler.beta == 3.0
    assert LatentProcess(dim=4).conditional_sampler.param == 1.0
    q = LatentProcess(dim=4, conditional="anisotropic", concentrations="5,25")
    assert q.concentrations.tolist() == [5.0, 5.0, 25.0, 25.0]
