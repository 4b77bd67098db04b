"""MixtureMarginal: log_prob against loops, the empirical (Delta) case, and sampling moments."""

import math

import pytest
import torch
from pyro.distributions import Delta, Normal, constraints

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
    with pytest.raises(ValueError, match=r"batch_shape \(3, 2\) and event_shape \(\).*to_event\(1\)"):
        MixtureMarginal(torch.distributions.Laplace(torch.zeros(3, 2), 1.0))
    marginal = MixtureMarginal(Normal(torch.zeros(3, 2), 1.0).to_event(1), validate_args=True)
    with pytest.raises(ValueError, match=r"\(\.\.\., 2\)"):
        marginal.log_prob(torch.zeros(3, 5))
    with pytest.raises(ValueError, match="NaN"):
        marginal.log_prob(torch.full((3, 2), float("nan")))


def test_support_is_the_atoms_for_delta_components_and_real_otherwise():
    points = torch.tensor([[0.0, 1.0], [2.0, 3.0], [5.0, 5.0]])
    delta = MixtureMarginal(Delta(points, event_dim=1))
    assert delta.support.is_discrete and delta.support.event_dim == 1
    value = torch.tensor([[2.0, 3.0], [2.0, 3.5]])
    assert delta.support.check(value).tolist() == [True, False]
    gaussian = MixtureMarginal(Normal(points, 1.0).to_event(1))
    assert not gaussian.support.is_discrete and gaussian.support.event_dim == 1


def test_off_atom_values_have_minus_infinite_log_density():
    points = torch.tensor([[0.0, 1.0], [2.0, 3.0]])
    log_prob = MixtureMarginal(Delta(points, event_dim=1)).log_prob(torch.tensor([[0.0, 1.5]]))
    assert log_prob.item() == -math.inf


@pytest.mark.parametrize("kind", ["gaussian", "delta"])
def test_expand_gives_independent_draws_of_the_same_mixture(kind):
    torch.set_default_dtype(torch.float64)
    points = torch.randn(5, 2)
    q = Normal(points, 0.7).to_event(1) if kind == "gaussian" else Delta(points, event_dim=1)
    marginal = MixtureMarginal(q)
    expanded = marginal.expand((3, 5))
    assert expanded.batch_shape == (3, 5) and expanded.event_shape == (2,)
    assert expanded.sample().shape == (3, 5, 2)
    value = points[torch.randint(5, (3, 5))] + (0.1 * torch.randn(3, 5, 2) if kind == "gaussian"
                                                 else 0.0)
    expected = torch.stack([marginal.log_prob(row) for row in value])
    torch.testing.assert_close(expanded.log_prob(value), expected, rtol=0, atol=1e-12)
    assert marginal.expand((7,)).sample((2,)).shape == (2, 7, 2)  # 7 draws of 5 components


def test_expand_with_exclude_self_keeps_rows_paired_with_components():
    torch.set_default_dtype(torch.float64)
    points = torch.randn(4, 2)
    marginal = MixtureMarginal(Normal(points, 0.5).to_event(1), exclude_self=True)
    expanded = marginal.expand((2, 4))
    value = torch.randn(2, 4, 2)
    expected = torch.stack([marginal.log_prob(row) for row in value])
    torch.testing.assert_close(expanded.log_prob(value), expected, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="last batch dimension stays 4"):
        marginal.expand((3,))


def test_student_t_components_take_the_generic_path_and_match_torch_mixture():
    """Any family with batch_shape (N,), event_shape (D,): against MixtureSameFamily."""
    from pyro.distributions import StudentT
    n, d = 6, 2
    loc = torch.randn(n, d, dtype=torch.float64)
    scale = torch.rand(n, d, dtype=torch.float64) + 0.3
    q = StudentT(2.5, loc, scale).to_event(1)
    marginal = MixtureMarginal(q)
    assert marginal.family == "generic" and marginal.loc is None and not marginal.is_discrete
    assert marginal.batch_shape == (n,) and marginal.event_shape == (d,)
    reference = torch.distributions.MixtureSameFamily(
        torch.distributions.Categorical(logits=torch.zeros(n, dtype=torch.float64)),
        torch.distributions.Independent(torch.distributions.StudentT(2.5, loc, scale), 1),
    )
    z = torch.randn(3, 5, d, dtype=torch.float64)
    torch.testing.assert_close(marginal.log_prob(z), reference.log_prob(z), rtol=0, atol=1e-12)
    value = torch.randn(4, n, d, dtype=torch.float64)
    torch.testing.assert_close(marginal.expand((4, n)).log_prob(value), reference.log_prob(value),
                               rtol=0, atol=1e-12)
    loo = MixtureMarginal(q, exclude_self=True).log_prob(loc)
    expected = torch.stack([
        torch.logsumexp(torch.stack([q.base_dist.log_prob(loc[m])[j].sum()
                                     for j in range(n) if j != m]), 0) - math.log(n - 1)
        for m in range(n)])
    torch.testing.assert_close(loo, expected, rtol=0, atol=1e-12)


def test_generic_sampling_picks_components_uniformly_with_fresh_draws():
    """Well separated Student-t components (scale 1e-3 around 0, 10, 20, 30): the component of
    each draw is read off its location; 4 x 20000 draws, SE of a frequency 0.0015. Every draw
    is its own sample (no two equal), so the mixture's draws are independent."""
    from pyro.distributions import StudentT
    centres = torch.arange(4.0, dtype=torch.float64)[:, None] * 10 * torch.ones(1, 2)
    marginal = MixtureMarginal(StudentT(5.0, centres, 1e-3).to_event(1))
    draws = marginal.sample((20000,))
    assert draws.shape == (20000, 4, 2)
    index = (draws[..., 0] / 10).round().long().reshape(-1)
    frequency = torch.bincount(index, minlength=4).double() / index.numel()
    assert (frequency - 0.25).abs().max() < 0.01
    assert torch.unique(draws.reshape(-1, 2)[:, 0]).numel() == index.numel()
    assert marginal.expand((7,)).sample((3,)).shape == (3, 7, 2)


def test_sphere_components_keep_their_support():
    from pyro.distributions import ProjectedNormal
    marginal = MixtureMarginal(ProjectedNormal(torch.randn(5, 3)))
    assert marginal.support is constraints.sphere
    draws = marginal.sample((100,))
    torch.testing.assert_close(draws.norm(dim=-1), torch.ones(100, 5))
    assert torch.isfinite(marginal.log_prob(draws)).all()
