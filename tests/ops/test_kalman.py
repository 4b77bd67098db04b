"""The square-root Kalman kernels against the dense joint Gaussian of (s_{1:T}, z_{1:T}) written
out by hand (float64), and against Pyro's GaussianHMM."""

import pytest
import torch
from pyro.distributions import GaussianHMM, MultivariateNormal

from rpm.ops._kalman import (
    backward_sample,
    kalman_filter,
    kalman_forecast,
    rts_smoother,
    triangularize,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def random_tril(*shape, scale=1.0):
    a = torch.randn(*shape, shape[-1], dtype=torch.float64) * 0.3
    eye = torch.eye(shape[-1], dtype=torch.float64)
    return scale * torch.linalg.cholesky(a @ a.transpose(-1, -2) + eye)


def random_model(batch=(), H=4, D=2, T=5, time_varying_r=False):
    params = dict(
        init_loc=torch.randn(*batch, H, dtype=torch.float64),
        init_scale_tril=random_tril(*batch, H),
        transition_matrix=torch.randn(*batch, H, H, dtype=torch.float64) * 0.5,
        transition_scale_tril=random_tril(*batch, H, scale=0.5),
        observation_matrix=torch.randn(*batch, D, H, dtype=torch.float64),
        observation_scale_tril=random_tril(*batch, T, D, scale=0.3) if time_varying_r
        else random_tril(*batch, 1, D, scale=0.3) if batch else random_tril(D, scale=0.3),
    )
    return params


def dense_joint(p, T, extra=0):
    """Mean and covariance of s_{1:T+extra} and z_{1:T+extra} (one unbatched model) from the
    recursions Cov(s_t, s_u) = A^{t-u} Cov(s_u), t >= u."""
    A, C = p["transition_matrix"], p["observation_matrix"]
    Q = p["transition_scale_tril"] @ p["transition_scale_tril"].T
    H = A.shape[0]
    n = T + extra
    mean_s = [p["init_loc"]]
    var_s = [p["init_scale_tril"] @ p["init_scale_tril"].T]
    for _ in range(n - 1):
        mean_s.append(A @ mean_s[-1])
        var_s.append(A @ var_s[-1] @ A.T + Q)
    cov_s = torch.zeros(n * H, n * H, dtype=torch.float64)
    for t in range(n):
        for u in range(t + 1):
            block = torch.linalg.matrix_power(A, t - u) @ var_s[u]
            cov_s[t * H:(t + 1) * H, u * H:(u + 1) * H] = block
            cov_s[u * H:(u + 1) * H, t * H:(t + 1) * H] = block.T
    L_R = p["observation_scale_tril"]
    R = [(L_R[min(t, L_R.shape[0] - 1)] if L_R.dim() == 3 else L_R) for t in range(n)]
    big_c = torch.block_diag(*[C] * n)
    big_r = torch.block_diag(*[r @ r.T for r in R])
    mean_s = torch.cat(mean_s)
    return mean_s, cov_s, big_c @ mean_s, big_c @ cov_s @ big_c.T + big_r, cov_s @ big_c.T


def condition(mean_a, mean_b, cov_aa, cov_ab, cov_bb, b):
    gain = torch.linalg.solve(cov_bb, cov_ab.T).T
    return mean_a + gain @ (b - mean_b), cov_aa - gain @ cov_ab.T


def block_diagonal(cov, T, H):
    return torch.stack([cov[t * H:(t + 1) * H, t * H:(t + 1) * H] for t in range(T)])


def test_triangularize_is_the_cholesky_factor():
    m = torch.randn(3, 4, 7, dtype=torch.float64)
    L = triangularize(m)
    assert torch.allclose(L, torch.linalg.cholesky(m @ m.transpose(-1, -2)), atol=1e-12)


@pytest.mark.parametrize("time_varying_r", [False, True])
def test_log_prob_matches_the_dense_joint_gaussian(time_varying_r):
    T, H, D = 6, 4, 2
    p = random_model(H=H, D=D, T=T, time_varying_r=time_varying_r)
    _, _, mean_z, cov_z, _ = dense_joint(p, T)
    z = MultivariateNormal(mean_z, cov_z).sample((3,)).reshape(3, T, D)
    result = kalman_filter(z, **p)
    expected = MultivariateNormal(mean_z, cov_z).log_prob(z.reshape(3, T * D))
    assert torch.allclose(result.log_prob, expected, rtol=0, atol=1e-8)


def test_log_prob_gradients_match_the_dense_joint_gaussian():
    T, H, D = 4, 3, 2
    p = {k: v.requires_grad_() for k, v in random_model(H=H, D=D, T=T).items()}
    z = torch.randn(T, D, dtype=torch.float64)
    grads = torch.autograd.grad(kalman_filter(z, **p).log_prob, list(p.values()))
    _, _, mean_z, cov_z, _ = dense_joint(p, T)
    dense = torch.autograd.grad(MultivariateNormal(mean_z, cov_z).log_prob(z.reshape(-1)),
                                list(p.values()))
    for g, d in zip(grads, dense, strict=True):
        assert torch.allclose(g, d, atol=1e-8)


@pytest.mark.parametrize("method", ["sequential", "parallel", "dense"])
def test_log_prob_matches_pyro_gaussian_hmm_in_batches(method):
    T, H, D, N = 7, 4, 3, 5
    p = random_model(batch=(N,), H=H, D=D, T=T)
    A = p["transition_matrix"]
    # GaussianHMM starts one transition before the first observation: s_0 ~ N(0, S0) and
    # s_1 = A s_0 + w, i.e. s_1 ~ N(0, A S0 A^T + Q), the initial state of our convention.
    init0 = MultivariateNormal(torch.zeros(N, H, dtype=torch.float64), scale_tril=p["init_scale_tril"])
    Q = p["transition_scale_tril"] @ p["transition_scale_tril"].transpose(-1, -2)
    S1 = A @ init0.covariance_matrix @ A.transpose(-1, -2) + Q
    hmm = GaussianHMM(
        init0, A.transpose(-1, -2).unsqueeze(-3),
        MultivariateNormal(torch.zeros(N, 1, H, dtype=torch.float64),
                           scale_tril=p["transition_scale_tril"].unsqueeze(-3)),
        p["observation_matrix"].transpose(-1, -2).unsqueeze(-3),
        MultivariateNormal(torch.zeros(N, 1, D, dtype=torch.float64),
                           scale_tril=p["observation_scale_tril"]),
        duration=T)
    z = torch.randn(N, T, D, dtype=torch.float64)
    ours = kalman_filter(z, **{**p, "init_loc": torch.zeros(N, H, dtype=torch.float64),
                               "init_scale_tril": torch.linalg.cholesky(S1)}, method=method).log_prob
    assert torch.allclose(ours, hmm.log_prob(z), atol=1e-8)


def test_float32_input_on_a_long_nearly_deterministic_chain():
    """Constant velocity, tiny process noise, T = 32: float32 inputs, filtered in float64
    arithmetic, agree with the float64 dense answer."""
    T, D = 32, 2
    H = 2 * D
    eye = torch.eye(D, dtype=torch.float64)
    A = torch.cat([torch.cat([eye, eye], 1), torch.cat([0 * eye, eye], 1)])
    p = dict(init_loc=torch.zeros(H, dtype=torch.float64),
             init_scale_tril=3.0 * torch.eye(H, dtype=torch.float64),
             transition_matrix=A, transition_scale_tril=1e-4 * torch.eye(H, dtype=torch.float64),
             observation_matrix=torch.cat([eye, 0 * eye], 1),
             observation_scale_tril=1e-3 * eye)
    t = torch.arange(T, dtype=torch.float64)
    z = torch.stack([0.7 * t, -0.3 * t], -1) + 1e-3 * torch.randn(T, D, dtype=torch.float64)
    _, _, mean_z, cov_z, _ = dense_joint(p, T)
    expected = MultivariateNormal(mean_z, cov_z).log_prob(z.reshape(-1))
    ours = kalman_filter(z.float(), **{k: v.float() for k, v in p.items()})
    assert ours.log_prob.dtype == torch.float32
    assert torch.isfinite(ours.log_prob)
    assert abs(ours.log_prob.double() - expected) < 1e-3 * abs(expected)


def test_smoother_matches_the_dense_conditional():
    T, H, D = 5, 4, 2
    p = random_model(H=H, D=D, T=T)
    mean_s, cov_s, mean_z, cov_z, cov_sz = dense_joint(p, T)
    z = torch.randn(T, D, dtype=torch.float64)
    loc, cov = condition(mean_s, mean_z, cov_s, cov_sz, cov_z, z.reshape(-1))
    smoothed = rts_smoother(kalman_filter(z, **p), p["transition_matrix"], p["transition_scale_tril"])
    assert torch.allclose(smoothed.loc, loc.reshape(T, H), atol=1e-8)
    assert torch.allclose(smoothed.covariance, block_diagonal(cov, T, H), atol=1e-8)


def test_filter_states_match_the_dense_conditional_on_the_past():
    T, H, D = 4, 3, 2
    p = random_model(H=H, D=D, T=T)
    mean_s, cov_s, mean_z, cov_z, cov_sz = dense_joint(p, T)
    z = torch.randn(T, D, dtype=torch.float64)
    result = kalman_filter(z, **p)
    for t in range(T):
        n = (t + 1) * D
        loc, cov = condition(mean_s, mean_z[:n], cov_s, cov_sz[:, :n], cov_z[:n, :n], z[:t + 1].reshape(-1))
        filt_cov = result.filtered_scale_tril[t] @ result.filtered_scale_tril[t].T
        assert torch.allclose(result.filtered_loc[t], loc[t * H:(t + 1) * H], atol=1e-8)
        assert torch.allclose(filt_cov, cov[t * H:(t + 1) * H, t * H:(t + 1) * H], atol=1e-8)


def test_forecast_matches_the_dense_conditional():
    T, H, D, k = 4, 4, 2, 3
    p = random_model(H=H, D=D, T=T)
    mean_s, cov_s, mean_z, cov_z, cov_sz = dense_joint(p, T, extra=k)
    z = torch.randn(T, D, dtype=torch.float64)
    n = T * D
    loc_z, cov_zf = condition(mean_z[n:], mean_z[:n], cov_z[n:, n:], cov_z[n:, :n], cov_z[:n, :n],
                              z.reshape(-1))
    loc_s, cov_sf = condition(mean_s[T * H:], mean_z[:n], cov_s[T * H:, T * H:], cov_sz[T * H:, :n],
                              cov_z[:n, :n], z.reshape(-1))
    forecast = kalman_forecast(kalman_filter(z, **p), p["transition_matrix"], p["transition_scale_tril"],
                               p["observation_matrix"], p["observation_scale_tril"], steps=k)
    assert torch.allclose(forecast.loc, loc_z.reshape(k, D), atol=1e-8)
    assert torch.allclose(forecast.scale_tril @ forecast.scale_tril.transpose(-1, -2),
                          block_diagonal(cov_zf, k, D), atol=1e-8)
    assert torch.allclose(forecast.state_loc, loc_s.reshape(k, H), atol=1e-8)
    assert torch.allclose(forecast.state_scale_tril @ forecast.state_scale_tril.transpose(-1, -2),
                          block_diagonal(cov_sf, k, H), atol=1e-8)


def test_backward_sampling_is_the_dense_posterior():
    """The draw is affine in the noise, s = b + M eps: b must be the posterior mean and M M^T
    the full posterior covariance of s_{1:T} given z_{1:T}, cross-time blocks included."""
    T, H, D = 4, 3, 2
    p = random_model(H=H, D=D, T=T)
    mean_s, cov_s, mean_z, cov_z, cov_sz = dense_joint(p, T)
    z = torch.randn(T, D, dtype=torch.float64)
    loc, cov = condition(mean_s, mean_z, cov_s, cov_sz, cov_z, z.reshape(-1))
    filtered = kalman_filter(z, **p)
    basis = torch.cat([torch.zeros(1, T * H, dtype=torch.float64), torch.eye(T * H, dtype=torch.float64)])
    draws = backward_sample(filtered, p["transition_matrix"], p["transition_scale_tril"],
                            basis.reshape(-1, T, H)).reshape(-1, T * H)
    offset, matrix = draws[0], (draws[1:] - draws[0]).T
    assert torch.allclose(offset, loc, atol=1e-8)
    assert torch.allclose(matrix @ matrix.T, cov, atol=1e-8)


def test_backward_sampling_is_affine_and_batched():
    T, H, D, N = 3, 2, 1, 4
    p = random_model(batch=(N,), H=H, D=D, T=T)
    z = torch.randn(N, T, D, dtype=torch.float64)
    filtered = kalman_filter(z, **p)
    eps = torch.randn(2, N, T, H, dtype=torch.float64)
    both = backward_sample(filtered, p["transition_matrix"], p["transition_scale_tril"], eps)
    first = backward_sample(filtered, p["transition_matrix"], p["transition_scale_tril"], eps[0])
    assert both.shape == (2, N, T, H)
    assert torch.allclose(both[0], first, atol=1e-12)
    for n in range(N):
        single = kalman_filter(z[n], **{k: v[n] for k, v in p.items()})
        alone = backward_sample(single, p["transition_matrix"][n], p["transition_scale_tril"][n],
                                eps[1, n])
        assert torch.allclose(alone, both[1, n], atol=1e-10)


def test_bad_shapes_are_refused():
    p = random_model(H=3, D=2, T=4)
    with pytest.raises(ValueError, match="observation_matrix must end in shape"):
        kalman_filter(torch.randn(4, 3, dtype=torch.float64), **p)
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        kalman_forecast(kalman_filter(torch.randn(4, 2, dtype=torch.float64), **p), p["transition_matrix"],
                        p["transition_scale_tril"], p["observation_matrix"], p["observation_scale_tril"], 0)


@pytest.mark.parametrize("method", ["sequential", "parallel", "dense"])
def test_more_observed_than_hidden_dimensions_matches_the_dense_joint_gaussian(method):
    """D = 5 observed dimensions of an H = 3 state (a tall emission, as in an LDS with more
    observations than latents): log-likelihood and smoothed means against the dense Gaussian."""
    torch.manual_seed(3)
    T, H, D = 6, 3, 5
    p = random_model(H=H, D=D, T=T)
    mean_s, cov_s, mean_z, cov_z, cov_sz = dense_joint(p, T)
    z = MultivariateNormal(mean_z, cov_z).sample((2,)).reshape(2, T, D)
    result = kalman_filter(z, **p, method=method)
    expected = MultivariateNormal(mean_z, cov_z).log_prob(z.reshape(2, T * D))
    assert torch.allclose(result.log_prob, expected, rtol=0, atol=1e-8)
    smoothed = rts_smoother(result, p["transition_matrix"], p["transition_scale_tril"],
                            method=method)
    for n in range(2):
        mean, _ = condition(mean_s, mean_z, cov_s, cov_sz, cov_z, z[n].reshape(-1))
        assert torch.allclose(smoothed.loc[n], mean.reshape(T, H), rtol=0, atol=1e-8)
