"""``rpm.data.synthetic.mixing``: the invertible MLP against a numpy forward pass, its inverse,
conditioning and seeding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rpm.data.synthetic import (
    InvertibleMLP,
    LatentProcess,
)
from tests.data.synthetic.helpers import gen


def test_mixing_is_exactly_invertible_and_well_conditioned():
    g = InvertibleMLP(10, num_layers=3, seed=1)
    z = LatentProcess(dim=10).sample_marginal(2000, gen())
    x = g(z)
    assert float((g.inverse(x) - z).abs().max()) < 1e-5
    cond = g.condition_numbers()
    assert len(cond) == 3 and all(1.0 <= c <= 5.0 * (1 + 1e-9) for c in cond)
    g64 = InvertibleMLP(6, num_layers=4, seed=2, max_condition_number=20.0, dtype=torch.float64)
    z64 = torch.randn(500, 6, dtype=torch.float64)
    assert float((g64.inverse(g64(z64)) - z64).abs().max()) < 1e-12
    assert all(c <= 20.0 * (1 + 1e-9) for c in g64.condition_numbers())


def test_mixing_matches_a_numpy_forward_and_is_frozen_nonlinear_and_seeded():
    g = InvertibleMLP(5, seed=3, dtype=torch.float64)
    z = torch.randn(300, 5, dtype=torch.float64)
    h = z.numpy()
    for i, layer in enumerate(g.layers):
        h = h @ layer.weight.numpy().T + layer.bias.numpy()
        if i < 2:
            h = np.where(h > 0, h, 0.2 * h)
    np.testing.assert_allclose(g(z).numpy(), h, rtol=1e-12, atol=1e-12)
    assert all(not p.requires_grad for p in g.parameters()) and len(list(g.parameters())) == 6
    a, b = torch.randn(2, 200, 5, dtype=torch.float64)
    assert float((g(a) + g(b) - 2 * g((a + b) / 2)).abs().max()) > 1e-2     # not affine
    assert torch.equal(InvertibleMLP(5, seed=3).layers[0].weight,
                       InvertibleMLP(5, seed=3).layers[0].weight)
    assert not torch.equal(InvertibleMLP(5, seed=3).layers[0].weight,
                           InvertibleMLP(5, seed=4).layers[0].weight)


def test_mixing_errors():
    with pytest.raises(ValueError, match="negative_slope"):
        InvertibleMLP(4, negative_slope=0.0)
    with pytest.raises(ValueError, match="dim"):
        InvertibleMLP(0)
    with pytest.raises(ValueError, match="max_condition_number"):
        InvertibleMLP(4, max_condition_number=0.5)
    with pytest.raises(ValueError, match="last dimension 4"):
        InvertibleMLP(4)(torch.zeros(3, 5))
    with pytest.raises(ValueError, match="last dimension 4"):
        InvertibleMLP(4).inverse(torch.zeros(3, 5))
