"""The Gaussian RPM: GaussianPairPrior and GaussianStarPrior with deterministic encoders under
``marginal="gaussian"``, against the closed form of the ELBO written here in numpy (float64),
through RPMELBO, Pyro's Trace_ELBO and rpm_elbo; the learned correlation; and the bad inputs."""

import numpy as np
import pyro
import pytest
import torch
from pyro.infer import Trace_ELBO

import rpm
from rpm.inference import rpm_elbo
from rpm.priors import GaussianPairPrior, GaussianStarPrior, ImplicitPrior, RBFEnergy
from tests.helpers import gaussian_pair_closed_form, gaussian_star_closed_form


def _encoder(in_dim: int, dim: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(in_dim, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, dim)).double()


@pytest.mark.parametrize("learn", [False, True])
def test_pair_elbo_is_the_closed_form(learn):
    """N = 64, D = 3, float64: RPMELBO, Trace_ELBO and rpm_elbo all equal the closed form to
    1e-8 (the fixed and the learned correlation alike)."""
    num, dim, rho = 64, 3, 0.6
    net = _encoder(5, dim, seed=1)
    model = rpm.RPM(rpm.DeltaRecognition(net),
                    GaussianPairPrior(dim, correlation=rho, learn_correlation=learn),
                    marginal="gaussian")
    x, x2 = torch.randn(num, 5, dtype=torch.float64), torch.randn(num, 5, dtype=torch.float64)
    with torch.no_grad():
        z, z2 = net(x), net(x2)
    expected = gaussian_pair_closed_form(z.numpy(), z2.numpy(), rho)
    ours = -rpm.RPMELBO().differentiable_loss(model.model, model.guide, x, x2) / num
    traced = -Trace_ELBO().differentiable_loss(model.model, model.guide, x, x2) / num
    functional = rpm_elbo(GaussianPairPrior(dim, correlation=rho), [z, z2],
                          marginal="gaussian") / num
    for value in (ours, traced, functional):
        assert abs(value.item() - expected) < 1e-8
    per_instance = rpm_elbo(GaussianPairPrior(dim, correlation=rho), [z, z2],
                            marginal="gaussian", per_instance=True)
    assert per_instance.shape == (num,)
    assert abs(per_instance.mean().item() - expected) < 1e-8


def test_star_elbo_is_the_closed_form():
    """J = 3 views, D = 2, float64: RPMELBO, Trace_ELBO and rpm_elbo equal the closed form
    with the content integrated out, to 1e-8."""
    num, views, dim, scale = 64, 3, 2, 0.7
    net = _encoder(4, dim, seed=2)
    model = rpm.RPM(rpm.DeltaRecognition(net), GaussianStarPrior(dim, scale=scale),
                    marginal="gaussian")
    x = torch.randn(num, views, 4, dtype=torch.float64)
    with torch.no_grad():
        z = net(x)
    expected = gaussian_star_closed_form(z.numpy(), scale)
    ours = -rpm.RPMELBO().differentiable_loss(model.model, model.guide, x) / num
    traced = -Trace_ELBO().differentiable_loss(model.model, model.guide, x) / num
    functional = rpm_elbo(GaussianStarPrior(dim, scale=scale), z, marginal="gaussian") / num
    for value in (ours, traced, functional):
        assert abs(value.item() - expected) < 1e-8


def test_the_star_prior_samples_its_density():
    """Draws of the star prior have the covariance 1 1^T (x) I + s^2 I (Monte Carlo, 20000
    draws: every entry within 0.05 of it, about 5 standard errors)."""
    prior = GaussianStarPrior(2, scale=0.5)
    draws = prior.joint(3, torch.float64).sample((20000,)).reshape(20000, 6)
    expected = np.kron(np.ones((3, 3)), np.eye(2)) + 0.25 * np.eye(6)
    np.testing.assert_allclose(np.cov(draws.numpy().T), expected, atol=0.05)


def test_learned_correlation_stays_in_the_interval_and_gets_a_gradient():
    """The learned rho is a PyroParam constrained to (-1, 1): its unconstrained value can be
    anything, the ELBO's gradient reaches it, and it agrees with d ELBO / d rho from the closed
    form (finite differences)."""
    num, dim = 32, 2
    prior = GaussianPairPrior(dim, correlation=0.3, learn_correlation=True)
    z, z2 = torch.randn(num, dim, dtype=torch.float64), torch.randn(num, dim, dtype=torch.float64)
    value = rpm_elbo(prior, [z, z2], marginal="gaussian") / num
    (gradient,) = torch.autograd.grad(value, prior.correlation_unconstrained)
    step = 1e-6
    numeric = (gaussian_pair_closed_form(z.numpy(), z2.numpy(), 0.3 + step)
               - gaussian_pair_closed_form(z.numpy(), z2.numpy(), 0.3 - step)) / (2 * step)
    # rho = 2 sigmoid(u) - 1 on (-1, 1): d rho / d u = (1 - rho^2) / 2
    assert abs(gradient.item() - numeric * (1 - 0.3 ** 2) / 2) < 1e-6
    with torch.no_grad():
        prior.correlation_unconstrained.fill_(40.0)
    assert -1.0 < prior.correlation.item() < 1.0


def test_gaussian_recognition_rpm_elbo_equals_trace_elbo():
    """With Gaussian recognition the marginal adds the noise to S (not a closed form: one draw);
    RPMELBO and Trace_ELBO agree on the same random numbers."""
    dim = 2
    net = _encoder(3, dim, seed=3)
    model = rpm.RPM(rpm.DeltaRecognition(net, noise_scale=0.1), GaussianPairPrior(dim),
                    marginal="gaussian")
    x, x2 = torch.randn(16, 3, dtype=torch.float64), torch.randn(16, 3, dtype=torch.float64)
    pyro.set_rng_seed(5)
    ours = rpm.RPMELBO().differentiable_loss(model.model, model.guide, x, x2)
    pyro.set_rng_seed(5)
    traced = Trace_ELBO().differentiable_loss(model.model, model.guide, x, x2)
    torch.testing.assert_close(ours, traced)


def test_bad_input_is_refused_in_one_line_naming_the_fix():
    net = torch.nn.Linear(4, 3).double()
    x = torch.randn(16, 4, dtype=torch.float64)
    # Delta encoder under the mixture marginal (Appendix B): the fix names marginal='gaussian'
    with pytest.raises(ValueError, match="ill-defined.*marginal='gaussian'"):
        rpm.RPM(rpm.DeltaRecognition(net), GaussianPairPrior(3))
    with pytest.raises(ValueError, match="marginal='gaussian'"):
        rpm_elbo(GaussianPairPrior(3), [x[:, :3], x[:, 1:]])
    # the prior's dimension differs from the encoder's
    model = rpm.RPM(rpm.DeltaRecognition(net), GaussianPairPrior(2), marginal="gaussian")
    with pytest.raises(ValueError, match=r"dimension 2 but the encoder outputs dimension 3.*dim=3"):
        model.recognise(x, x)
    # fewer rows than D + 1: a singular covariance
    model = rpm.RPM(rpm.DeltaRecognition(net), GaussianPairPrior(3), marginal="gaussian")
    with pytest.raises(ValueError, match=r"singular; use a batch of N >= 4"):
        rpm.RPMELBO().differentiable_loss(model.model, model.guide, x[:3], x[:3])
    # a correlation outside (-1, 1)
    for rho in (1.0, -1.5):
        with pytest.raises(ValueError, match=r"correlation must lie in the open interval \(-1, 1\)"):
            GaussianPairPrior(3, correlation=rho, learn_correlation=rho < 0)
    with pytest.raises(ValueError, match="correlation must be a finite number"):
        GaussianPairPrior(3, correlation=float("nan"))
    with pytest.raises(ValueError, match="scale must be a finite positive number"):
        GaussianStarPrior(3, scale=0.0)
    # an unknown marginal, and the Gaussian marginal where it cannot enter
    with pytest.raises(ValueError, match=r"marginal must be one of \('mixture', 'gaussian'\)"):
        rpm.RPM(rpm.DeltaRecognition(net), GaussianPairPrior(3), marginal="moment")
    with pytest.raises(ValueError, match="cancel analytically.*marginal='mixture'"):
        rpm.RPM(rpm.DeltaRecognition(net), ImplicitPrior(RBFEnergy()), marginal="gaussian")
    with pytest.raises(ValueError, match="without a queue and without explicit negatives"):
        rpm_elbo(GaussianPairPrior(3), [x[:, :3], x[:, 1:]], marginal="gaussian",
                 candidates=rpm.inference.Candidates(negatives=torch.randn(4, 3,
                                                                          dtype=torch.float64)))
