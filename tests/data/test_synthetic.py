"""Tests of rpm.data.synthetic against closed forms, scipy and independent numpy constructions.

Monte Carlo tolerances: moments are checked to 5 standard errors; distributions with a
Kolmogorov-Smirnov test at level 1e-3. Every random draw is seeded, so the tests are
deterministic; a wrong law (e.g. a scale off by 10 %) fails them at these sample sizes.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy import integrate, special, stats

from rpm.data.synthetic import (
    CONDITIONALS,
    MARGINALS,
    SPACES,
    FactorisedNoise,
    InvertibleMLP,
    LatentProcess,
    VonMisesFisherSampler,
    parse_concentrations,
    sample_vmf,
)
from rpm.data.synthetic.spaces import BoxTruncation

ALPHA = 1e-3  # KS test level


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def valid_settings() -> list[tuple[str, str, str]]:
    out = []
    for space, marginal, conditional in itertools.product(SPACES, MARGINALS, CONDITIONALS):
        if (space == "unbounded" and marginal == "uniform") or (
                conditional == "vmf" and space != "sphere"):
            continue
        out.append((space, marginal, conditional))
    return out


def make(space: str, marginal: str, conditional: str, dim: int = 4, **kw) -> LatentProcess:
    if conditional == "anisotropic":
        kw.setdefault("concentrations", "5,25")
    return LatentProcess(dim=dim, space=space, marginal=marginal, conditional=conditional, **kw)


# ------------------------------------------------------------------ parse_concentrations


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


# ------------------------------------------------------------------ support, shapes, dtypes


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


# ------------------------------------------------------------------ marginals


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


# ------------------------------------------------------------------ conditionals: unbounded


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


# ------------------------------------------------------------------ conditionals: box


def truncated_cdf(ref, centre):
    lo, hi = ref.cdf(-1 - centre), ref.cdf(1 - centre)
    return lambda x: (ref.cdf(x - centre) - lo) / (hi - lo)


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


@pytest.mark.parametrize("first_round", [1, 2, 40])
def test_box_rejection_rounds_do_not_change_the_law(first_round):
    noise = FactorisedNoise("gennorm", 0.5, 1.5)
    box = BoxTruncation(noise, first_round=first_round)
    centre = torch.tensor([0.9, -0.99, 0.2]).expand(3000, 3).contiguous()
    out = box.sample(centre, gen()).numpy()
    for k, c in enumerate(centre[0].tolist()):
        cdf = truncated_cdf(stats.gennorm(1.5, scale=0.5), c)
        assert stats.kstest(out[:, k], cdf).pvalue > ALPHA


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


# ------------------------------------------------------------------ von Mises-Fisher


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


# ------------------------------------------------------------------ validation


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


# ------------------------------------------------------------------ mixing


def test_mixing_is_exactly_invertible_and_well_conditioned():
    g = InvertibleMLP(10, num_layers=3, seed=1)
    z = LatentProcess(dim=10).sample_marginal(2000, gen())
    x = g(z)
    assert float((g.inverse(x) - z).abs().max()) < 1e-5
    cond = g.condition_numbers()
    assert len(cond) == 3 and all(1.0 <= c <= 5.0 * (1 + 1e-9) for c in cond)
    g64 = InvertibleMLP(6, num_layers=4, seed=2, max_condition_number=20.0, dtype=torch.float64)
    z64 = torch.randn(500, 6, dtype=torch.float64)
    assert float((g64.inverse(g64(z64)) - z64).abs().max()) < 1e-12
    assert all(c <= 20.0 * (1 + 1e-9) for c in g64.condition_numbers())


def test_mixing_matches_a_numpy_forward_and_is_frozen_nonlinear_and_seeded():
    g = InvertibleMLP(5, seed=3, dtype=torch.float64)
    z = torch.randn(300, 5, dtype=torch.float64)
    h = z.numpy()
    for i, layer in enumerate(g.layers):
        h = h @ layer.weight.numpy().T + layer.bias.numpy()
        if i < 2:
            h = np.where(h > 0, h, 0.2 * h)
    np.testing.assert_allclose(g(z).numpy(), h, rtol=1e-12, atol=1e-12)
    assert all(not p.requires_grad for p in g.parameters()) and len(list(g.parameters())) == 6
    a, b = torch.randn(2, 200, 5, dtype=torch.float64)
    assert float((g(a) + g(b) - 2 * g((a + b) / 2)).abs().max()) > 1e-2     # not affine
    assert torch.equal(InvertibleMLP(5, seed=3).layers[0].weight,
                       InvertibleMLP(5, seed=3).layers[0].weight)
    assert not torch.equal(InvertibleMLP(5, seed=3).layers[0].weight,
                           InvertibleMLP(5, seed=4).layers[0].weight)


def test_mixing_errors():
    with pytest.raises(ValueError, match="negative_slope"):
        InvertibleMLP(4, negative_slope=0.0)
    with pytest.raises(ValueError, match="dim"):
        InvertibleMLP(0)
    with pytest.raises(ValueError, match="max_condition_number"):
        InvertibleMLP(4, max_condition_number=0.5)
    with pytest.raises(ValueError, match="last dimension 4"):
        InvertibleMLP(4)(torch.zeros(3, 5))
    with pytest.raises(ValueError, match="last dimension 4"):
        InvertibleMLP(4).inverse(torch.zeros(3, 5))
