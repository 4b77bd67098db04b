"""MixtureMarginal: log_prob against loops, the empirical (Delta) case, and sampling moments."""

import math

import pytest
import torch
from pyro.distributions import Delta, Normal

from rpm import MixtureMarginal
from rpm.marginals import delta_mixture_log_prob


def test_gaussian_log_prob_matches_torch_mixture():
    """Against torch.distributions.MixtureSameFamily, an independent implementation."""
    n, d = 9, 3
    loc = torch.randn(n, d, dtype=torch.float64)
    scale = torch.rand(n, d, dtype=torch.float64) + 0.3
    reference = torch.distributions.MixtureSameFamily(
        torch.distributions.Categorical(logits=torch.zeros(n, dtype=torch.float64)),
        torch.distributions.Independent(torch.distributions.Normal(loc, scale), 1),
    )
    marginal = MixtureMarginal(Normal(loc, scale).to_event(1))
    assert marginal.batch_shape == (n,) and marginal.event_shape == (d,)
    z = torch.randn(4, 2, d, dtype=torch.float64)
    torch.testing.assert_close(marginal.log_prob(z), reference.log_prob(z), rtol=0, atol=1e-12)


def test_delta_marginal_counts_atoms():
    points = torch.tensor([[0.0, 1.0], [2.0, 3.0], [0.0, 1.0], [5.0, 5.0]])
    marginal = MixtureMarginal(Delta(points, event_dim=1))
    assert marginal.is_discrete
    expected = torch.tensor([math.log(2 / 4), math.log(1 / 4), math.log(2 / 4), math.log(1 / 4)])
    torch.testing.assert_close(marginal.log_prob(points), expected)
    assert marginal.log_prob(torch.tensor([[9.0, 9.0]])).item() == -math.inf
    loo = delta_mixture_log_prob(points, points, exclude_self=True)
    torch.testing.assert_close(
        loo, torch.tensor([math.log(1 / 3), -math.inf, math.log(1 / 3), -math.inf])
    )


def test_sampling_moments():
    """The mixture mean is the mean of the locs; its variance the mean of (scale^2 + loc^2)
    minus the squared mean. Monte Carlo with 200k draws: tolerance 5 standard errors."""
    n, d = 5, 2
    loc = torch.randn(n, d, dtype=torch.float64) * 2
    scale = torch.rand(n, d, dtype=torch.float64) + 0.1
    marginal = MixtureMarginal(Normal(loc, scale).to_event(1))
    draws = marginal.sample((40000,)).reshape(-1, d)  # 40000 x n draws
    assert draws.shape == (40000 * n, d)
    mean = loc.mean(0)
    var = (scale**2 + loc**2).mean(0) - mean**2
    se = (var / draws.shape[0]).sqrt()
    assert ((draws.mean(0) - mean).abs() < 5 * se).all()
    assert ((draws.var(0) - var).abs() < 0.02 * var).all()


def test_delta_sampling_picks_atoms_uniformly():
    points = torch.arange(8.0).reshape(4, 2)
    draws = MixtureMarginal(Delta(points, event_dim=1)).sample((20000,)).reshape(-1, 2)
    index = (draws[:, 0] / 2).long()
    frequency = torch.bincount(index, minlength=4).double() / index.numel()
    assert (frequency - 0.25).abs().max() < 0.01  # 80000 draws: SE 0.0015


def test_rejects_unsupported_and_bad_values():
    with pytest.raises(TypeError, match="GaussianRecognition"):
        MixtureMarginal(torch.distributions.Laplace(torch.zeros(3, 2), 1.0))
    marginal = MixtureMarginal(Normal(torch.zeros(3, 2), 1.0).to_event(1), validate_args=True)
    with pytest.raises(ValueError, match=r"\(\.\.\., 2\)"):
        marginal.log_prob(torch.zeros(3, 5))
    with pytest.raises(ValueError, match="NaN"):
        marginal.log_prob(torch.full((3, 2), float("nan")))
