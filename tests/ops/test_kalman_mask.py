"""Missing frames: the masked Kalman filter, smoother and sampler against the dense joint Gaussian
of the chain with those frames removed from the observation model (float64)."""

import pytest
import torch
from pyro.distributions import MultivariateNormal

from rpm.ops._kalman import backward_sample, kalman_filter, rts_smoother
from tests.ops.test_kalman import block_diagonal, condition, dense_joint, random_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

T, H, D = 6, 4, 2
MASKS = torch.tensor([
    [1, 1, 1, 1, 1, 1],
    [1, 0, 1, 1, 0, 1],
    [0, 1, 1, 0, 1, 1],  # the first frame missing
    [1, 1, 0, 0, 0, 0],  # the end missing: smoothing is prediction
    [0, 0, 0, 0, 0, 0],  # nothing observed: the prior
], dtype=torch.bool)


def observed_indices(mask_row, upto=T):
    return [t * D + d for t in range(upto) if mask_row[t] for d in range(D)]


@pytest.mark.parametrize("method", ["sequential", "parallel"])
@pytest.mark.parametrize("time_varying_r", [False, True])
def test_masked_filter_and_smoother_equal_the_dense_conditionals(method, time_varying_r):
    p = random_model(H=H, D=D, T=T, time_varying_r=time_varying_r)
    mean_s, cov_s, mean_z, cov_z, cov_sz = dense_joint(p, T)
    z = torch.randn(len(MASKS), T, D, dtype=torch.float64)
    filtered = kalman_filter(z, **p, mask=MASKS, method=method)
    smoothed = rts_smoother(filtered, p["transition_matrix"], p["transition_scale_tril"], method=method)
    for n, row in enumerate(MASKS):
        idx = observed_indices(row)
        flat = z[n].reshape(-1)
        expected = (MultivariateNormal(mean_z[idx], cov_z[idx][:, idx]).log_prob(flat[idx])
                    if idx else torch.zeros((), dtype=torch.float64))
        assert torch.allclose(filtered.log_prob[n], expected, rtol=0, atol=1e-8)
        # smoothed: the states given every observed frame
        if idx:
            loc, cov = condition(mean_s, mean_z[idx], cov_s, cov_sz[:, idx], cov_z[idx][:, idx], flat[idx])
        else:
            loc, cov = mean_s, cov_s
        assert torch.allclose(smoothed.loc[n], loc.reshape(T, H), rtol=0, atol=1e-8)
        assert torch.allclose(smoothed.covariance[n], block_diagonal(cov, T, H), rtol=0, atol=1e-8)
        # filtered: the state at t given the observed frames up to t
        for t in range(T):
            past = observed_indices(row, t + 1)
            block = slice(t * H, (t + 1) * H)
            if past:
                loc, cov = condition(mean_s[block], mean_z[past], cov_s[block, block],
                                     cov_sz[block][:, past], cov_z[past][:, past], flat[past])
            else:
                loc, cov = mean_s[block], cov_s[block, block]
            scale = filtered.filtered_scale_tril[n, t]
            assert torch.allclose(filtered.filtered_loc[n, t], loc, rtol=0, atol=1e-8)
            assert torch.allclose(scale @ scale.T, cov, rtol=0, atol=1e-8)


@pytest.mark.parametrize("method", ["sequential", "parallel"])
def test_masked_backward_sampling_is_the_dense_posterior(method):
    p = random_model(H=H, D=D, T=T)
    mean_s, cov_s, mean_z, cov_z, cov_sz = dense_joint(p, T)
    row = MASKS[1]
    idx = observed_indices(row)
    z = torch.randn(T, D, dtype=torch.float64)
    loc, cov = condition(mean_s, mean_z[idx], cov_s, cov_sz[:, idx], cov_z[idx][:, idx],
                         z.reshape(-1)[idx])
    filtered = kalman_filter(z, **p, mask=row, method=method)
    basis = torch.cat([torch.zeros(1, T * H, dtype=torch.float64), torch.eye(T * H, dtype=torch.float64)])
    draws = backward_sample(filtered, p["transition_matrix"], p["transition_scale_tril"],
                            basis.reshape(-1, T, H), method=method).reshape(-1, T * H)
    offset, matrix = draws[0], (draws[1:] - draws[0]).T
    assert torch.allclose(offset, loc, atol=1e-8)
    assert torch.allclose(matrix @ matrix.T, cov, atol=1e-8)


@pytest.mark.parametrize("method", ["sequential", "parallel"])
def test_missing_frames_may_hold_nan_and_gradients_stay_finite(method):
    p = {k: v.requires_grad_() for k, v in random_model(H=H, D=D, T=T).items()}
    z = torch.randn(len(MASKS), T, D, dtype=torch.float64)
    clean = kalman_filter(z, **p, mask=MASKS, method=method).log_prob
    z = torch.where(MASKS.unsqueeze(-1), z, torch.nan).requires_grad_()
    filtered = kalman_filter(z, **p, mask=MASKS, method=method)
    assert torch.equal(filtered.log_prob, clean)
    grads = torch.autograd.grad(filtered.log_prob.sum() + filtered.filtered_loc.sum(), [z, *p.values()])
    assert all(torch.isfinite(g).all() for g in grads)
    assert (grads[0][~MASKS] == 0).all()


def test_bad_masks_are_refused():
    p = random_model(H=H, D=D, T=T)
    z = torch.randn(T, D, dtype=torch.float64)
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        kalman_filter(z, **p, mask=torch.ones(T))
    with pytest.raises(ValueError, match=r"mask must have shape \(\*batch, T\) with T = 6"):
        kalman_filter(z, **p, mask=torch.ones(T + 1, dtype=torch.bool))
