"""The circular-step distribution and the physics-aware prior of the bouncing-balls experiment,
checked against quadrature over the unknown heading, a 2D grid integral, Monte Carlo moments
and Pyro's Trace_ELBO."""

import math

import pyro
import pytest
import torch
from pyro import poutine
from pyro.distributions import Normal

import rpm
from rpm.experiments.bouncing_balls.circular_step import BallDynamicsPrior, CircularStep


def _log_heading_average(delta: torch.Tensor, radius: float, noise: float, num: int = 20000):
    """log p(delta), p(delta) = (1 / 2 pi) int N(delta; r (cos t, sin t), w^2 I) dt, by the
    midpoint rule on a uniform grid of headings (exponentially accurate for a smooth periodic
    integrand), summed in log space."""
    theta = (torch.arange(num, dtype=torch.float64) + 0.5) * (2 * math.pi / num)
    mean = radius * torch.stack((theta.cos(), theta.sin()), -1)  # (num, 2)
    sq = (delta[:, None, :] - mean[None]).square().sum(-1)  # (M, num)
    log_density = -sq / (2 * noise**2) - math.log(2 * math.pi * noise**2)  # (M, num)
    return torch.logsumexp(log_density, -1) - math.log(num)  # (M,)


@pytest.mark.parametrize("radius, noise", [(0.0, 0.7), (2.0, 0.5), (5.0, 1.3), (30.0, 0.2)])
def test_log_prob_is_the_heading_average_of_gaussians(radius, noise):
    loc = torch.tensor([[1.0, -2.0, 0.5, 3.0]], dtype=torch.float64)  # K = 2 balls
    delta = torch.randn(50, 2, 2, dtype=torch.float64) * (radius + noise)
    delta[0] = 0.0  # the centre, where |delta| has no gradient
    value = loc + delta.reshape(50, 4)
    dist = CircularStep(loc, torch.tensor(radius, dtype=torch.float64),
                        torch.tensor(noise, dtype=torch.float64))
    expected = sum(_log_heading_average(delta[:, k], radius, noise) for k in range(2))
    torch.testing.assert_close(dist.log_prob(value), expected, rtol=1e-9, atol=1e-9)


def test_density_integrates_to_one_and_reduces_to_a_gaussian_at_zero_step():
    grid = torch.linspace(-12, 12, 801, dtype=torch.float64)
    x, y = torch.meshgrid(grid, grid, indexing="xy")
    points = torch.stack((x.flatten(), y.flatten()), -1)  # (G, 2): one ball
    dist = CircularStep(torch.zeros(2, dtype=torch.float64), torch.tensor(4.0), torch.tensor(1.5))
    cell = (grid[1] - grid[0]) ** 2
    assert abs(dist.log_prob(points).exp().sum().item() * cell - 1.0) < 1e-6
    gaussian = CircularStep(torch.zeros(2, dtype=torch.float64), 0.0, torch.tensor(1.5))
    torch.testing.assert_close(
        gaussian.log_prob(points[:100]),
        Normal(torch.zeros(2, dtype=torch.float64), 1.5).log_prob(points[:100]).sum(-1),
    )


def test_samples_have_the_step_length_and_the_stated_moments():
    loc = torch.tensor([3.0, 4.0, -1.0, 0.0], dtype=torch.float64)
    radius = torch.tensor([5.0, 2.0], dtype=torch.float64)
    noise = torch.tensor([0.1, 0.5], dtype=torch.float64)
    dist = CircularStep(loc, radius, noise)
    samples = dist.sample((200_000,))  # (S, 4)
    step = (samples - loc).reshape(-1, 2, 2)
    # E|delta|^2 = r^2 + 2 w^2 exactly; standard errors here are below 0.02
    torch.testing.assert_close(step.square().sum(-1).mean(0), radius**2 + 2 * noise**2,
                               rtol=0, atol=0.06)
    torch.testing.assert_close(samples.mean(0), dist.mean, rtol=0, atol=0.03)
    torch.testing.assert_close(samples.var(0), dist.variance, rtol=0.02, atol=0)
    # the direction is uniform: the heading's first circular moment vanishes
    heading = torch.atan2(step[..., 1], step[..., 0])
    assert heading.cos().mean().abs() < 0.01 and heading.sin().mean().abs() < 0.01


def test_gradients_are_finite_at_zero_step_and_match_finite_differences():
    loc = torch.zeros(2, dtype=torch.float64)
    value = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    radius = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)
    noise = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
    CircularStep(loc, radius, noise).log_prob(value).backward()
    assert torch.equal(value.grad, torch.zeros(2, dtype=torch.float64))  # symmetric at 0
    assert torch.isfinite(radius.grad) and torch.isfinite(noise.grad)
    point = torch.tensor([0.3, -1.1, 2.0, 0.4], dtype=torch.float64, requires_grad=True)
    params = torch.tensor([1.2, 0.6], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda v, p: CircularStep(torch.zeros(4, dtype=torch.float64), p[0], p[1]).log_prob(v),
        (point, params),
    )


def test_circular_step_rejects_bad_arguments_and_expands():
    with pytest.raises(ValueError, match=r"\(\.\.\., 2K\)"):
        CircularStep(torch.zeros(3), 1.0, 1.0)
    with pytest.raises(ValueError, match="noise"):
        CircularStep(torch.zeros(2), 1.0, -1.0, validate_args=True)
    dist = CircularStep(torch.zeros(4), torch.tensor([1.0, 2.0]), 0.5).expand((5,))
    assert dist.batch_shape == (5,) and dist.event_shape == (4,)
    assert dist.sample().shape == (5, 4) and dist.log_prob(torch.ones(5, 4)).shape == (5,)


def test_prior_declares_its_sites_with_the_stated_densities():
    prior = BallDynamicsPrior(num_balls=2, centre=16.0, spread=8.0, step_length=5.0, noise=0.5)
    with pyro.plate("pairs", 7):
        trace = poutine.trace(prior).get_trace(None, None)
    trace.compute_log_prob()
    z, z2 = trace.nodes["z"]["value"], trace.nodes["z2"]["value"]
    assert z.shape == z2.shape == (7, 4)
    torch.testing.assert_close(trace.nodes["z"]["log_prob"],
                               Normal(16.0, 8.0).log_prob(z).sum(-1))
    expected = CircularStep(z, torch.tensor(5.0), torch.tensor(0.5)).log_prob(z2)
    torch.testing.assert_close(trace.nodes["z2"]["log_prob"], expected)
    # every ball moved by about the step length
    steps = (z2 - z).reshape(7, 2, 2).norm(dim=-1)
    assert ((steps - 5.0).abs() < 3.0).all()
    with pytest.raises(ValueError, match="num_balls"):
        BallDynamicsPrior(num_balls=0)
    with pytest.raises(ValueError, match="step_length"):
        BallDynamicsPrior(step_length=0.0)


def test_prior_in_an_rpm_needs_noise_and_matches_trace_elbo():
    net = torch.nn.Linear(5, 4)
    with pytest.raises(ValueError, match="noise_scale"):
        rpm.RPM(rpm.DeltaRecognition(net), BallDynamicsPrior(num_balls=2))
    model = rpm.RPM(rpm.DeltaRecognition(net, noise_scale=0.3),
                    BallDynamicsPrior(num_balls=2, step_length=0.5, noise=0.4))
    x, x2 = torch.randn(6, 5), torch.randn(6, 5)
    with pyro.poutine.seed(rng_seed=3):
        fast = rpm.RPMELBO().differentiable_loss(model.model, model.guide, x, x2)
    with pyro.poutine.seed(rng_seed=3):
        slow = pyro.infer.Trace_ELBO().differentiable_loss(model.model, model.guide, x, x2)
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-4)
