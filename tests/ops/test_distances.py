"""The squared-distance kernels and the rounding bound of the expansion, against float64."""

import pytest
import torch

from rpm.ops import squared_distances
from rpm.ops._distances import expansion_rounding_bound, squared_distance_factors


def loop_distances(a, b, weight):
    """sum_d w_d (a_id - b_jd)^2, one pair at a time, float64."""
    a, b, weight = a.double(), b.double(), weight.double()
    return torch.stack([torch.stack([(weight * (x - y) ** 2).sum() for y in b]) for x in a])


@pytest.mark.parametrize("offset", [0.0, 30.0, 1e3])
@pytest.mark.parametrize("dim", [1, 16, 128])
def test_float32_expansion_stays_within_its_rounding_bound(offset, dim):
    a = offset + torch.randn(20, dim)
    b = offset + torch.randn(30, dim)
    weight = 0.5 + torch.rand(dim)
    aa = (a.square() * weight).sum(-1)  # (20,)
    bb = (b.square() * weight).sum(-1)  # (30,)
    expanded = aa[:, None] + bb[None, :] - 2.0 * (a * weight) @ b.T  # float32, uncentred
    error = (expanded.double() - loop_distances(a, b, weight)).abs()
    bound = expansion_rounding_bound(aa[:, None].double() + bb[None, :].double(), dim,
                                     torch.float32)
    assert (error <= bound).all()
    assert expansion_rounding_bound(1.0, dim, torch.float64) < 1e-13 * (4 + dim)


def test_squared_distances_match_float64_loop_far_from_the_origin():
    a, b = 1e3 + torch.randn(7, 5), 1e3 + torch.randn(9, 5)
    weight = 0.5 + torch.rand(5)
    got = squared_distances(a, b, weight)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), loop_distances(a, b, weight), rtol=1e-6, atol=1e-5)


def test_factors_reproduce_the_distances_or_are_refused():
    a, b = 1e3 + torch.randn(7, 5), 1e3 + torch.randn(9, 5)
    weight = 0.5 + torch.rand(5)
    left, right, offset = squared_distance_factors(a, b, weight)
    logits = left @ right.T + offset[:, None]
    want = -0.5 * loop_distances(a, b, weight)
    assert (logits.double() - want).abs().max() < 1e-3
    # two tight clusters far apart at a large weight: no centre serves both
    far = torch.cat([a[:3], -a[3:]])
    assert squared_distance_factors(far, far, torch.full((5,), 1e6)) is None
