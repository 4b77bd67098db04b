"""ConcatenatedBatch: two batches of any family as one, the components of the pooled marginal."""

import math

import pytest
import torch
from pyro.distributions import Normal, ProjectedNormal, StudentT

from rpm.marginals import MixtureMarginal
from rpm.marginals._concatenated import ConcatenatedBatch
from rpm.priors._pooled import pooled_marginal


def test_rows_are_evaluated_under_their_own_components_and_broadcast_against_all():
    first = StudentT(3.0, torch.randn(3, 2, dtype=torch.float64), 0.7).to_event(1)
    second = StudentT(3.0, torch.randn(2, 2, dtype=torch.float64), 1.3).to_event(1)
    both = ConcatenatedBatch(first, second)
    assert both.batch_shape == (5,) and both.event_shape == (2,)
    value = torch.randn(4, 5, 2, dtype=torch.float64)
    expected = torch.cat([first.log_prob(value[:, :3]), second.log_prob(value[:, 3:])], -1)
    torch.testing.assert_close(both.log_prob(value), expected, rtol=0, atol=0)
    rows = torch.randn(6, 1, 2, dtype=torch.float64)
    assert both.log_prob(rows).shape == (6, 5)
    torch.testing.assert_close(both.log_prob(rows)[:, 4], second.log_prob(rows)[:, 1])
    assert both.sample((7,)).shape == (7, 5, 2)


def test_pooled_marginal_of_sphere_recognition_is_the_mixture_of_both_views():
    """Q_pool(z) = (1/2N) sum_k Q(z | x_k) over both views: against a loop over the 2N components."""
    c, c2 = torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
    marginal = pooled_marginal(ProjectedNormal(c), ProjectedNormal(c2))
    assert marginal.family == "generic" and marginal.batch_shape == (4,)
    z = ProjectedNormal(c).sample()
    components = [ProjectedNormal(row) for row in torch.cat([c, c2])]
    expected = torch.stack([
        torch.logsumexp(torch.stack([q.log_prob(point) for q in components]), 0) - math.log(8)
        for point in z])
    torch.testing.assert_close(marginal.log_prob(z), expected, rtol=0, atol=1e-12)


def test_mismatched_batches_are_refused():
    with pytest.raises(ValueError, match="same dimension"):
        ConcatenatedBatch(Normal(torch.zeros(3, 2), 1.0).to_event(1),
                          Normal(torch.zeros(3, 4), 1.0).to_event(1))
    with pytest.raises(ValueError, match="to_event|batch_shape"):
        MixtureMarginal(ConcatenatedBatch(Normal(torch.zeros(3, 2), 1.0),
                                          Normal(torch.zeros(3, 2), 1.0)))
