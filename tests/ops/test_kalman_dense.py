"""The dense Kalman filter and backward sampler (the window's joint Gaussian, one triangular
solve) against the sequential square-root recursions and the dense joint written out by hand, in
float64: values and gradients to 1e-10."""

import pytest
import torch
from pyro.distributions import MultivariateNormal

from rpm.ops import _kalman as kalman
from rpm.ops._kalman import backward_sample, kalman_filter, kalman_log_prob, use_dense
from rpm.ops._kalman_scan import NotPositiveDefiniteError
from tests.ops.test_kalman import dense_joint, random_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CASES = [  # (parameter batch, extra sequence batch, T, time-varying R)
    ((), (), 1, False),
    ((), (), 2, False),
    ((), (5,), 10, False),
    ((), (3,), 7, True),
    ((3,), (), 6, False),
    ((2, 3), (4, 1, 1), 9, True),
]


def stable_model(batch, H, D, T, time_varying_r):
    p = random_model(batch=batch, H=H, D=D, T=T, time_varying_r=time_varying_r)
    # a contraction, so that the window's covariance stays well conditioned at every T here
    p["transition_matrix"] = 0.9 * torch.linalg.qr(p["transition_matrix"])[0]
    return p


def run_all(p, z, eps, method):
    filtered = kalman_filter(z, **p, method=method)
    draws = backward_sample(filtered, p["transition_matrix"], p["transition_scale_tril"], eps,
                            method=method)
    return (*filtered, draws, kalman_log_prob(z, **p, method=method))


@pytest.mark.parametrize("batch,extra,T,time_varying_r", CASES)
def test_dense_equals_sequential(batch, extra, T, time_varying_r):
    H, D = 4, 2
    p = stable_model(batch, H, D, T, time_varying_r)
    z = torch.randn(*extra, *batch, T, D, dtype=torch.float64)
    eps = torch.randn(2, *extra, *batch, T, H, dtype=torch.float64)
    for seq, dense in zip(run_all(p, z, eps, "sequential"), run_all(p, z, eps, "dense"), strict=True):
        assert seq.shape == dense.shape
        assert torch.allclose(seq, dense, rtol=1e-10, atol=1e-10)


def test_dense_gradients_equal_sequential():
    T, H, D, N = 10, 4, 2, 3
    p = {k: v.requires_grad_() for k, v in stable_model((), H, D, T, True).items()}
    z = torch.randn(N, T, D, dtype=torch.float64, requires_grad=True)
    eps = torch.randn(N, T, H, dtype=torch.float64)
    weights = [torch.randn_like(t) for t in run_all(p, z, eps, "sequential")]
    inputs = [*p.values(), z]
    grads = {}
    for method in ("sequential", "dense"):
        total = sum((w * o).sum() for w, o in zip(weights, run_all(p, z, eps, method), strict=True))
        grads[method] = torch.autograd.grad(total, inputs)
    for name, seq, dense in zip([*p, "z"], grads["sequential"], grads["dense"], strict=True):
        if name.endswith("scale_tril"):
            # only the lower triangle parametrises a Cholesky factor (as in test_kalman_scan)
            seq, dense = seq.tril(), dense.tril()
        assert torch.allclose(seq, dense, rtol=1e-10, atol=1e-10), name


def test_log_prob_is_the_dense_joint_gaussian_written_out():
    T, H, D = 6, 3, 2
    p = stable_model((), H, D, T, True)
    _, _, mean_z, cov_z, _ = dense_joint(p, T)
    z = MultivariateNormal(mean_z, cov_z).sample((4,))
    expected = MultivariateNormal(mean_z, cov_z).log_prob(z)
    ours = kalman_log_prob(z.reshape(4, T, D), **p, method="dense")
    assert torch.allclose(ours, expected, rtol=1e-12, atol=1e-10)


def test_auto_takes_the_dense_form_for_short_windows_without_a_mask(monkeypatch):
    limit = kalman.DENSE_THRESHOLD
    assert use_dense("auto", limit // 4, 2, 4, None)
    assert not use_dense("auto", limit // 4 + 1, 2, 4, None)
    assert not use_dense("auto", 2, 2, 4, torch.ones(2, dtype=torch.bool))
    assert use_dense("dense", 10**4, 2, 4, None) and not use_dense("sequential", 2, 2, 4, None)
    # one covariance per sequence: the cubic cost is paid per sequence
    size = limit // 4 * 4
    assert use_dense("auto", limit // 4, 2, 4, None, covariances=kalman.DENSE_WORK_THRESHOLD // size**3)
    assert not use_dense("auto", limit // 4, 2, 4, None,
                         covariances=kalman.DENSE_WORK_THRESHOLD // size**3 + 1)
    calls = []
    real = kalman.dense_filter
    monkeypatch.setattr(kalman, "dense_filter", lambda *a: calls.append(1) or real(*a))
    T = limit // 4
    p = stable_model((), 4, 2, T, False)
    z = torch.randn(5, T, 2, dtype=torch.float64)
    auto = kalman_filter(z, **p)
    assert calls
    assert torch.equal(auto.log_prob, kalman_filter(z, **p, method="dense").log_prob)
    calls.clear()
    kalman_filter(z, **p, mask=torch.rand(5, T) < 0.8)
    assert not calls
    many = {**p, "observation_scale_tril": p["observation_scale_tril"].expand(10**4, 1, 2, 2)}
    kalman_filter(z[:1], **many)
    assert not calls
    with pytest.raises(ValueError, match="method='dense' takes no mask"):
        kalman_filter(z, **p, mask=torch.ones(5, T, dtype=torch.bool), method="dense")


def test_an_ill_conditioned_window_falls_back_to_the_square_root_recursions():
    """Constant velocity with a tiny process and observation noise: the window's covariance is
    beyond what the covariance form resolves, "dense" says so and "auto" takes the recursions."""
    T, D = 8, 2
    eye = torch.eye(D, dtype=torch.float64)
    p = dict(init_loc=torch.zeros(2 * D, dtype=torch.float64),
             init_scale_tril=1e3 * torch.eye(2 * D, dtype=torch.float64),
             transition_matrix=torch.cat([torch.cat([eye, eye], 1), torch.cat([0 * eye, eye], 1)]),
             transition_scale_tril=1e-6 * torch.eye(2 * D, dtype=torch.float64),
             observation_matrix=torch.cat([eye, 0 * eye], 1),
             observation_scale_tril=1e-4 * eye)
    z = torch.randn(T, D, dtype=torch.float64)
    with pytest.raises(NotPositiveDefiniteError, match="use method='sequential'"):
        kalman_filter(z, **p, method="dense")
    with pytest.raises(NotPositiveDefiniteError, match="use method='sequential'"):
        kalman_log_prob(z, **p, method="dense")
    sequential = kalman_filter(z, **p, method="sequential")
    assert torch.equal(kalman_filter(z, **p).log_prob, sequential.log_prob)
    assert torch.equal(kalman_log_prob(z, **p), sequential.log_prob)
