"""The streamed log-normaliser of a matrix product, alone and as the InfoNCE normaliser of the
matrix-product energies, against the dense ``torch.logsumexp`` of the full matrix."""

import math

import pytest
import torch

from rpm.ops import streaming_matmul_logsumexp
from rpm.ops._logsumexp import diagonal_log_softmax
from rpm.priors import (
    AnisotropicEnergy,
    BilinearEnergy,
    CosineEnergy,
    ImplicitPrior,
    LpEnergy,
    NeuralEnergy,
    RBFEnergy,
)
from rpm.priors._implicit import energy_log_normalizer, energy_logit_factors


def dense_log_ratio(logits):
    """The implicit prior's per-pair log-ratio from its (N, N) logits, as its dense path
    computes it (rpm.ops._logsumexp.diagonal_log_softmax): F_ii - logsumexp_j F_ij + log N."""
    return diagonal_log_softmax(logits, math.log(logits.shape[-1]))

cuda = pytest.mark.cuda


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def lse_loop(left, right):
    """log sum_j exp(a_i . b_j), one row at a time."""
    return torch.stack([torch.logsumexp((right * row).sum(-1), 0) for row in left])


@pytest.mark.parametrize("block_size", [1, 4, 7, 100])
def test_matmul_logsumexp_matches_loop(block_size):
    left = torch.randn(19, 3, dtype=torch.float64, requires_grad=True)
    right = torch.randn(11, 3, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(19, dtype=torch.float64)
    actual = streaming_matmul_logsumexp(left, right, block_size)
    grads = torch.autograd.grad((actual * weights).sum(), (left, right))
    expected = lse_loop(left, right)
    expected_grads = torch.autograd.grad((expected * weights).sum(), (left, right))
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-12)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_matmul_logsumexp_gradcheck():
    left = torch.randn(6, 2, dtype=torch.float64, requires_grad=True)
    right = torch.randn(5, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b: streaming_matmul_logsumexp(a, b, block_size=4), (left, right)
    )


def test_matmul_logsumexp_saves_no_matrix():
    left = torch.randn(300, 4, requires_grad=True)
    right = torch.randn(300, 4, requires_grad=True)
    sizes = []

    def pack(tensor):
        sizes.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        streaming_matmul_logsumexp(left, right, block_size=50)
    assert max(sizes) <= 300 * 4


def test_matmul_logsumexp_errors():
    with pytest.raises(ValueError, match="same K"):
        streaming_matmul_logsumexp(torch.randn(3, 2), torch.randn(3, 4))
    with pytest.raises(ValueError, match="block_size"):
        streaming_matmul_logsumexp(torch.randn(3, 2), torch.randn(3, 2), block_size=-1)
    with pytest.raises(TypeError, match="dtype"):
        streaming_matmul_logsumexp(torch.randn(3, 2), torch.randn(3, 2).double())


ENERGIES = {
    "bilinear": lambda dim: BilinearEnergy(dim, init_scale=0.7),
    "cosine": lambda dim: CosineEnergy(kappa=5.0, learn_kappa=True),
    "rbf": lambda dim: RBFEnergy(lengthscale=0.8),
    "anisotropic": lambda dim: AnisotropicEnergy(dim, normalize=True, init=3.0),
    "anisotropic-raw": lambda dim: AnisotropicEnergy(dim, normalize=False, init=0.5),
    "l2": lambda dim: LpEnergy(p=2.0, tau=0.5, learn_tau=True),
}


@pytest.mark.parametrize("name", sorted(ENERGIES))
def test_energy_normalizer_matches_dense(name):
    """Values and gradients (latents and the energy's parameters), float64, odd blocks."""
    torch.set_default_dtype(torch.float64)
    energy = ENERGIES[name](4)
    with torch.no_grad():
        for param in energy.parameters():
            param.add_(0.1 * torch.randn_like(param))
    z = (3.0 + torch.randn(13, 4)).requires_grad_()  # offset: exercises the centring
    z2 = (3.0 + torch.randn(17, 4)).requires_grad_()
    inputs = (z, z2, *energy.parameters())
    weights = torch.randn(13)
    actual = energy_log_normalizer(energy, z, z2, block_size=5)
    grads = torch.autograd.grad((actual * weights).sum(), inputs)
    expected = torch.logsumexp(energy(z, z2), dim=-1)
    expected_grads = torch.autograd.grad((expected * weights).sum(), inputs)
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-10)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-10)


def test_non_product_energies_fall_back_to_dense():
    torch.set_default_dtype(torch.float64)
    z, z2 = torch.randn(6, 3), torch.randn(8, 3)
    for energy in (LpEnergy(p=1.0), NeuralEnergy(3, hidden=5)):
        assert energy_logit_factors(energy, z, z2) is None
        torch.testing.assert_close(
            energy_log_normalizer(energy, z, z2, block_size=3),
            torch.logsumexp(energy(z, z2), -1), rtol=0, atol=1e-12,
        )


def test_log_ratio_with_negatives_and_blocks():
    """ImplicitPrior.log_ratio: streamed == dense, and with extra negatives it is the InfoNCE
    term of a batch whose candidates are all of them: F_ii - LSE_j F_ij + log M."""
    torch.set_default_dtype(torch.float64)
    prior = ImplicitPrior(RBFEnergy(lengthscale=0.6))
    z, z2 = torch.randn(9, 3), torch.randn(9, 3)
    dense = prior.log_ratio(z, z2)
    torch.testing.assert_close(dense, dense_log_ratio(prior.energy(z, z2)), rtol=0, atol=0)
    torch.testing.assert_close(prior.log_ratio(z, z2, block_size=4), dense, rtol=0, atol=1e-12)
    negatives = torch.cat([torch.randn(5, 3), z2, torch.randn(3, 3)])
    matrix = prior.energy(z, negatives)  # (9, 17); the positive of row i is column 5 + i
    expected = matrix[torch.arange(9), 5 + torch.arange(9)] - matrix.logsumexp(-1) + math.log(17)
    torch.testing.assert_close(
        prior.log_ratio(z, z2, candidates=negatives, block_size=4), expected, rtol=0, atol=1e-12
    )


def test_cpu_streams_by_default_above_its_threshold(monkeypatch):
    """On the CPU, log_ratio streams the normaliser from 2**18 pairs on (the faster path there)
    and the result equals the dense InfoNCE term; below the threshold it stays dense."""
    import rpm.priors._implicit as implicit

    calls = []

    def counting(left, right, block_size=None):
        calls.append(left.shape[0])
        return streaming_matmul_logsumexp(left, right, block_size)

    monkeypatch.setattr(implicit, "streaming_matmul_logsumexp", counting)
    torch.set_default_dtype(torch.float64)
    prior = ImplicitPrior(CosineEnergy(kappa=3.0))
    small, large = 2**9, 2**9 + 1  # 2**18 pairs: dense; one row and column more: streamed
    for size in (small, large):
        z, z2 = torch.randn(size, 5), torch.randn(size, 5)
        torch.testing.assert_close(prior.log_ratio(z, z2), dense_log_ratio(prior.energy(z, z2)),
                                   rtol=0, atol=1e-10)
    assert calls == [large]


def test_large_dense_log_ratio_builds_its_matrix_once():
    """Above the streaming threshold, a user's energy without a matrix-product form (and without
    its own ``paired``) stays dense: one N x N matrix serves the positives and the normaliser,
    and the result is the InfoNCE term."""
    from rpm.priors._energies import Energy

    class CountingL1(Energy):
        calls = 0

        def forward(self, z, z2):
            CountingL1.calls += 1
            return -torch.cdist(z, z2, p=1.0)

    torch.set_default_dtype(torch.float64)
    prior = ImplicitPrior(CountingL1())
    z, z2 = torch.randn(2**9 + 1, 3), torch.randn(2**9 + 1, 3)
    expected = dense_log_ratio(-torch.cdist(z, z2, p=1.0))
    torch.testing.assert_close(prior.log_ratio(z, z2), expected, rtol=0, atol=1e-12)
    assert CountingL1.calls == 1


@cuda
def test_cuda_matches_cpu():
    left, right = torch.randn(700, 8, dtype=torch.float64), torch.randn(900, 8, dtype=torch.float64)
    expected = streaming_matmul_logsumexp(left, right, block_size=128)
    allow_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        actual = streaming_matmul_logsumexp(left.float().cuda(), right.float().cuda(), 128)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    assert (actual.double().cpu() - expected).abs().max().item() < 1e-4
