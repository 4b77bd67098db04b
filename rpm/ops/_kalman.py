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
subtraction can lose definiteness. Long windows take the associative scans of
``rpm.ops._kalman_scan`` (O(log T) depth) and short ones the window's dense joint Gaussian,
``rpm.ops._kalman_dense`` (a few dozen tensor operations whatever T), both in covariance form
and each falling back to the square-root recursions where its covariances are not numerically
positive definite (``method``, ``PARALLEL_THRESHOLD``, ``DENSE_THRESHOLD``). The
arithmetic runs in float64 (``compute_dtype``) and the results are returned in the dtype of the
observations.

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
from rpm.ops._kalman_dense import dense_backward_sample, dense_filter, dense_log_prob
from rpm.ops._kalman_scan import (
    NotPositiveDefiniteError,
    parallel_backward_sample,
    parallel_filter,
    parallel_smoother,
)
from rpm.ops._square_root import triangularize

__all__ = [
    "DENSE_THRESHOLD",
    "DENSE_WORK_THRESHOLD",
    "PARALLEL_THRESHOLD",
    "KalmanFilterResult",
    "KalmanForecast",
    "KalmanSmootherResult",
    "backward_sample",
    "kalman_filter",
    "kalman_forecast",
    "kalman_log_prob",
    "rts_smoother",
    "triangularize",
]


class KalmanFilterResult(NamedTuple):
    r"""Output of :func:`kalman_filter`.

    :ivar log_prob: :math:`\log P(z_{1:T})`, shape ``(*batch,)``.
    :ivar filtered_loc: :math:`E[s_t | z_{1:t}]`, shape ``(*batch, T, H)``.
    :ivar filtered_scale_tril: square root of :math:`Cov[s_t | z_{1:t}]`, ``(*batch, T, H, H)``,
        with the parameters' batch dimensions only (the covariances do not depend on z).
    :ivar predicted_loc: :math:`E[s_t | z_{1:t-1}]` (t = 1: the initial mean), ``(*batch, T, H)``.
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

    :ivar loc: shape ``(*batch, T, H)``.
    :ivar scale_tril: shape ``(*batch, T, H, H)``.
    """

    loc: torch.Tensor
    scale_tril: torch.Tensor

    @property
    def covariance(self) -> torch.Tensor:
        """:math:`Cov[s_t | z_{1:T}]`, shape ``(*batch, T, H, H)``."""
        return self.scale_tril @ self.scale_tril.transpose(-1, -2)


class KalmanForecast(NamedTuple):
    r"""Output of :func:`kalman_forecast`: the k-step predictive distributions given z_{1:T}.

    :ivar state_loc: :math:`E[s_{T+j} | z_{1:T}]`, shape ``(*batch, k, H)``.
    :ivar state_scale_tril: its covariance's square root, ``(*batch, k, H, H)``.
    :ivar loc: :math:`E[z_{T+j} | z_{1:T}] = C\, E[s_{T+j} | z_{1:T}]`, ``(*batch, k, D)``.
    :ivar scale_tril: square root of :math:`C\,Cov[s_{T+j}|z_{1:T}]\,C^\top + R`, ``(*batch, k, D, D)``.
    """

    state_loc: torch.Tensor
    state_scale_tril: torch.Tensor
    loc: torch.Tensor
    scale_tril: torch.Tensor


def _matvec(matrix: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
    return (matrix @ vector.unsqueeze(-1)).squeeze(-1)


#: Under ``method="auto"``, sequences of at least this many frames are filtered, smoothed and
#: sampled by the associative scans of ``rpm.ops._kalman_scan`` (O(log T) depth), shorter
#: ones by the sequential square-root recursions (fewer operations; measured in
#: ``benchmarks/kalman.py``, see ``benchmarks/README.md``).
PARALLEL_THRESHOLD = 10

#: Under ``method="auto"``, a filter without a mask whose window has T max(D, H) at most this
#: many entries is computed from the dense joint Gaussian of the window
#: (``rpm.ops._kalman_dense``: a few dozen tensor operations, whatever T), provided its
#: covariances are shared by the sequences or few enough (``DENSE_WORK_THRESHOLD``);
#: measured in ``benchmarks/kalman.py``, see ``benchmarks/README.md``.
DENSE_THRESHOLD = 128

#: Under ``method="auto"``, the dense form also needs (number of distinct covariance
#: recursions) x (T max(D, H))^3 at most this: with a covariance per sequence (a learned
#: recognition noise) its cubic cost is paid per sequence, where the recursions' is linear in T.
DENSE_WORK_THRESHOLD = 2 ** 22

METHODS = ("auto", "sequential", "parallel", "dense")


def use_dense(method: str, num_steps: int, obs_dim: int, hidden_dim: int, mask,
              covariances: int = 1) -> bool:
    """Whether ``method`` filters (or samples) a window of ``num_steps`` frames from its dense
    joint Gaussian: ``"dense"``; ``"auto"``: without a mask, up to ``DENSE_THRESHOLD``
    entries T max(D, H) and ``DENSE_WORK_THRESHOLD`` for ``covariances`` distinct
    covariance recursions (1: shared by every sequence)."""
    if method == "dense" and mask is not None:
        raise ValueError("method='dense' takes no mask (the observed frames differ between "
                         "sequences); use method='auto', 'sequential' or 'parallel'")
    size = num_steps * max(obs_dim, hidden_dim)
    return method == "dense" or (method == "auto" and mask is None and size <= DENSE_THRESHOLD
                                 and covariances * size ** 3 <= DENSE_WORK_THRESHOLD)


def use_parallel(method: str, num_steps: int) -> bool:
    """Whether ``method`` (``"auto"``, ``"sequential"`` or ``"parallel"``; ``"dense"``, the
    filter's, reads as ``"auto"`` for the smoother and the sampler) runs the scans for a
    sequence of ``num_steps`` frames (``"auto"``: from ``PARALLEL_THRESHOLD`` frames)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return method == "parallel" or (method in ("auto", "dense") and num_steps >= PARALLEL_THRESHOLD)


def _time_first(tensor: torch.Tensor, event_dims: int, batch_dims: int) -> torch.Tensor:
    """``(*b, T, *event)`` -> ``(T, 1, ..., 1, *b, *event)`` with ``batch_dims`` dimensions after T."""
    tensor = tensor.movedim(-event_dims - 1, 0)
    lead = tensor.dim() - 1 - event_dims
    return tensor.reshape(tensor.shape[0], *([1] * (batch_dims - lead)), *tensor.shape[1:])


def _pad(tensor: torch.Tensor, event_dims: int, batch_dims: int) -> torch.Tensor:
    """``(*b, *event)`` -> ``(1, ..., 1, *b, *event)`` with ``batch_dims`` batch dimensions."""
    return tensor.reshape(*([1] * (batch_dims + event_dims - tensor.dim())), *tensor.shape)


def check_mask(mask: torch.Tensor | None, num_steps: int) -> torch.Tensor | None:
    """Validates a mask over frames: a bool tensor of shape ``(*batch, T)``, True = observed."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(f"mask must be a bool tensor of shape (*batch, T), True where the frame "
                        f"is observed; got {got} (use mask.bool() or a comparison)")
    if mask.dim() < 1 or mask.shape[-1] != num_steps:
        raise ValueError(f"mask must have shape (*batch, T) with T = {num_steps} frames, got "
                         f"{tuple(mask.shape)}")
    return mask


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
    mask: torch.Tensor | None = None,
    method: str = "auto",
) -> KalmanFilterResult:
    r"""Kalman filter: the marginal log-likelihood and the filtered states.

    .. math::

        \log P(z_{1:T}) = \sum_{t:\ \text{observed}} \log \mathcal{N}\big(z_t;\
            C \hat s_{t|t-1},\ C P_{t|t-1} C^\top + R_t\big)

    (prediction-error decomposition). Sequentially (``method="sequential"``), each
    measurement update triangularizes the array :math:`\begin{pmatrix} L_{R_t} & C L_{t|t-1} \\
    0 & L_{t|t-1}\end{pmatrix}` into :math:`\begin{pmatrix} L_{S_t} & 0 \\ \bar K_t &
    L_{t|t}\end{pmatrix}`: :math:`L_{S_t}` is the square root of the innovation covariance,
    the gain is :math:`K_t = \bar K_t L_{S_t}^{-1}` and :math:`L_{t|t}` the filtered square
    root; each time update triangularizes :math:`(A L_{t|t},\ L_Q)`. In parallel
    (``method="parallel"``), the filtered distributions are the prefix products of the
    associative elements of Särkkä & García-Fernández (2021) (``rpm.ops._kalman_scan``),
    O(log T) depth. From the dense joint Gaussian (``method="dense"``), the log-likelihood and
    the states are regressions on the whitened innovations :math:`L^{-1}(z - \bar z)`, L the
    Cholesky factor of the covariance of :math:`z_{1:T}` (``rpm.ops._kalman_dense``): a few
    dozen tensor operations whatever T, at a cost that grows as :math:`(T \max(D, H))^3`.
    ``"auto"`` takes the dense form for windows without a mask of up to
    ``DENSE_THRESHOLD`` entries T max(D, H) (and ``DENSE_WORK_THRESHOLD`` where the
    sequences' covariances differ), the scan from ``PARALLEL_THRESHOLD``
    frames, and the square-root recursions otherwise and wherever a covariance of the dense
    form or of the scan is not numerically positive definite (a singular noise) or the window
    is ill-conditioned (``"dense"`` and ``"parallel"`` raise instead).

    **Missing frames.** Where ``mask`` is False the frame is not observed: it has no
    measurement update and no likelihood factor (its filtered state is its prediction), which
    is the filter of the same chain with that frame removed from the observation model; its
    value in ``z`` is ignored (it may be anything, NaN included). Masks may differ between
    sequences, and then so do the covariances.

    :param torch.Tensor z: observations, shape ``(*batch, T, D)``.
    :param torch.Tensor init_loc: :math:`m_1`, ``(*batch, H)``.
    :param torch.Tensor init_scale_tril: square root of :math:`S_1`, ``(*batch, H, H)``.
    :param torch.Tensor transition_matrix: A, ``(*batch, H, H)``, :math:`s_{t+1} = A s_t + w_t`.
    :param torch.Tensor transition_scale_tril: square root of Q, ``(*batch, H, H)``.
    :param torch.Tensor observation_matrix: C, ``(*batch, D, H)``.
    :param torch.Tensor observation_scale_tril: square root of R_t, ``(*batch, T, D, D)`` (T may be
        1) or (D, D).
    :param torch.dtype compute_dtype: dtype of the arithmetic (float64 by default).
    :param mask: None (every frame observed) or a bool tensor ``(*batch, T)``, True = observed.
    :param str method: ``"auto"``, ``"sequential"``, ``"parallel"`` or ``"dense"`` (no mask).
    :return: a :class:`KalmanFilterResult` in the dtype of ``z``.
    """
    args = _prepare(z, init_loc, init_scale_tril, transition_matrix, transition_scale_tril,
                    observation_matrix, observation_scale_tril, compute_dtype, mask)
    if _use_dense(method, args):
        try:
            return _dense_filter(*args)
        except NotPositiveDefiniteError:
            if method == "dense":
                raise
    return _recursive_filter(method, args)


def _use_dense(method: str, args: tuple) -> bool:
    num_steps, obs_dim = args[0].shape[-2:]
    return use_dense(method, num_steps, obs_dim, args[2].shape[-1], args[1], args[9].numel())


def _recursive_filter(method: str, args: tuple) -> KalmanFilterResult:
    """The scans or the square-root recursions (``method`` as for :func:`kalman_filter`)."""
    if use_parallel(method, args[0].shape[-2]):
        try:
            return _parallel_filter(*args)
        except NotPositiveDefiniteError:
            if method == "parallel":
                raise
    return _sequential_filter(*args)


def kalman_log_prob(
    z: torch.Tensor,
    init_loc: torch.Tensor,
    init_scale_tril: torch.Tensor,
    transition_matrix: torch.Tensor,
    transition_scale_tril: torch.Tensor,
    observation_matrix: torch.Tensor,
    observation_scale_tril: torch.Tensor,
    compute_dtype: torch.dtype = torch.float64,
    mask: torch.Tensor | None = None,
    method: str = "auto",
) -> torch.Tensor:
    r""":math:`\log P(z_{1:T})` alone: :func:`kalman_filter`'s ``log_prob`` (same arguments and
    methods), without the filtered states where the dense form computes it (``"dense"``, or
    ``"auto"`` up to ``DENSE_THRESHOLD``): :math:`-\tfrac12 \lVert L^{-1}(z - \bar z)
    \rVert^2 - \log \lvert L \rvert - \tfrac{TD}{2} \log 2\pi` with :math:`L L^\top` the
    covariance of the window (``rpm.ops._kalman_dense``).

    :return: shape ``(*batch,)``, in the dtype of ``z``.
    """
    args = _prepare(z, init_loc, init_scale_tril, transition_matrix, transition_scale_tril,
                    observation_matrix, observation_scale_tril, compute_dtype, mask)
    if _use_dense(method, args):
        z, _, init_loc, *params, batch_shape, _, out_dtype = args
        try:
            return dense_log_prob(z, init_loc, *params).expand(batch_shape).to(out_dtype)
        except NotPositiveDefiniteError:
            if method == "dense":
                raise
    return _recursive_filter(method, args).log_prob


def _prepare(z, init_loc, init_scale_tril, transition_matrix, transition_scale_tril,
             observation_matrix, observation_scale_tril, compute_dtype, mask):
    """Checks the shapes and the mask; the arguments of the filters in ``compute_dtype``."""
    num_steps, obs_dim, hidden_dim = _check_shapes(
        z, init_loc, init_scale_tril, transition_matrix, transition_scale_tril,
        observation_matrix, observation_scale_tril)
    mask = check_mask(mask, num_steps)
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
    # parameter set and mask (cov_batch), the means for every sequence (batch).
    cov_batch = torch.broadcast_shapes(
        init_scale_tril.shape[:-2], transition_matrix.shape[:-2], transition_scale_tril.shape[:-2],
        observation_matrix.shape[:-2], obs_scale.shape[:-3],
        () if mask is None else mask.shape[:-1])
    batch_shape = torch.broadcast_shapes(cov_batch, z.shape[:-2], init_loc.shape[:-1])
    if mask is not None:  # a missing frame's value is never read, not even as 0 * NaN
        z = torch.where(mask.unsqueeze(-1), z, torch.zeros((), dtype=z.dtype, device=z.device))
    return (z, mask, init_loc, init_scale_tril, transition_matrix, transition_scale_tril,
            observation_matrix, obs_scale, batch_shape, cov_batch, out_dtype)


def _dense_filter(z, mask, init_loc, init_scale_tril, transition_matrix, transition_scale_tril,
                  observation_matrix, obs_scale, batch_shape, cov_batch, out_dtype):
    num_steps, obs_dim = z.shape[-2:]
    hidden_dim = init_loc.shape[-1]
    log_prob, loc_f, scale_f, loc_p, scale_p = dense_filter(
        z, init_loc, init_scale_tril, transition_matrix, transition_scale_tril,
        observation_matrix, obs_scale)
    cov_shape = (*cov_batch, num_steps, hidden_dim, hidden_dim)
    loc_shape = (*batch_shape, num_steps, hidden_dim)
    return KalmanFilterResult(log_prob.expand(batch_shape).to(out_dtype),
                              loc_f.expand(loc_shape).to(out_dtype),
                              scale_f.expand(cov_shape).to(out_dtype),
                              loc_p.expand(loc_shape).to(out_dtype),
                              scale_p.expand(cov_shape).to(out_dtype))


def _parallel_filter(z, mask, init_loc, init_scale_tril, transition_matrix, transition_scale_tril,
                     observation_matrix, obs_scale, batch_shape, cov_batch, out_dtype):
    num_steps, obs_dim = z.shape[-2:]
    hidden_dim = init_loc.shape[-1]
    nb = len(batch_shape)
    log_prob, loc_f, scale_f, loc_p, scale_p = parallel_filter(
        _time_first(z.expand(*batch_shape, num_steps, obs_dim), 1, nb),
        None if mask is None else _time_first(mask, 0, nb),
        init_loc.expand(*batch_shape, hidden_dim),
        _pad(init_scale_tril, 2, nb), _pad(transition_matrix, 2, nb),
        _pad(transition_scale_tril, 2, nb), _pad(observation_matrix, 2, nb),
        _time_first(obs_scale, 2, nb))
    cov_shape = (*cov_batch, num_steps, hidden_dim, hidden_dim)
    return KalmanFilterResult(
        log_prob.to(out_dtype),
        loc_f.movedim(0, -2).to(out_dtype),
        scale_f.movedim(0, -3).reshape(cov_shape).to(out_dtype),
        loc_p.movedim(0, -2).to(out_dtype),
        scale_p.movedim(0, -3).reshape(cov_shape).to(out_dtype))


def _sequential_filter(z, mask, init_loc, init_scale_tril, transition_matrix, transition_scale_tril,
                       observation_matrix, obs_scale, batch_shape, cov_batch, out_dtype):
    num_steps, obs_dim = z.shape[-2:]
    hidden_dim = init_loc.shape[-1]
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
        bottom = torch.cat([scale.new_zeros(*scale.shape[:-1], obs_dim), scale], dim=-1)  # (*cov, H, D+H)
        post = triangularize(torch.cat([top, bottom], dim=-2))  # (*cov, D + H, D + H)
        innovation_scale = post[..., :obs_dim, :obs_dim]  # (*cov, D, D)
        gain_bar = post[..., obs_dim:, :obs_dim]  # (*cov, H, D)
        innovation = z[..., t, :] - _matvec(observation_matrix, loc)  # (*batch, D)
        white = torch.linalg.solve_triangular(
            innovation_scale, innovation.unsqueeze(-1), upper=False).squeeze(-1)  # (*batch, D)
        term = - 0.5 * white.square().sum(-1) - torch.diagonal(
            innovation_scale, dim1=-2, dim2=-1).log().sum(-1) - 0.5 * obs_dim * math.log(2 * math.pi)
        if mask is None:
            log_prob = log_prob + term
            loc = loc + _matvec(gain_bar, white)
            scale = post[..., obs_dim:, obs_dim:]  # filtered square root, (*cov, H, H)
        else:  # a missing frame keeps its prediction
            observed = mask[..., t]
            log_prob = log_prob + torch.where(observed, term, torch.zeros_like(term))
            loc = torch.where(observed.unsqueeze(-1), loc + _matvec(gain_bar, white), loc)
            scale = torch.where(observed[..., None, None], post[..., obs_dim:, obs_dim:], scale)
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


def _scan_inputs(filtered: KalmanFilterResult, transition_matrix, transition_scale_tril,
                 compute_dtype, batch_dims: int
                 ) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                  torch.Tensor], torch.Size]:
    """The filter's output time first with ``batch_dims`` batch dimensions, for the scans; and
    the batch shape of the smoothed covariances."""
    transition_matrix = transition_matrix.to(compute_dtype)
    transition_scale_tril = transition_scale_tril.to(compute_dtype)
    cov_batch = torch.broadcast_shapes(filtered.filtered_scale_tril.shape[:-3],
                                       transition_matrix.shape[:-2], transition_scale_tril.shape[:-2])
    args = (_time_first(filtered.filtered_loc.to(compute_dtype), 1, batch_dims),
            _time_first(filtered.filtered_scale_tril.to(compute_dtype), 2, batch_dims),
            _time_first(filtered.predicted_loc.to(compute_dtype), 1, batch_dims),
            _time_first(filtered.predicted_scale_tril.to(compute_dtype), 2, batch_dims),
            _pad(transition_matrix, 2, batch_dims), _pad(transition_scale_tril, 2, batch_dims))
    return args, cov_batch


def rts_smoother(
    filtered: KalmanFilterResult,
    transition_matrix: torch.Tensor,
    transition_scale_tril: torch.Tensor,
    compute_dtype: torch.dtype = torch.float64,
    method: str = "auto",
) -> KalmanSmootherResult:
    r"""Rauch-Tung-Striebel smoother: :math:`P(s_t | z_{1:T})` for every t.

    .. math::

        G_t = P_{t|t} A^\top P_{t+1|t}^{-1}, \qquad
        \hat s_{t|T} = \hat s_{t|t} + G_t (\hat s_{t+1|T} - \hat s_{t+1|t}),

        P_{t|T} = (I - G_t A) P_{t|t} (I - G_t A)^\top + G_t Q G_t^\top + G_t P_{t+1|T} G_t^\top,

    the last in square-root form (triangularizing the three square roots side by side), a sum of
    positive semi-definite terms. In parallel (``method="parallel"``, or ``"auto"`` from
    ``PARALLEL_THRESHOLD`` frames) the smoothed distributions are the suffix products of the
    elements :math:`(G_t,\ \hat s_{t|t} - G_t \hat s_{t+1|t},\ (I - G_t A) P_{t|t} (I - G_t
    A)^\top + G_t Q G_t^\top)` (Särkkä & García-Fernández 2021; ``rpm.ops._kalman_scan``).
    A filter run with a mask needs nothing more: its missing frames' filtered states are their
    predictions, and the recursion is the same.

    :param KalmanFilterResult filtered: the output of :func:`kalman_filter`.
    :param torch.Tensor transition_matrix: A, ``(*batch, H, H)``.
    :param torch.Tensor transition_scale_tril: square root of Q, ``(*batch, H, H)``.
    :param torch.dtype compute_dtype: dtype of the arithmetic (float64 by default).
    :param str method: ``"auto"``, ``"sequential"`` or ``"parallel"``.
    :return: a :class:`KalmanSmootherResult`, shapes ``(*batch, T, H)`` and ``(*batch, T, H, H)``.
    """
    out_dtype = filtered.filtered_loc.dtype
    if use_parallel(method, filtered.filtered_loc.shape[-2]):
        args, cov_batch = _scan_inputs(filtered, transition_matrix, transition_scale_tril,
                                       compute_dtype, filtered.filtered_loc.dim() - 2)
        try:
            loc, scale = parallel_smoother(*args)
        except NotPositiveDefiniteError:  # "auto": the square-root recursion below
            if method == "parallel":
                raise
        else:
            num_steps, hidden_dim = filtered.filtered_loc.shape[-2:]
            return KalmanSmootherResult(
                loc.movedim(0, -2).to(out_dtype),
                scale.movedim(0, -3).reshape(*cov_batch, num_steps, hidden_dim, hidden_dim).to(out_dtype))
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
    method: str = "auto",
) -> torch.Tensor:
    r"""Forward filtering, backward sampling: a reparameterised draw of :math:`s_{1:T} | z_{1:T}`.

    .. math::

        s_T = \hat s_{T|T} + L_{T|T}\,\epsilon_T, \qquad
        s_t = \hat s_{t|t} + G_t (s_{t+1} - \hat s_{t+1|t}) + L^{c}_t\,\epsilon_t,

    with :math:`L^c_t` the square root of :math:`Cov[s_t | s_{t+1}, z_{1:t}] = (I - G_t A)
    P_{t|t} (I - G_t A)^\top + G_t Q G_t^\top` (Carter & Kohn 1994; Frühwirth-Schnatter 1994).
    The draw is an affine function of the standard normal ``noise`` and differentiable in every
    parameter. The recursion is affine in :math:`s_{t+1}`, so in parallel (``method``, as for
    :func:`rts_smoother`) it is a suffix scan of the pairs :math:`(G_t,\ \hat s_{t|t} - G_t
    \hat s_{t+1|t} + L^c_t \epsilon_t)` (``rpm.ops._kalman_scan``); densely (``"dense"``, or
    ``"auto"`` for windows of T H <= ``DENSE_THRESHOLD`` entries, within
    ``DENSE_WORK_THRESHOLD``) the recursion is the back
    substitution of one block bidiagonal triangular system, solved in one call
    (``rpm.ops._kalman_dense.dense_backward_sample``).

    :param KalmanFilterResult filtered: the output of :func:`kalman_filter`.
    :param torch.Tensor transition_matrix: A, ``(*batch, H, H)``.
    :param torch.Tensor transition_scale_tril: square root of Q, ``(*batch, H, H)``.
    :param torch.Tensor noise: :math:`\epsilon`, standard normal, shape ``(*sample, *batch, T, H)``.
    :param torch.dtype compute_dtype: dtype of the arithmetic (float64 by default).
    :param str method: ``"auto"``, ``"sequential"``, ``"parallel"`` or ``"dense"``.
    :return: :math:`s_{1:T}`, shape ``(*sample, *batch, T, H)``.
    """
    out_dtype = filtered.filtered_loc.dtype
    loc_f = filtered.filtered_loc.to(compute_dtype)
    loc_p = filtered.predicted_loc.to(compute_dtype)
    if noise.shape[-2:] != loc_f.shape[-2:]:
        raise ValueError(f"noise must end in shape (T, H) = {tuple(loc_f.shape[-2:])}, got "
                         f"{tuple(noise.shape)}")
    noise = noise.to(compute_dtype)
    num_steps, hidden_dim = loc_f.shape[-2:]
    covariances = torch.broadcast_shapes(filtered.filtered_scale_tril.shape[:-3],
                                         transition_matrix.shape[:-2],
                                         transition_scale_tril.shape[:-2]).numel()
    dense = use_dense(method, num_steps, 0, hidden_dim, None, covariances)
    if dense or use_parallel(method, num_steps):
        args, _ = _scan_inputs(filtered, transition_matrix, transition_scale_tril, compute_dtype,
                               noise.dim() - 2)
        sampler = dense_backward_sample if dense else parallel_backward_sample
        states = sampler(*args, _time_first(noise, 1, noise.dim() - 2))
        return states.movedim(0, -2).to(out_dtype)
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
    :param torch.Tensor transition_matrix: A, ``(*batch, H, H)``.
    :param torch.Tensor transition_scale_tril: square root of Q, ``(*batch, H, H)``.
    :param torch.Tensor observation_matrix: C, ``(*batch, D, H)``.
    :param torch.Tensor observation_scale_tril: square root of R, ``(*batch, D, D)``.
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
