"""The blocked Lp kernel against a float64 loop over pairs and coordinates written from the
equation S_ij = sum_d |z_id - z'_jd|^p, its derivative p sign(d) |d|^(p-1) (0 at d = 0), and
its range behaviour."""

import math

import pytest
import torch

from rpm.ops import lp_distances
from rpm.ops._lp_distances import lp_paired_distances

pytestmark = pytest.mark.usefixtures("one_torch_thread")

P_VALUES = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 7.0, 10.0, 0.7, 13.3]


def loop_value_and_grads(z, z2, p, weights):
    """S and the gradients of sum_ij w_ij S_ij, one pair and one coordinate at a time, float64."""
    z, z2, weights = z.double(), z2.double(), weights.double()
    n, m = weights.shape
    dim = z.shape[1]
    value = torch.zeros(n, m, dtype=torch.float64)
    grad_z = torch.zeros_like(z)
    grad_z2 = torch.zeros_like(z2)
    for i in range(n):
        for j in range(m):
            for d in range(dim):
                diff = float(z[i, d] - z2[j, d])
                value[i, j] += abs(diff) ** p
                slope = 0.0 if diff == 0 else p * math.copysign(abs(diff) ** (p - 1), diff)
                grad_z[i, d] += weights[i, j] * slope
                grad_z2[j, d] -= weights[i, j] * slope
    return value, grad_z, grad_z2


@pytest.mark.parametrize("p", P_VALUES)
@pytest.mark.parametrize("block_size", [None, 1, 3])
def test_matches_float64_loop(p, block_size):
    z = torch.randn(7, 3, dtype=torch.float64, requires_grad=True)
    z2 = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(7, 5, dtype=torch.float64)
    actual = lp_distances(z, z2, p, block_size=block_size)
    grads = torch.autograd.grad((actual * weights).sum(), (z, z2))
    expected, *expected_grads = loop_value_and_grads(z.detach(), z2.detach(), p, weights)
    torch.testing.assert_close(actual, expected, rtol=1e-14, atol=0)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("p", P_VALUES)
def test_float32_matches_float64(p):
    z = torch.randn(40, 6)
    z2 = torch.randn(30, 6)
    weights = torch.randn(40, 30)
    results = []
    for dtype in (torch.float32, torch.float64):
        a, b = z.to(dtype).requires_grad_(), z2.to(dtype).requires_grad_()
        value = lp_distances(a, b, p)
        grads = torch.autograd.grad((value * weights.to(dtype)).sum(), (a, b))
        results.append([value.double(), *[g.double() for g in grads]])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


@pytest.mark.parametrize("p", P_VALUES)
def test_paired_is_the_diagonal(p):
    z = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    z2 = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    z2.data[2, 1] = z.data[2, 1]  # one coordinate difference exactly 0
    weights = torch.randn(6, dtype=torch.float64)
    paired = lp_paired_distances(z, z2, p)
    grads = torch.autograd.grad((paired * weights).sum(), (z, z2))
    full = lp_distances(z, z2, p)
    expected = torch.diagonal(full)
    expected_grads = torch.autograd.grad((expected * weights).sum(), (z, z2))
    torch.testing.assert_close(paired, expected, rtol=1e-15, atol=0)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-14, atol=0)


@pytest.mark.parametrize("p", [0.5, 0.8, 1.0, 1.5, 3.0])
def test_zero_difference_has_zero_subgradient(p):
    """At z_d = z'_d the derivative is 0 for every p (for p < 1 the chosen subgradient), and
    the other coordinates keep theirs."""
    z = torch.tensor([[0.3, 1.0]], dtype=torch.float64, requires_grad=True)
    z2 = torch.tensor([[0.3, -0.5]], dtype=torch.float64, requires_grad=True)
    grad_z, grad_z2 = torch.autograd.grad(lp_distances(z, z2, p).sum(), (z, z2))
    assert grad_z[0, 0] == 0 and grad_z2[0, 0] == 0
    torch.testing.assert_close(grad_z[0, 1], torch.tensor(p * 1.5 ** (p - 1), dtype=torch.float64))
    assert torch.isfinite(grad_z).all() and torch.isfinite(grad_z2).all()


def test_subnormal_difference_has_finite_slope():
    z = torch.tensor([[1e-44]])
    z2 = torch.zeros(1, 1)
    z.requires_grad_()
    (grad,) = torch.autograd.grad(lp_distances(z, z2, 0.5).sum(), z)
    assert torch.isfinite(grad).all() and grad.item() > 0


def test_overflowed_entries_with_zero_gradient_contribute_nothing():
    """p = 100 in float32: |d|^100 and its slope overflow for |d| = 3, yet a zero upstream
    gradient on that pair leaves the others' gradients finite and exact."""
    z = torch.tensor([[0.0], [1.0]], requires_grad=True)
    z2 = torch.tensor([[0.5], [3.0]], requires_grad=True)
    value = lp_distances(z, z2, 100.0)
    assert torch.isinf(value[0, 1])
    weights = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    grad_z, grad_z2 = torch.autograd.grad((value * weights).sum(), (z, z2))
    assert torch.isfinite(grad_z[0]).all()
    torch.testing.assert_close(grad_z[0, 0], torch.tensor(-100 * 0.5 ** 99))


def test_errors():
    with pytest.raises(ValueError, match="same D"):
        lp_distances(torch.randn(3, 2), torch.randn(3, 4), 1.0)
    with pytest.raises(TypeError, match="dtype"):
        lp_distances(torch.randn(3, 2), torch.randn(3, 2).double(), 1.0)
    with pytest.raises(ValueError, match="p must"):
        lp_distances(torch.randn(3, 2), torch.randn(3, 2), 0.0)
    with pytest.raises(ValueError, match="block_size"):
        lp_distances(torch.randn(3, 2), torch.randn(3, 2), 1.0, block_size=0)
    with pytest.raises(ValueError, match="one shape"):
        lp_paired_distances(torch.randn(3, 2), torch.randn(4, 2), 1.0)


@pytest.mark.parametrize("p", [0.5, 1.0, 3.0, 10.0])
def test_scale_and_its_gradient(p):
    """S = sum_d |c d|^p with c a tensor: values, and gradients of z, z2 and c against autograd
    of the broadcast formula in float64 (no zero differences, where both are smooth)."""
    z = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    z2 = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    c = torch.tensor(0.37, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(5, 4, dtype=torch.float64)
    actual = lp_distances(z, z2, p, c, block_size=2)
    grads = torch.autograd.grad((actual * weights).sum(), (z, z2, c))
    expected = (c * (z[:, None] - z2[None])).abs().pow(p).sum(-1)
    expected_grads = torch.autograd.grad((expected * weights).sum(), (z, z2, c))
    torch.testing.assert_close(actual, expected, rtol=1e-13, atol=0)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-12)
    paired = lp_paired_distances(z[:4], z2, p, c)
    paired_grads = torch.autograd.grad(paired.sum(), (z, c))
    want = (c * (z[:4] - z2)).abs().pow(p).sum(-1)
    want_grads = torch.autograd.grad(want.sum(), (z, c))
    torch.testing.assert_close(paired, want, rtol=1e-13, atol=0)
    for got, want in zip(paired_grads, want_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-12)


def test_scale_applies_to_the_difference():
    """Two points 1e-3 apart at 1e3 from the origin, c = 1e3: the float32 result is the
    scaled float32 difference (1.0 to float32 rounding), not the difference of two scaled
    coordinates (which would round to ~0.06 in float32)."""
    z = torch.tensor([[1000.0]])
    z2 = torch.tensor([[1000.0 - 1e-3]])
    exact = (z.double() - z2.double()).abs() * 1e3
    actual = lp_distances(z, z2, 1.0, 1e3)
    torch.testing.assert_close(actual.double(), exact, rtol=1e-6, atol=0)


def test_blocks_are_cache_sized_on_the_cpu_and_whole_batches_on_an_accelerator():
    """Rows per block: 2^17 elements per (D, rows, M) block on the CPU, 2^26 elsewhere (a
    4096 x 4096 batch in 10 dimensions: 3 rows against 1638), a given block size as it is."""
    from rpm.ops._lp_distances import _rows_per_block

    assert _rows_per_block(4096, 10, None, "cpu") == (1 << 17) // 40960 == 3
    assert _rows_per_block(4096, 10, None, "cuda") == (1 << 26) // 40960 == 1638
    assert _rows_per_block(10**9, 10, None, "cuda") == 1
    assert _rows_per_block(4096, 10, 7, "cuda") == 7


@pytest.mark.parametrize("q", [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.5, 7.0, 16.0, -0.5, 0.3, 17.0])
def test_abs_power_is_pow_for_every_exponent(q):
    """The multiplication chains of the integer and half-integer exponents (and q = 0: 1) agree
    with torch.pow in float64."""
    from rpm.ops._lp_distances import _abs_power

    magnitude = torch.rand(50, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * 3
    torch.testing.assert_close(_abs_power(magnitude.clone(), q), magnitude.pow(q), rtol=1e-13, atol=0)
