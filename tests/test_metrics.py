"""Tests of rpm.metrics: known answers, an independent numpy implementation, and the errors."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from rpm.metrics import block_r2, mcc, mcc_per_dimension, r2, r2_per_dimension


def data(n: int = 2000, d: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def numpy_r2(z_true: np.ndarray, z_hat: np.ndarray, num_train: int) -> np.ndarray:
    """Independent reference: one least-squares fit per true dimension, R^2 from its definition."""
    design = np.hstack([z_hat, np.ones((len(z_hat), 1))])
    out = []
    for d in range(z_true.shape[1]):
        coef, *_ = np.linalg.lstsq(design[:num_train], z_true[:num_train, d], rcond=None)
        y = z_true[num_train:, d]
        pred = design[num_train:] @ coef
        out.append(1 - np.sum((y - pred) ** 2) / np.sum((y - y.mean()) ** 2))
    return np.array(out)


def brute_force_mcc(z_true: np.ndarray, z_hat: np.ndarray) -> float:
    """Independent reference: np.corrcoef and every injective matching."""
    n, m = z_true.shape[1], z_hat.shape[1]
    corr = np.abs(np.corrcoef(z_true.T, z_hat.T)[:n, n:])
    return max(np.mean([corr[i, j] for i, j in enumerate(perm)])
               for perm in itertools.permutations(range(m), n))


def test_affine_copy_gives_r2_one():
    z = data()
    q, _ = torch.linalg.qr(torch.randn(4, 4, dtype=torch.float64))
    z_hat = z @ (q * torch.tensor([3.0, 0.5, 1.0, 2.0])) + torch.tensor([1.0, -2.0, 0.0, 5.0])
    assert r2(z, z_hat) == pytest.approx(1.0, abs=1e-10)
    torch.testing.assert_close(r2_per_dimension(z, z_hat), torch.ones(4, dtype=torch.float64))
    assert isinstance(r2(z, z_hat), float)


def test_permuted_rescaled_copy_gives_mcc_one_and_the_permutation():
    z = data()
    perm = [2, 0, 3, 1]
    z_hat = z[:, perm] * torch.tensor([2.0, -1.0, 0.3, -5.0]) + 7.0
    assert mcc(z, z_hat) == pytest.approx(1.0, abs=1e-12)
    matched = mcc_per_dimension(z, z_hat)
    # true dimension d sits in column perm.index(d) of z_hat
    assert matched.index.tolist() == [perm.index(d) for d in range(4)]
    assert isinstance(mcc(z, z_hat), float)


def test_independent_noise_gives_about_zero():
    # N = 8000 samples, 4000 held out: |R^2_d| and |rho| are O(1/sqrt(4000)) ~ 0.016;
    # the tolerances below are several times that (the Hungarian maximum over 16 pairs
    # of |rho| with sd 1/sqrt(8000) = 0.011 is about 0.03).
    z = data(8000, 4, seed=0)
    noise = torch.randn(8000, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert abs(r2(z, noise)) < 0.02
    assert mcc(z, noise) < 0.06


def test_partial_recovery_per_dimension():
    z = data(6000, 3)
    noise = torch.randn(6000, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    z_hat = torch.stack([z[:, 0], noise, z[:, 2] ** 3], dim=1)
    per_dim = r2_per_dimension(z, z_hat)
    assert per_dim[0] == pytest.approx(1.0, abs=1e-10)
    assert abs(float(per_dim[1])) < 0.02
    # the best affine predictor of u from u^3 (u ~ U[0, 1]) has R^2 = corr(u, u^3)^2
    # = (3/40)^2 / ((1/12) (1/7 - 1/16)) = 0.84
    assert float(per_dim[2]) == pytest.approx(0.84, abs=0.015)


@pytest.mark.parametrize("seed", [0, 1])
def test_agrees_with_independent_numpy_implementations(seed):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(500, 4, generator=g, dtype=torch.float64)
    z_hat = torch.tanh(z @ torch.randn(4, 5, generator=g, dtype=torch.float64)) \
        + 0.3 * torch.randn(500, 5, generator=g, dtype=torch.float64)
    np.testing.assert_allclose(r2_per_dimension(z, z_hat, num_train=300).numpy(),
                               numpy_r2(z.numpy(), z_hat.numpy(), 300), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(r2_per_dimension(z, z_hat, train_fraction=0.3).numpy(),
                               numpy_r2(z.numpy(), z_hat.numpy(), 150), rtol=1e-9, atol=1e-12)
    assert mcc(z, z_hat) == pytest.approx(brute_force_mcc(z.numpy(), z_hat.numpy()), abs=1e-12)


def test_float32_inputs_are_computed_in_float64():
    z = data().float()
    assert r2(z, 2 * z + 1) == pytest.approx(1.0, abs=1e-6)
    assert r2_per_dimension(z, z).dtype == torch.float64


def test_rank_deficient_representation_is_handled():
    # a collapsed representation (duplicated column) is rank deficient; gelsd still fits it
    z = data()
    z_hat = torch.cat([z[:, :3], z[:, :1]], dim=1)
    per_dim = r2_per_dimension(z, z_hat)
    assert float(per_dim[:3].min()) == pytest.approx(1.0, abs=1e-10)
    assert abs(float(per_dim[3])) < 0.02


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_inputs():
    z = data().cuda()
    assert r2(z, 3 * z) == pytest.approx(1.0, abs=1e-10)
    assert mcc(z, -z) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("fn", [r2, mcc])
def test_errors(fn):
    z = data(100, 3)
    with pytest.raises(ValueError, match="same number of samples"):
        fn(z, z[:50])
    with pytest.raises(TypeError, match="torch.Tensor"):
        fn(z.numpy(), z)
    with pytest.raises(ValueError, match=r"shape \(num_samples, dim\)"):
        fn(z[:, 0], z[:, 0])
    bad = z.clone()
    bad[5, 1] = math.nan
    with pytest.raises(ValueError, match=r"NaN or infinite values \(columns \[1\]\)"):
        fn(z, bad)
    const = z.clone()
    const[:, 2] = 1.0
    with pytest.raises(ValueError, match=r"\[2\] .*constant"):
        fn(const, z)
    with pytest.raises(ValueError, match="too few samples"):
        fn(z[:2], z[:2])


def test_r2_split_errors():
    z = data(100, 3)
    with pytest.raises(ValueError, match="train_fraction"):
        r2(z, z, train_fraction=1.0)
    with pytest.raises(ValueError, match="too few samples"):
        r2(z, z, num_train=99)
    with pytest.raises(ValueError, match="too few samples"):
        r2(z[:6], z[:6])
    with pytest.raises(TypeError, match="num_train"):
        r2(z, z, num_train=50.0)  # type: ignore[arg-type]


def test_mcc_needs_enough_recovered_dimensions():
    z = data(100, 3)
    with pytest.raises(ValueError, match="at least as many dimensions"):
        mcc(z, z[:, :2])
    assert mcc(z[:, :2], z) == pytest.approx(1.0)


# --------------------------------------------------------------------------- block R^2
def numpy_kernel_ridge_r2(y: np.ndarray, x: np.ndarray, num_train: int, alpha: float,
                          gamma: float) -> float:
    """Independent reference: standardise with the training split, solve (K + alpha I) w = y
    per output with an explicit float64 Gram matrix, R^2 per output from its definition."""
    def standardise(a):
        return (a - a[:num_train].mean(0)) / a[:num_train].std(0, ddof=1)
    x, y = standardise(x), standardise(y)
    u, v = x[:num_train], x[num_train:]
    gram = np.array([[math.exp(-gamma * np.sum((a - b) ** 2)) for b in u] for a in u])
    cross = np.array([[math.exp(-gamma * np.sum((a - b) ** 2)) for b in u] for a in v])
    out = []
    for d in range(y.shape[1]):
        weights = np.linalg.solve(gram + alpha * np.eye(num_train), y[:num_train, d])
        target = y[num_train:, d]
        out.append(1 - np.sum((target - cross @ weights) ** 2)
                   / np.sum((target - target.mean()) ** 2))
    return float(np.mean(out))


def test_block_r2_nonlinear_is_kernel_ridge_with_the_chosen_hyperparameters():
    z = data(120, 2, seed=3)
    x = torch.cat([torch.sin(3 * z), z[:, :1] ** 2], dim=1)        # (N, 3) nonlinear in z
    for alpha, gamma in [(0.1, 1.0), (0.01, 0.1)]:
        got = block_r2(z, x, nonlinear=True, num_train=80, alphas=(alpha,), gammas=(gamma,))
        want = numpy_kernel_ridge_r2(z.numpy(), x.numpy(), 80, alpha, gamma)
        assert got == pytest.approx(want, abs=1e-8)


def test_block_r2_linear_is_r2():
    z, x = data(300, 3, seed=1), data(300, 5, seed=2)
    x = x + torch.cat([z, z[:, :2]], dim=1)
    assert block_r2(z, x) == r2(z, x)


def test_block_r2_separates_a_nonlinearly_encoded_block_from_an_absent_one():
    gen = torch.Generator().manual_seed(0)
    content = torch.randn(1200, 2, generator=gen, dtype=torch.float64)
    style = torch.randn(1200, 2, generator=gen, dtype=torch.float64)
    code = torch.cat([content ** 3 + content, torch.tanh(content[:, :1])], dim=1)  # content only
    nonlinear = block_r2(content, code, nonlinear=True)
    assert nonlinear > 0.95
    assert nonlinear > block_r2(content, code) + 0.01   # the linear read-out misses the cube
    assert abs(block_r2(style, code, nonlinear=True)) < 0.05
    assert abs(block_r2(style, code)) < 0.05


@pytest.mark.parametrize("kwargs, match", [
    (dict(alphas=()), "alphas"),
    (dict(gammas=(0.1, -1.0)), "gammas"),
    (dict(folds=1), "folds"),
    (dict(num_train=4), "too few samples"),
    (dict(train_fraction=1.0), "train_fraction"),
])
def test_block_r2_errors(kwargs, match):
    z = data(40, 2)
    with pytest.raises(ValueError, match=match):
        block_r2(z, z, nonlinear=True, **kwargs)
    with pytest.raises(ValueError, match="constant"):
        block_r2(torch.ones(40, 2, dtype=torch.float64), z, nonlinear=True)
