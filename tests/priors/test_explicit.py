"""Explicit priors: their sites' log-densities against the Gaussian densities written out, the
initial values of their parameters, and the dtype they compute in."""

import math

import pyro
import pytest
import torch

from rpm.priors import GaussianRandomWalkPrior, LinearDynamicsPrior

D = 3


def gaussian_log_density(x, mean, covariance):
    """log N(x; mean, covariance) from the formula, float64."""
    diff = (x - mean).double()
    covariance = covariance.double()
    quad = diff @ torch.linalg.solve(covariance, diff)
    return -0.5 * (quad + torch.logdet(covariance) + len(x) * math.log(2 * math.pi))


def site_log_probs(prior, z, z2):
    conditioned = pyro.poutine.condition(prior, data={"z": z, "z2": z2})
    trace = pyro.poutine.trace(conditioned).get_trace()
    trace.compute_log_prob()
    return trace.nodes["z"]["log_prob"], trace.nodes["z2"]["log_prob"]


def test_random_walk_densities():
    torch.set_default_dtype(torch.float64)
    prior = GaussianRandomWalkPrior(D, scale=1.3, step=0.4)
    z, z2 = torch.randn(5, D), torch.randn(5, D)
    log_z, log_z2 = site_log_probs(prior, z, z2)
    eye = torch.eye(D)
    for i in range(5):
        assert log_z[i].item() == pytest.approx(
            gaussian_log_density(z[i], torch.zeros(D), 1.3**2 * eye).item(), rel=1e-12)
        assert log_z2[i].item() == pytest.approx(
            gaussian_log_density(z2[i], z[i], 0.4**2 * eye).item(), rel=1e-12)


def test_linear_dynamics_densities():
    torch.set_default_dtype(torch.float64)
    prior = LinearDynamicsPrior(D, scale=1.1, noise=0.5)
    with torch.no_grad():
        prior.transition.copy_(torch.randn(D, D))
    z, z2 = torch.randn(4, D), torch.randn(4, D)
    log_z, log_z2 = site_log_probs(prior, z, z2)
    transition = prior.transition.detach()
    for i in range(4):
        assert log_z[i].item() == pytest.approx(
            gaussian_log_density(z[i], torch.zeros(D), 1.1**2 * torch.eye(D)).item(), rel=1e-12)
        assert log_z2[i].item() == pytest.approx(
            gaussian_log_density(z2[i], transition @ z[i], 0.5**2 * torch.eye(D)).item(),
            rel=1e-12)


EXACT = 1 / 0.07


@pytest.mark.parametrize("build, read", [
    (lambda v: GaussianRandomWalkPrior(D, scale=v), lambda p: p.scale),
    (lambda v: GaussianRandomWalkPrior(D, step=v), lambda p: p.step),
    (lambda v: LinearDynamicsPrior(D, scale=v), lambda p: torch.diagonal(p.initial_scale_tril)),
    (lambda v: LinearDynamicsPrior(D, noise=v), lambda p: torch.diagonal(p.noise_scale_tril)),
], ids=["walk-scale", "walk-step", "dynamics-scale", "dynamics-noise"])
def test_python_float_hyperparameters_keep_their_value_after_double(build, read):
    torch.set_default_dtype(torch.float32)
    value = read(build(EXACT).double()).detach()
    assert value.dtype == torch.float64
    torch.testing.assert_close(value, torch.full_like(value, EXACT), rtol=4e-16, atol=0)


def test_sites_follow_the_latents_dtype():
    """Parameters are held in float64; the sites compute in the recognition model's dtype."""
    torch.set_default_dtype(torch.float32)
    q = pyro.distributions.Normal(torch.zeros(5, D), 1.0).to_event(1)
    for prior in (GaussianRandomWalkPrior(D), LinearDynamicsPrior(D)):
        trace = pyro.poutine.trace(prior).get_trace(q, q)
        assert trace.nodes["z"]["value"].dtype == torch.float32
        assert trace.nodes["z2"]["value"].dtype == torch.float32


@pytest.mark.parametrize("build", [lambda: GaussianRandomWalkPrior(D),
                                   lambda: LinearDynamicsPrior(D)])
def test_explicit_priors_refuse_delta_recognition_and_know_their_dimension(build):
    prior = build()
    assert prior.accepts_delta_recognition is False
    assert prior.dim == D
    assert prior.log_ratio(torch.zeros(2, D), torch.zeros(2, D), None, None) is None


def test_sparse_random_walk_densities_match_scipy():
    """The Laplace and generalized-normal walks' site log-densities against scipy.stats."""
    from scipy import stats

    from rpm.priors import GeneralizedNormalRandomWalkPrior, LaplaceRandomWalkPrior

    torch.set_default_dtype(torch.float64)
    z, z2 = torch.randn(5, D), torch.randn(5, D)
    marginal = stats.norm(0.0, 1.3).logpdf(z.numpy()).sum(-1)
    priors = {
        "laplace": (LaplaceRandomWalkPrior(D, scale=1.3, step=0.4), stats.laplace(scale=0.4)),
        "gennorm": (GeneralizedNormalRandomWalkPrior(D, scale=1.3, step=0.4, shape=0.6),
                    stats.gennorm(0.6, scale=0.4)),
    }
    for prior, step in priors.values():
        log_z, log_z2 = site_log_probs(prior, z, z2)
        assert log_z.detach().numpy() == pytest.approx(marginal, rel=1e-12)
        assert log_z2.detach().numpy() == pytest.approx(
            step.logpdf((z2 - z).numpy()).sum(-1), rel=1e-12)


def test_sparse_random_walk_as_a_sequence_prior_matches_scipy():
    """MarkovPrior(walk): log P(z_{1:T}) = log N(z_1; 0, s^2) + sum_t log GN(z_{t+1} - z_t)."""
    from scipy import stats

    from rpm.priors import GeneralizedNormalRandomWalkPrior, MarkovChain

    torch.set_default_dtype(torch.float64)
    prior = GeneralizedNormalRandomWalkPrior(D, scale=0.8, step=0.3, shape=0.5)
    z = torch.randn(4, 6, D)
    q = pyro.distributions.Normal(z, 1.0).to_event(1)  # recognition, batch (N, T); unused
    log_p = MarkovChain(prior, q).log_prob(z)
    expected = (stats.norm(0, 0.8).logpdf(z[:, 0].numpy()).sum(-1)
                + stats.gennorm(0.5, scale=0.3).logpdf(z.diff(dim=1).numpy()).sum((-1, -2)))
    assert log_p.detach().numpy() == pytest.approx(expected, rel=1e-12)


def test_generalized_normal_walk_learns_or_fixes_its_shape():
    from rpm.priors import GeneralizedNormalRandomWalkPrior

    learned = GeneralizedNormalRandomWalkPrior(D, shape=0.7)
    fixed = GeneralizedNormalRandomWalkPrior(D, shape=0.7, learn_shape=False)
    assert "shape_unconstrained" in dict(learned.named_parameters())
    assert "shape_unconstrained" not in dict(fixed.named_parameters())
    assert float(fixed.shape) == 0.7
    with pytest.raises(ValueError, match="shape must be a finite positive number"):
        GeneralizedNormalRandomWalkPrior(D, shape=0.0)


def test_random_walk_energy_is_the_step_log_density():
    """RandomWalkEnergy: F_ij = sum_d log p(z2_jd - z_id) (scipy.stats), paired its diagonal;
    the implicit prior's ELBO with it is InfoNCE with this critic (RPMELBO vs a float64 loop)."""
    from scipy import stats

    import rpm
    from rpm.priors import (
        GeneralizedNormalRandomWalkPrior,
        ImplicitPrior,
        LaplaceRandomWalkPrior,
        RandomWalkEnergy,
    )

    torch.set_default_dtype(torch.float64)
    z, z2 = torch.randn(5, D), torch.randn(4, D)
    for walk, step in [(LaplaceRandomWalkPrior(D, step=0.4), stats.laplace(scale=0.4)),
                       (GeneralizedNormalRandomWalkPrior(D, step=0.4, shape=0.6),
                        stats.gennorm(0.6, scale=0.4))]:
        energy = RandomWalkEnergy(walk)
        expected = step.logpdf((z2[None] - z[:, None]).numpy()).sum(-1)
        assert energy(z, z2).detach().numpy() == pytest.approx(expected, rel=1e-12)
        torch.testing.assert_close(energy.paired(z[:4], z2), energy(z[:4], z2).diagonal())
    energy = RandomWalkEnergy(GeneralizedNormalRandomWalkPrior(D, step=0.7, shape=0.8))
    model = rpm.RPM(rpm.DeltaRecognition(torch.nn.Identity()), ImplicitPrior(energy))
    x, x2 = torch.randn(6, D), torch.randn(6, D)
    loss = rpm.RPMELBO().differentiable_loss(model.model, model.guide, x, x2)
    logits = energy(x, x2).detach()
    loop = sum(logits[i, i] - torch.logsumexp(logits[i], 0) + math.log(6) for i in range(6))
    assert -loss.item() == pytest.approx(loop.item(), rel=1e-10)
    loss.backward()
    assert torch.isfinite(energy.walk.shape_unconstrained.grad)
    with pytest.raises(TypeError, match="needs a random-walk prior"):
        RandomWalkEnergy(LinearDynamicsPrior(D))
