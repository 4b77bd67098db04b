"""``rpm.data.synthetic.rejection``: the oversampling factor against its defining inequality and
the first accepted proposal against a loop over the proposals."""

from __future__ import annotations

import math

import pytest
import torch

from rpm.data.synthetic.rejection import first_accepted, oversampling_factor


@pytest.mark.parametrize("acceptance", [0.9, 0.5, 0.3, 0.05])
def test_oversampling_factor_is_the_smallest_k_with_a_small_miss_probability(acceptance):
    """K is the least integer with (1 - a)^K <= miss (below the cap)."""
    miss = 1e-6
    k = oversampling_factor(acceptance, miss_probability=miss, max_factor=10_000)
    assert (1 - acceptance) ** k <= miss * (1 + 1e-12)
    assert (1 - acceptance) ** (k - 1) > miss
    expected = next(j for j in range(1, 10_000) if j * math.log1p(-acceptance) <= math.log(miss))
    assert k == expected


def test_oversampling_factor_edge_cases():
    assert oversampling_factor(1.0) == 1
    assert oversampling_factor(1e-6, max_factor=64) == 64
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match=r"acceptance must lie in \(0, 1\]"):
            oversampling_factor(bad)


def test_first_accepted_matches_a_loop_over_the_proposals():
    generator = torch.Generator().manual_seed(0)
    proposal = torch.randn(5, 4, 3, generator=generator)
    accepted = torch.rand(5, 4, 3, generator=generator) < 0.3
    value, found = first_accepted(proposal, accepted)
    for i in range(4):
        for j in range(3):
            hits = [k for k in range(5) if accepted[k, i, j]]
            assert bool(found[i, j]) == bool(hits)
            if hits:
                assert value[i, j] == proposal[hits[0], i, j]
