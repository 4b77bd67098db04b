"""The parallel (associative-scan) Kalman filter, smoother and backward sampler against the
sequential square-root recursions in float64: values and gradients to 1e-8."""

import pytest
import torch

from rpm.ops import _kalman as kalman
from rpm.ops._kalman import backward_sample, kalman_filter, rts_smoother, use_parallel
from tests.ops.test_kalman import random_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CASES = [  # (parameter batch, extra sequence batch, T, time-varying R)
    ((), (), 1, False),
    ((), (), 2, False),
    ((), (3,), 7, True),
    ((3,), (), 16, False),
    ((3,), (), 33, True),
    ((2, 3), (4, 1, 1), 9, False),
]


def run_all(p, z, eps, method, mask=None):
    filtered = kalman_filter(z, **p, mask=mask, method=method)
    smoothed = rts_smoother(filtered, p["transition_matrix"], p["transition_scale_tril"],
                            method=method)
    draws = backward_sample(filtered, p["transition_matrix"], p["transition_scale_tril"], eps,
                            method=method)
    return (*filtered, *smoothed, draws)


@pytest.mark.parametrize("batch,extra,T,time_varying_r", CASES)
def test_parallel_equals_sequential(batch, extra, T, time_varying_r):
    H, D = 4, 2
    p = random_model(batch=batch, H=H, D=D, T=T, time_varying_r=time_varying_r)
    z = torch.randn(*extra, *batch, T, D, dtype=torch.float64)
    eps = torch.randn(2, *extra, *batch, T, H, dtype=torch.float64)
    for seq, par in zip(run_all(p, z, eps, "sequential"), run_all(p, z, eps, "parallel"), strict=True):
        assert seq.shape == par.shape
        assert torch.allclose(seq, par, rtol=0, atol=1e-8)


@pytest.mark.parametrize("masked", [False, True])
def test_parallel_gradients_equal_sequential(masked):
    T, H, D, N = 12, 4, 2, 3
    p = {k: v.requires_grad_() for k, v in random_model(H=H, D=D, T=T, time_varying_r=True).items()}
    z = torch.randn(N, T, D, dtype=torch.float64, requires_grad=True)
    eps = torch.randn(N, T, H, dtype=torch.float64)
    mask = torch.rand(N, T) < 0.7 if masked else None
    weights = [torch.randn_like(t) for t in run_all(p, z, eps, "sequential", mask)]
    inputs = [*p.values(), z]
    grads = {}
    for method in ("sequential", "parallel"):
        outputs = run_all(p, z, eps, method, mask)
        total = sum((w * o).sum() for w, o in zip(weights, outputs, strict=True))
        grads[method] = torch.autograd.grad(total, inputs)
    for name, seq, par in zip([*p, "z"], grads["sequential"], grads["parallel"], strict=True):
        assert torch.isfinite(par).all()
        if name.endswith("scale_tril"):
            # A Cholesky factor's parameters are its lower triangle; above the diagonal the two
            # differ as functions (the sequential filter passes S_1's factor through as the
            # first predicted one, the scan re-factorises L L^T), not on the factors.
            seq, par = seq.tril(), par.tril()
        assert torch.allclose(seq, par, rtol=0, atol=1e-8), name


def test_long_chain_agrees_and_auto_takes_the_scan(monkeypatch):
    T, H, D = 300, 4, 2
    p = random_model(H=H, D=D, T=T)
    p["transition_matrix"] = 0.95 * torch.linalg.qr(p["transition_matrix"])[0]  # stable
    z = torch.randn(T, D, dtype=torch.float64)
    seq = kalman_filter(z, **p, method="sequential")
    par = kalman_filter(z, **p, method="parallel")
    assert torch.allclose(seq.log_prob, par.log_prob, rtol=1e-12, atol=1e-8)
    assert torch.allclose(seq.filtered_loc, par.filtered_loc, rtol=0, atol=1e-8)
    assert use_parallel("auto", kalman.PARALLEL_THRESHOLD)
    assert not use_parallel("auto", kalman.PARALLEL_THRESHOLD - 1)
    assert use_parallel("parallel", 2) and not use_parallel("sequential", 10**6)
    calls = []
    monkeypatch.setattr(kalman, "parallel_filter",
                        lambda *a: calls.append(1) or kalman_scan_filter(*a))
    auto = kalman_filter(z, **p)
    assert calls and torch.equal(auto.log_prob, par.log_prob)


def kalman_scan_filter(*args):
    from rpm.ops._kalman_scan import parallel_filter
    return parallel_filter(*args)


def test_bad_method_and_singular_covariances_are_reported():
    p = random_model(H=3, D=2, T=4)
    z = torch.randn(4, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="method must be one of"):
        kalman_filter(z, **p, method="scan")
    p["init_scale_tril"] = torch.zeros(3, 3, dtype=torch.float64)
    p["transition_scale_tril"] = torch.zeros(3, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="use method='sequential'"):
        kalman_filter(z, **p, method="parallel")
    assert torch.isfinite(kalman_filter(z, **p, method="sequential").log_prob)
    # "auto" on a long chain falls back to the square-root recursions
    T = kalman.PARALLEL_THRESHOLD + 3
    p = random_model(H=3, D=2, T=T)
    p["init_scale_tril"] = torch.zeros(3, 3, dtype=torch.float64)
    p["transition_scale_tril"] = torch.zeros(3, 3, dtype=torch.float64)
    z = torch.randn(T, 2, dtype=torch.float64)
    auto, sequential = kalman_filter(z, **p), kalman_filter(z, **p, method="sequential")
    assert torch.isfinite(auto.log_prob) and torch.equal(auto.log_prob, sequential.log_prob)
