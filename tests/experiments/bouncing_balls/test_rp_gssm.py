"""RP-GSSM's objective against its definition: the folded recognition f = p_t f~ / Z_t from the
densities, and the ELBO against Trace_ELBO on a Pyro model and guide written from the equations
(float64)."""

import math

import pyro
import pytest
import torch
from pyro.distributions import MultivariateNormal, Normal
from pyro.infer import Trace_ELBO

from rpm.distributions import StateSpacePosterior
from rpm.experiments.bouncing_balls.rp_gssm import folded_recognition, rp_gssm_elbo
from rpm.priors import StateSpacePrior, StationaryStateSpacePrior

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N, T, D, H = 5, 4, 2, 3


@pytest.fixture(autouse=True)
def float64():
    torch.set_default_dtype(torch.float64)


def random_setting():
    prior = StationaryStateSpacePrior(D, H, observation_noise=0.4)
    with torch.no_grad():
        prior.transition_weight.copy_(2 * torch.randn(H, H))
        prior.observation_matrix.copy_(torch.randn(D, H))
        prior.observation_offset.copy_(torch.randn(D))
    loc = 2 * torch.randn(N, T, D)
    scale = 0.3 + torch.rand(N, T, D)
    return prior, loc, scale


def log_folded(prior, z, loc, scale):
    """log f(z|x) = log p_t(z) + log N(mu~; z, sigma~) - log Z_t, Z_t = N(mu~; b, P + Sigma~)."""
    marginal = prior.marginal()
    normaliser = MultivariateNormal(marginal.loc, marginal.covariance_matrix
                                    + torch.diag_embed(scale.square())).log_prob(loc)
    return marginal.log_prob(z) + Normal(z, scale).log_prob(loc).sum(-1) - normaliser


def test_folded_recognition_is_the_normalised_product_of_the_marginal_and_the_factor():
    prior, loc, scale = random_setting()
    folded, log_normaliser = folded_recognition(prior, loc, scale)
    for _ in range(3):
        z = 3 * torch.randn(N, T, D)
        assert torch.allclose(folded.log_prob(z), log_folded(prior, z, loc, scale), atol=1e-10)
    # Z_t by quadrature of p_t f~ in one dimension (D = 1)
    prior1 = StationaryStateSpacePrior(1, 2, observation_scale=1.5, observation_offset=0.5)
    grid = torch.linspace(-30, 30, 200001)
    density = prior1.marginal().log_prob(grid[:, None]).exp() * Normal(grid, 0.7).log_prob(
        torch.tensor(1.2)).exp()
    quadrature = torch.trapezoid(density, grid).log()
    _, log_z = folded_recognition(prior1, torch.tensor([[[1.2]]]), torch.tensor([[[0.7]]]))
    assert torch.allclose(log_z.squeeze(), quadrature.detach(), atol=1e-8)


def test_rp_gssm_elbo_is_the_rpm_elbo_of_the_folded_recognition():
    """-Trace_ELBO of the model p(z) prod_t f(z_t|x_t) / F_t(z_t) with the structured guide on
    the factors, with the same random numbers, equals the closed form, values and gradients."""
    prior, loc, scale = random_setting()
    loc.requires_grad_(True)

    def model():
        with pyro.plate("sequences", N):
            z = pyro.sample("z", prior.distribution(T))
            log_f = torch.stack([torch.stack([
                log_folded(prior, z[:, t], loc[n, t], scale[n, t]) for n in range(N)])
                for t in range(T)])  # (T, N_n, N_i)
            log_mixture = torch.logsumexp(log_f, dim=1) - math.log(N)  # (T, N_i)
            own = torch.stack([log_folded(prior, z[:, t], loc[:, t], scale[:, t])
                               for t in range(T)])  # (T, N)
            pyro.factor("x", (own - log_mixture).sum(0))

    def guide():
        with pyro.plate("sequences", N):
            pyro.sample("z", StateSpacePosterior(prior.distribution(T), loc, scale))

    params = [loc, *prior.parameters()]
    pyro.set_rng_seed(4)
    theirs = -Trace_ELBO().differentiable_loss(model, guide)
    their_grads = torch.autograd.grad(theirs, params)
    pyro.set_rng_seed(4)
    q = Normal(loc, scale).to_event(1)
    ours = rp_gssm_elbo(prior, q).sum()
    our_grads = torch.autograd.grad(ours, params)
    assert torch.allclose(ours, theirs, rtol=1e-9, atol=1e-9)
    for a, b in zip(our_grads, their_grads, strict=True):
        assert torch.allclose(a, b, rtol=1e-7, atol=1e-9)


def test_bad_input_is_refused():
    prior, loc, scale = random_setting()
    with pytest.raises(TypeError, match="StationaryStateSpacePrior"):
        rp_gssm_elbo(StateSpacePrior(D), Normal(loc, scale).to_event(1))
    with pytest.raises(ValueError, match="Gaussian factors"):
        rp_gssm_elbo(prior, pyro.distributions.Delta(loc, event_dim=1))
