r"""Linear-Gaussian state-space kernels: Kalman filter, RTS smoother, backward sampling, forecasts.

The model (``docs/theory.md``, sequences; the state-space prior of Aitchison & Ganev's RPM over
T views) has hidden states :math:`s_t \in \mathbb{R}^H` and observations
:math:`z_t \in \mathbb{R}^D`:

.. math::

    s_1 \sim \mathcal{N}(m_1, S_1), \qquad
    s_{t+1} = A s_t + w_t,\ w_t \sim \mathcal{N}(0, Q), \qquad
    z_t = C s_t + v_t,\ v_t \sim \mathcal{N}(0, R_t).

Every covariance is carried by a lower-triangular square root (:math:`S = L L^\top`) and every
update is a QR decomposition of a stacked square-root array (the square-root covariance filter
of Kaminski, Bryson & Schmidt 1971; Grewal & Andrews, "Kalman Filtering", ch. 6), so the
covariances stay symmetric positive semi-definite by construction: no ``P - K S K^T``
subtraction can lose definiteness. The arithmetic runs in float64 (``compute_dtype``) and the
results are returned in the dtype of the observations.

Shapes: observations ``z`` are ``(*batch, T, D)``; ``init_loc`` ``(*batch, H)``; the square
roots and matrices broadcast against the batch: ``init_scale_tril`` and ``transition_matrix`` A
and ``transition_scale_tril`` ``(*batch, H, H)``, ``observation_matrix`` C ``(*batch, D, H)``,
``observation_scale_tril`` ``(*batch, T, D, D)`` (a time-varying R_t; a time axis of size 1
for a constant one) or ``(D, D)``. The covariances do not depend on the observations, so they
are computed once per distinct parameter set: the returned square roots have the batch shape
of the parameters (broadcastable to that of the means), and a batch of N sequences under one
model costs N mean updates but a single covariance recursion.
Pyro's :class:`~pyro.distributions.GaussianHMM` computes the same marginal likelihood in
precision form (with the initial state one transition before the first observation and
right-multiplied matrices); given time-varying transitions whose first one has matrix 0 and
noise :math:`\mathcal{N}(m_1, S_1)` it is this model exactly
(``docs/theory.md#linear-gaussian-state-space-prior``). The tests check the two against each
other and against the dense joint Gaussian.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from rpm._validation import check_positive_int

__all__ = [
    "KalmanFilterResult",
    "KalmanForecast",
    "KalmanSmootherResult",
    "backward_sample",
    "kalman_filter",
    "kalman_forecast",
    "rts_smoother",
    "triangularize",
]


def triangularize(square_root: torch.Tensor) -> torch.Tensor:
    r"""The lower-triangular square root of :math:`M M^\top` for a wide square root M.

    With :math:`M^\top = \mathcal{Q} \mathcal{R}` (QR), :math:`M M^\top = \mathcal{R}^\top
    \mathcal{R}`, so :math:`L = \mathcal{R}^\top` with its columns' signs flipped to make the
    diagonal non-negative: the Cholesky factor of :math:`M M^\top`, computed without forming it.

    :param torch.Tensor square_root: M, shape (..., n, k) with k >= n.
    :return: L, shape (..., n, n), lower triangular, :math:`L L^\top = M M^\top`.
    """
    n, k = square_root.shape[-2:]
    if k < n:
        raise ValueError(f"triangularize needs a wide square root (n <= k), got shape (n, k) = {(n, k)}")
    upper = torch.linalg.qr(square_root.transpose(-1, -2), mode="reduced")[1]  # (..., n, n)
    lower = upper.transpose(-1, -2)
    sign = torch.where(torch.diagonal(lower, dim1=-2, dim2=-1) < 0, -1.0, 1.0).to(lower.dtype)
    return lower * sign.unsqueeze(-2)  # flips columns


class KalmanFilterResult(NamedTuple):
    r"""Output of :func:`kalman_filter`.

    :ivar log_prob: :math:`\log P(z_{1:T})`, shape (*batch,).
    :ivar filtered_loc: :math:`E[s_t | z_{1:t}]`, shape (*batch, T, H).
    :ivar filtered_scale_tril: square root of :math:`Cov[s_t | z_{1:t}]`, (*batch, T, H, H),
        with the parameters' batch dimensions only (the covariances do not depend on z).
    :ivar predicted_loc: :math:`E[s_t | z_{1:t-1}]` (t = 1: the initial mean), (*batch, T, H).
    :ivar predicted_scale_tril: square root of :math:`Cov[s_t | z_{1:t-1}]`, likewise.
    """

    log_prob: torch.Tensor
    filtered_loc: torch.Tensor
    filtered_scale_tril: torch.Tensor
    predicted_loc: torch.Tensor
    predicted_scale_tril: torch.Tensor


class KalmanSmootherResult(NamedTuple):
    r"""Output of :func:`rts_smoother`: :math:`P(s_t | z_{1:T}) = \mathcal{N}(\text{loc}_t,
    L_t L_t^\top)`.

    :ivar loc: shape (*batch, T, H).
    :ivar scale_tril: shape (*batch, T, H, H).
    """

    loc: torch.Tensor
    scale_tril: torch.Tensor

    @property
    def covariance(self) -> torch.Tensor:
        """:math:`Cov[s_t | z_{1:T}]`, shape (*batch, T, H, H)."""
        return self.scale_tril @ self.scale_tril.transpose(-1, -2)


class KalmanForecast(NamedTuple):
    r"""Output of :func:`kalman_forecast`: the k-step predictive distributions given z_{1:T}.

    :ivar state_loc: :math:`E[s_{T+j} | z_{1:T}]`, shape (*batch, k, H).
    :ivar state_scale_tril: its covariance's square root, (*batch, k, H, H).
    :ivar loc: :math:`E[z_{T+j} | z_{1:T}] = C\, E[s_{T+j} | z_{1:T}]`, (*batch, k, D).
    :ivar scale_tril: square root of :math:`C\,Cov[s_{T+j}|z_{1:T}]\,C^\top + R`, (*batch, k, D, D).
    """

    state_loc: torch.Tensor
    state_scale_tril: torch.Tensor
    loc: torch.Tensor
    scale_tril: torch.Tensor


def _matvec(matrix: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
    return (matrix @ vector.unsqueeze(-1)).squeeze(-1)


def _check_shapes(z, init_loc, init_scale_tril, transition_matrix, transition_scale_tril,
                  observation_matrix, observation_scale_tril) -> tuple[int, int, int]:
    if z.dim() < 2:
        raise ValueError(f"z must have shape (*batch, T, D), got {tuple(z.shape)}")
    num_steps, obs_dim = z.shape[-2:]
    hidden_dim = init_loc.shape[-1]
    expected = {
        "init_scale_tril": (init_scale_tril, (hidden_dim, hidden_dim)),
        "transition_matrix": (transition_matrix, (hidden_dim, hidden_dim)),
        "transition_scale_tril": (transition_scale_tril, (hidden_dim, hidden_dim)),
        "observation_matrix": (observation_matrix, (obs_dim, hidden_dim)),
        "observation_scale_tril": (observation_scale_tril, (obs_dim, obs_dim)),
    }
    for name, (tensor, shape) in expected.items():
        if tuple(tensor.shape[-2:]) != shape:
            raise ValueError(
                f"{name} must end in shape {shape} for hidden dimension H = {hidden_dim} and "
                f"observation dimension D = {obs_dim}, got {tuple(tensor.shape)}"
            )
    return num_steps, obs_dim, hidden_dim


def kalman_filter(
    z: torch.Tensor,
    init_loc: torch.Tensor,
    init_scale_tril: torch.Tensor,
    transition_matrix: torch.Tensor,
    transition_scale_tril: torch.Tensor,
    observation_matrix: torch.Tensor,
    observation_scale_tril: torch.Tensor,
    compute_dtype: torch.dtype = torch.float64,
) -> KalmanFilterResult:
    r"""Square-root Kalman filter: the marginal log-likelihood and the filtered states.

    .. math::

        \log P(z_{1:T}) = \sum_t \log \mathcal{N}\big(z_t;\ C \hat s_{t|t-1},\
            C P_{t|t-1} C^\top + R_t\big)

    (prediction-error decomposition). Each measurement update triangularizes the array
    :math:`\begin{pmatrix} L_{R_t} & C L_{t|t-1} \\ 0 & L_{t|t-1}\end{pmatrix}` into
    :math:`\begin{pmatrix} L_{S_t} & 0 \\ \bar K_t & L_{t|t}\end{pmatrix}`: :math:`L_{S_t}` is the
    square root of the innovation covariance, the gain is :math:`K_t = \bar K_t L_{S_t}^{-1}`
    and :math:`L_{t|t}` the filtered square root; each time update triangularizes
    :math:`(A L_{t|t},\ L_Q)`.

    :param torch.Tensor z: observations, shape (*batch, T, D).
    :param torch.Tensor init_loc: :math:`m_1`, (*batch, H).
    :param torch.Tensor init_scale_tril: square root of :math:`S_1`, (*batch, H, H).
    :param torch.Tensor transition_matrix: A, (*batch, H, H), :math:`s_{t+1} = A s_t + w_t`.
    :param torch.Tensor transition_scale_tril: square root of Q, (*batch, H, H).
    :param torch.Tensor observation_matrix: C, (*batch, D, H).
    :param torch.Tensor observation_scale_tril: square root of R_t, (*batch, T, D, D) (T may be
        1) or (D, D).
    :param torch.dtype compute_dtype: dtype of the arithmetic (float64 by default).
    :return: a :class:`KalmanFilterResult` in the dtype of ``z``.
    """
    num_steps, obs_dim, hidden_dim = _check_shapes(
        z, init_loc, init_scale_tril, transition_matrix, transition_scale_tril,
        observation_matrix, observation_scale_tril)
    out_dtype = z.dtype
    z, init_loc, init_scale_tril, transition_matrix, transition_scale_tril = (
        t.to(compute_dtype) for t in (z, init_loc, init_scale_tril, transition_matrix,
                                      transition_scale_tril))
    observation_matrix = observation_matrix.to(compute_dtype)
    obs_scale = observation_scale_tril.to(compute_dtype)
    if obs_scale.dim() == 2:
        obs_scale = obs_scale.unsqueeze(-3)  # homogeneous R: a time axis of size 1
    if obs_scale.shape[-3] not in (1, num_steps):
        raise ValueError(
            f"observation_scale_tril must have shape (D, D) or (*batch, T, D, D) with T = "
            f"{num_steps} (or 1), got {tuple(observation_scale_tril.shape)}")
    # The covariances do not depend on the observations: they are computed once per distinct
    # parameter set (cov_batch), the means for every sequence (batch).
    cov_batch = torch.broadcast_shapes(
        init_scale_tril.shape[:-2], transition_matrix.shape[:-2], transition_scale_tril.shape[:-2],
        observation_matrix.shape[:-2], obs_scale.shape[:-3])
    batch_shape = torch.broadcast_shapes(cov_batch, z.shape[:-2], init_loc.shape[:-1])
    observation_matrix = observation_matrix.expand(*cov_batch, obs_dim, hidden_dim)
    transition_scale_tril = transition_scale_tril.expand(*cov_batch, hidden_dim, hidden_dim)

    loc = init_loc.expand(*batch_shape, hidden_dim)
    scale = init_scale_tril.expand(*cov_batch, hidden_dim, hidden_dim)
    log_prob = z.new_zeros(batch_shape)
    filtered_loc, filtered_scale, predicted_loc, predicted_scale = [], [], [], []
    for t in range(num_steps):
        predicted_loc.append(loc)
        predicted_scale.append(scale)
        obs_scale_t = obs_scale[..., min(t, obs_scale.shape[-3] - 1), :, :]
        obs_scale_t = obs_scale_t.expand(*cov_batch, obs_dim, obs_dim)
        top = torch.cat([obs_scale_t, observation_matrix @ scale], dim=-1)  # (*cov, D, D + H)
        bottom = torch.cat([torch.zeros_like(scale[..., :, :obs_dim]), scale], dim=-1)  # (*cov, H, D+H)
        post = triangularize(torch.cat([top, bottom], dim=-2))  # (*cov, D + H, D + H)
        innovation_scale = post[..., :obs_dim, :obs_dim]  # (*cov, D, D)
        gain_bar = post[..., obs_dim:, :obs_dim]  # (*cov, H, D)
        scale = post[..., obs_dim:, obs_dim:]  # filtered square root, (*cov, H, H)
        innovation = z[..., t, :] - _matvec(observation_matrix, loc)  # (*batch, D)
        white = torch.linalg.solve_triangular(
            innovation_scale, innovation.unsqueeze(-1), upper=False).squeeze(-1)  # (*batch, D)
        log_prob = log_prob - 0.5 * white.square().sum(-1) - torch.diagonal(
            innovation_scale, dim1=-2, dim2=-1).log().sum(-1) - 0.5 * obs_dim * math.log(2 * math.pi)
        loc = loc + _matvec(gain_bar, white)
        filtered_loc.append(loc)
        filtered_scale.append(scale)
        loc = _matvec(transition_matrix, loc)
        scale = triangularize(torch.cat([transition_matrix @ scale, transition_scale_tril], dim=-1))
    return KalmanFilterResult(
        log_prob.to(out_dtype),
        torch.stack(filtered_loc, -2).to(out_dtype),
        torch.stack(filtered_scale, -3).to(out_dtype),
        torch.stack(predicted_loc, -2).to(out_dtype),
        torch.stack(predicted_scale, -3).to(out_dtype),
    )


def _backward_pass(filtered: KalmanFilterResult, transition_matrix, transition_scale_tril,
                   compute_dtype):
    r"""Yields, for t = T-1 down to 1 (0-based T-2 .. 0), the smoother gain
    :math:`G_t = P_{t|t} A^\top P_{t+1|t}^{-1}` and the square root of
    :math:`Cov[s_t | s_{t+1}, z_{1:t}] = (I - G_t A) P_{t|t} (I - G_t A)^\top + G_t Q G_t^\top`."""
    loc_f = filtered.filtered_loc.to(compute_dtype)
    scale_f = filtered.filtered_scale_tril.to(compute_dtype)
    scale_p = filtered.predicted_scale_tril.to(compute_dtype)
    transition_matrix = transition_matrix.to(compute_dtype)
    transition_scale_tril = transition_scale_tril.to(compute_dtype)
    hidden_dim = loc_f.shape[-1]
    eye = torch.eye(hidden_dim, dtype=compute_dtype, device=loc_f.device)
    for t in range(loc_f.shape[-2] - 2, -1, -1):
        cov_f = scale_f[..., t, :, :] @ scale_f[..., t, :, :].transpose(-1, -2)  # P_{t|t}
        # G^T = P_{t+1|t}^{-1} A P_{t|t}
        gain = torch.cholesky_solve(transition_matrix @ cov_f, scale_p[..., t + 1, :, :]
                                    ).transpose(-1, -2)  # (*batch, H, H)
        residual = (eye - gain @ transition_matrix) @ scale_f[..., t, :, :]
        noise = gain @ transition_scale_tril
        yield t, gain, residual, noise


def rts_smoother(
    filtered: KalmanFilterResult,
    transition_matrix: torch.Tensor,
    transition_scale_tril: torch.Tensor,
    compute_dtype: torch.dtype = torch.float64,
) -> KalmanSmootherResult:
    r"""Rauch-Tung-Striebel smoother: :math:`P(s_t | z_{1:T})` for every t.

    .. math::

        G_t = P_{t|t} A^\top P_{t+1|t}^{-1}, \qquad
        \hat s_{t|T} = \hat s_{t|t} + G_t (\hat s_{t+1|T} - \hat s_{t+1|t}),

        P_{t|T} = (I - G_t A) P_{t|t} (I - G_t A)^\top + G_t Q G_t^\top + G_t P_{t+1|T} G_t^\top,

    the last in square-root form (triangularizing the three square roots side by side), a sum of
    positive semi-definite terms.

    :param KalmanFilterResult filtered: the output of :func:`kalman_filter`.
    :param torch.Tensor transition_matrix: A, (*batch, H, H).
    :param torch.Tensor transition_scale_tril: square root of Q, (*batch, H, H).
    :return: a :class:`KalmanSmootherResult`, shapes (*batch, T, H) and (*batch, T, H, H).
    """
    out_dtype = filtered.filtered_loc.dtype
    loc_f = filtered.filtered_loc.to(compute_dtype)
    loc_p = filtered.predicted_loc.to(compute_dtype)
    loc = loc_f[..., -1, :]
    scale = filtered.filtered_scale_tril[..., -1, :, :].to(compute_dtype)
    locs, scales = [loc], [scale]
    for t, gain, residual, noise in _backward_pass(filtered, transition_matrix,
                                                   transition_scale_tril, compute_dtype):
        loc = loc_f[..., t, :] + _matvec(gain, loc - loc_p[..., t + 1, :])
        scale = triangularize(torch.cat([residual, noise, gain @ scale], dim=-1))
        locs.append(loc)
        scales.append(scale)
    return KalmanSmootherResult(torch.stack(locs[::-1], -2).to(out_dtype),
                                torch.stack(scales[::-1], -3).to(out_dtype))


def backward_sample(
    filtered: KalmanFilterResult,
    transition_matrix: torch.Tensor,
    transition_scale_tril: torch.Tensor,
    noise: torch.Tensor,
    compute_dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    r"""Forward filtering, backward sampling: a reparameterised draw of :math:`s_{1:T} | z_{1:T}`.

    .. math::

        s_T = \hat s_{T|T} + L_{T|T}\,\epsilon_T, \qquad
        s_t = \hat s_{t|t} + G_t (s_{t+1} - \hat s_{t+1|t}) + L^{c}_t\,\epsilon_t,

    with :math:`L^c_t` the square root of :math:`Cov[s_t | s_{t+1}, z_{1:t}] = (I - G_t A)
    P_{t|t} (I - G_t A)^\top + G_t Q G_t^\top` (Carter & Kohn 1994; Frühwirth-Schnatter 1994).
    The draw is an affine function of the standard normal ``noise`` and differentiable in every
    parameter.

    :param KalmanFilterResult filtered: the output of :func:`kalman_filter`.
    :param torch.Tensor transition_matrix: A, (*batch, H, H).
    :param torch.Tensor transition_scale_tril: square root of Q, (*batch, H, H).
    :param torch.Tensor noise: :math:`\epsilon`, standard normal, shape (*sample, *batch, T, H).
    :return: :math:`s_{1:T}`, shape (*sample, *batch, T, H).
    """
    out_dtype = filtered.filtered_loc.dtype
    loc_f = filtered.filtered_loc.to(compute_dtype)
    loc_p = filtered.predicted_loc.to(compute_dtype)
    if noise.shape[-2:] != loc_f.shape[-2:]:
        raise ValueError(f"noise must end in shape (T, H) = {tuple(loc_f.shape[-2:])}, got "
                         f"{tuple(noise.shape)}")
    noise = noise.to(compute_dtype)
    state = loc_f[..., -1, :] + _matvec(filtered.filtered_scale_tril[..., -1, :, :].to(compute_dtype),
                                        noise[..., -1, :])
    states = [state]
    for t, gain, residual, process in _backward_pass(filtered, transition_matrix,
                                                     transition_scale_tril, compute_dtype):
        scale = triangularize(torch.cat([residual, process], dim=-1))
        state = (loc_f[..., t, :] + _matvec(gain, state - loc_p[..., t + 1, :])
                 + _matvec(scale, noise[..., t, :]))
        states.append(state)
    return torch.stack(states[::-1], -2).to(out_dtype)


def kalman_forecast(
    filtered: KalmanFilterResult,
    transition_matrix: torch.Tensor,
    transition_scale_tril: torch.Tensor,
    observation_matrix: torch.Tensor,
    observation_scale_tril: torch.Tensor,
    steps: int,
    compute_dtype: torch.dtype = torch.float64,
) -> KalmanForecast:
    r"""Predictive distributions of the next ``steps`` hidden states and observations.

    .. math::

        \hat s_{T+j|T} = A^j \hat s_{T|T}, \qquad P_{T+j|T} = A P_{T+j-1|T} A^\top + Q, \qquad
        z_{T+j} | z_{1:T} \sim \mathcal{N}(C \hat s_{T+j|T},\ C P_{T+j|T} C^\top + R).

    :param KalmanFilterResult filtered: the output of :func:`kalman_filter`.
    :param torch.Tensor transition_matrix: A, (*batch, H, H).
    :param torch.Tensor transition_scale_tril: square root of Q, (*batch, H, H).
    :param torch.Tensor observation_matrix: C, (*batch, D, H).
    :param torch.Tensor observation_scale_tril: square root of R, (*batch, D, D).
    :param int steps: k >= 1.
    :return: a :class:`KalmanForecast`.
    """
    check_positive_int("steps", steps)
    out_dtype = filtered.filtered_loc.dtype
    transition_matrix, transition_scale_tril, observation_matrix, observation_scale_tril = (
        t.to(compute_dtype) for t in (transition_matrix, transition_scale_tril,
                                      observation_matrix, observation_scale_tril))
    loc = filtered.filtered_loc[..., -1, :].to(compute_dtype)
    scale = filtered.filtered_scale_tril[..., -1, :, :].to(compute_dtype)
    state_locs, state_scales, locs, scales = [], [], [], []
    for _ in range(steps):
        loc = _matvec(transition_matrix, loc)
        scale = triangularize(torch.cat([
            transition_matrix @ scale, transition_scale_tril.expand_as(scale)], dim=-1))
        obs_scale = observation_scale_tril.expand(*scale.shape[:-2], *observation_scale_tril.shape[-2:])
        state_locs.append(loc)
        state_scales.append(scale)
        locs.append(_matvec(observation_matrix, loc))
        scales.append(triangularize(torch.cat([observation_matrix @ scale, obs_scale], dim=-1)))
    return KalmanForecast(*(torch.stack(v, dim).to(out_dtype) for v, dim in (
        (state_locs, -2), (state_scales, -3), (locs, -2), (scales, -3))))
