"""The state-space prior and its structured posterior against dense Gaussians (float64) and
Pyro's GaussianHMM."""

import pyro
import pyro.poutine as poutine
import pytest
import torch
from pyro.distributions import Delta, GaussianHMM, MultivariateNormal, Normal
from pyro.nn import PyroParam
from torch.distributions import constraints

from rpm.distributions import GaussianStateSpace, StateSpacePosterior
from rpm.priors import StateSpacePrior
from tests.ops.test_kalman import condition, dense_joint, random_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def as_dict(prior):
    return {name: getattr(prior, name).detach() for name in (
        "init_loc", "init_scale_tril", "transition_matrix", "transition_scale_tril",
        "observation_matrix", "observation_scale_tril")}


def randomised_prior(dim=2, state_dim=4):
    torch.set_default_dtype(torch.float64)
    prior = StateSpacePrior(dim, state_dim, constant_velocity=False)
    p = random_model(H=state_dim, D=dim)
    set_params(prior, **p)
    return prior


def set_params(prior, **values):
    for name, value in values.items():
        if name in ("init_loc", "transition_matrix", "observation_matrix"):
            setattr(prior, name, torch.nn.Parameter(value.clone()))
        else:
            setattr(prior, name, PyroParam(value.clone(), constraints.lower_cholesky))


def test_per_coordinate_initial_values():
    prior = StateSpacePrior(2, init_loc=[16.0, 16.0, 0.0, 0.0], process_noise=[0.1, 0.1, 2.0, 2.0])
    assert torch.equal(prior.init_loc.detach(), torch.tensor([16.0, 16.0, 0.0, 0.0]))
    expected = torch.diag(torch.tensor([0.1, 0.1, 2.0, 2.0]))
    assert torch.allclose(prior.transition_scale_tril.detach(), expected)


def test_constant_velocity_start():
    prior = StateSpacePrior(2, process_noise=0.2, observation_noise=0.3)
    A = prior.transition_matrix.detach()
    s = torch.tensor([1.0, 2.0, 0.5, -1.0])  # positions (1, 2), velocities (0.5, -1)
    assert torch.equal(A @ s, torch.tensor([1.5, 1.0, 0.5, -1.0]))
    assert torch.equal(prior.observation_matrix.detach() @ s, torch.tensor([1.0, 2.0]))
    assert torch.allclose(prior.transition_scale_tril.detach(), 0.2 * torch.eye(4))
    assert torch.allclose(prior.observation_scale_tril.detach(), 0.3 * torch.eye(2))


def test_log_prob_matches_gaussian_hmm_and_the_dense_joint():
    T = 6
    prior = randomised_prior()
    p = as_dict(prior)
    A, H = p["transition_matrix"], 4
    # GaussianHMM's initial state precedes the first transition: its s_0 ~ N(0, I) is our
    # s_1 ~ N(0, A A^T + Q).
    Q = p["transition_scale_tril"] @ p["transition_scale_tril"].T
    set_params(prior, init_loc=torch.zeros(H), init_scale_tril=torch.linalg.cholesky(A @ A.T + Q))
    hmm = GaussianHMM(MultivariateNormal(torch.zeros(H), torch.eye(H)), A.T,
                      MultivariateNormal(torch.zeros(H), scale_tril=p["transition_scale_tril"]),
                      p["observation_matrix"].T,
                      MultivariateNormal(torch.zeros(2), scale_tril=p["observation_scale_tril"]),
                      duration=T)
    z = hmm.sample((4,))
    ours = prior.distribution(T).log_prob(z)
    assert torch.allclose(ours, hmm.log_prob(z), atol=1e-8)
    _, _, mean_z, cov_z, _ = dense_joint(as_dict(prior), T)
    assert torch.allclose(ours, MultivariateNormal(mean_z, cov_z).log_prob(z.reshape(4, -1)), atol=1e-8)


def test_rsample_moments_match_the_dense_joint():
    """Monte Carlo: 40 000 draws; the mean and covariance errors are within 5 standard errors
    (entries of order 1, standard error about 1 / sqrt(40 000) = 0.005 times their scale)."""
    T = 3
    prior = randomised_prior()
    _, _, mean_z, cov_z, _ = dense_joint(as_dict(prior), T)
    draws = prior.distribution(T).rsample((40000,)).reshape(40000, -1).detach()
    sd = cov_z.diagonal().sqrt()
    assert ((draws.mean(0) - mean_z).abs() / sd).max() < 5 / 200
    err = (torch.cov(draws.T) - cov_z) / (sd[:, None] * sd[None, :])
    assert err.abs().max() < 5 * 2 ** 0.5 / 200


def test_plate_expands_and_the_site_has_event_shape_t_d():
    prior = StateSpacePrior(3)
    q = pyro.distributions.Normal(torch.zeros(5, 4, 3), 1.0).to_event(1)
    with poutine.trace() as tracer, pyro.plate("sequences", 5):
        z = prior(q, None)
    site = tracer.trace.nodes["z"]
    assert z.shape == (5, 4, 3)
    assert site["fn"].batch_shape == (5,) and site["fn"].event_shape == (4, 3)
    assert site["fn"].log_prob(z).shape == (5,)


def test_smoother_and_forecast_match_the_dense_conditionals():
    T, k = 4, 2
    prior = randomised_prior()
    p = as_dict(prior)
    mean_s, cov_s, mean_z, cov_z, cov_sz = dense_joint(p, T, extra=k)
    z = torch.randn(T, 2)
    n, H = T * 2, 4
    loc_s, _ = condition(mean_s[:T * H], mean_z[:n], cov_s[:T * H, :T * H], cov_sz[:T * H, :n],
                         cov_z[:n, :n], z.reshape(-1))
    assert torch.allclose(prior.smooth(z).loc, loc_s.reshape(T, H), atol=1e-8)
    loc_z, _ = condition(mean_z[n:], mean_z[:n], cov_z[n:, n:], cov_z[n:, :n], cov_z[:n, :n],
                         z.reshape(-1))
    assert torch.allclose(prior.forecast(z, k).loc, loc_z.reshape(k, 2), atol=1e-8)


def dense_posterior(prior, loc, scale):
    """z | mu with mu = z + e, e ~ N(0, diag scale^2): the conditional of the joint Gaussian."""
    T, D = loc.shape
    _, _, mean_z, cov_z, _ = dense_joint(as_dict(prior), T)
    cov_mu = cov_z + torch.diag(scale.reshape(-1).square())
    return condition(mean_z, mean_z, cov_z, cov_z, cov_mu, loc.reshape(-1))


def test_structured_posterior_density_is_the_dense_posterior():
    T, D, N = 4, 2, 3
    prior = randomised_prior()
    loc, scale = torch.randn(N, T, D), torch.rand(N, T, D) + 0.2
    posterior = prior.posterior(Normal(loc, scale).to_event(1))
    assert posterior.batch_shape == (N,) and posterior.event_shape == (T, D)
    z = torch.randn(N, T, D)
    for n in range(N):
        mean, cov = dense_posterior(prior, loc[n], scale[n])
        expected = MultivariateNormal(mean, cov).log_prob(z[n].reshape(-1))
        assert torch.allclose(posterior.log_prob(z)[n], expected, atol=1e-8)


def test_structured_posterior_draws_are_the_dense_posterior():
    """The draw is affine in the noise, z = b + M eps: b is the posterior mean and M M^T the
    posterior covariance of z_{1:T} (all time blocks)."""
    T, D, H = 4, 2, 4
    prior = randomised_prior()
    loc, scale = torch.randn(1, T, D), torch.rand(1, T, D) + 0.2
    posterior = prior.posterior(Normal(loc, scale).to_event(1))
    basis = torch.cat([torch.zeros(1, T * (H + D)), torch.eye(T * (H + D))])
    draws = posterior._rsample_from_noise(basis.reshape(-1, 1, T, H + D)).reshape(-1, T * D)
    offset, matrix = draws[0], (draws[1:] - draws[0]).T
    mean, cov = dense_posterior(prior, loc[0], scale[0])
    assert torch.allclose(offset, mean, atol=1e-8)
    assert torch.allclose(matrix @ matrix.T, cov, atol=1e-8)


def test_structured_posterior_is_reparameterised():
    prior = StateSpacePrior(2)
    loc = torch.randn(3, 5, 2, requires_grad=True)
    scale = (torch.rand(3, 5, 2) + 0.1).requires_grad_()
    z = prior.posterior(Normal(loc, scale).to_event(1)).rsample()
    z.sum().backward()
    assert loc.grad.abs().sum() > 0 and scale.grad.abs().sum() > 0
    assert prior.transition_matrix.grad.abs().sum() > 0


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="constant_velocity needs state_dim"):
        StateSpacePrior(2, state_dim=3, constant_velocity=True)
    with pytest.raises(ValueError, match="process_noise must be finite positive"):
        StateSpacePrior(2, process_noise=0.0)
    with pytest.raises(ValueError, match="init_scale must be a number or 4 numbers"):
        StateSpacePrior(2, init_scale=[1.0, 2.0])
    with pytest.raises(ValueError, match="dim must be a positive integer"):
        StateSpacePrior(0)
    prior = StateSpacePrior(2)
    with pytest.raises(ValueError, match=r"loc and scale must both have shape \(N, T, D\)"):
        StateSpacePosterior(prior.distribution(4), torch.zeros(3, 4, 3), torch.ones(3, 4, 3))
    with pytest.raises(ValueError, match="needs stochastic recognition"):
        prior.posterior(Delta(torch.zeros(3, 4, 2), event_dim=1))
    with pytest.raises(TypeError, match="prior must be a GaussianStateSpace"):
        StateSpacePosterior(None, torch.zeros(3, 4, 2), torch.ones(3, 4, 2))
    with pytest.raises(ValueError, match="duration must be a positive integer"):
        GaussianStateSpace(*as_dict(prior).values(), duration=0)
