r"""The Kalman filter of a short window as one dense Gaussian: the innovations are a Cholesky factor.

The model is that of :mod:`rpm.ops._kalman`: :math:`s_1 \sim \mathcal{N}(m_1, S_1)`,
:math:`s_{t+1} = A s_t + w_t`, :math:`w_t \sim \mathcal{N}(0, Q)`, :math:`z_t = C s_t + v_t`,
:math:`v_t \sim \mathcal{N}(0, R_t)`. Stacking the T frames, the states are an affine map of
independent standard normals, :math:`s = \bar s + \Psi \epsilon` with the block lower-triangular

.. math::

    \bar s_t = A^{t-1} m_1, \qquad \Psi_{tu} = A^{t-u} N_u \ (u \le t), \qquad
    N_1 = \operatorname{chol} S_1,\ N_u = \operatorname{chol} Q\ (u \ge 2),

so :math:`z_{1:T} \sim \mathcal{N}(\bar z, K)` with :math:`\bar z = (I \otimes C) \bar s`,
:math:`K = G G^\top + \operatorname{blockdiag}(R_t)`, :math:`G = (I \otimes C) \Psi`, and
:math:`\operatorname{Cov}(s, z) = \Psi G^\top`. With :math:`K = L L^\top` (Cholesky), the whitened
vector :math:`w = L^{-1}(z - \bar z)` is the sequence of the Kalman filter's whitened innovations:
L is lower triangular, so :math:`w_{1:t}` is a function of :math:`z_{1:t}` only, and its diagonal
blocks are the Cholesky factors of the innovation covariances (the prediction-error
decomposition of the Kalman filter is the block Cholesky factorisation of K). Hence

.. math::

    \log P(z_{1:T}) = -\tfrac12 \lVert w \rVert^2 - \sum_i \log L_{ii} - \tfrac{TD}{2} \log 2\pi,

and with :math:`Y = \operatorname{Cov}(s, w) = \Psi G^\top L^{-\top}` the filtered and predicted
states are the regressions on the innovations seen so far,

.. math::

    \hat s_{t|t} = \bar s_t + \sum_{j \in 1..t} Y_{tj} w_j, \qquad
    P_{t|t} = \operatorname{Cov}(s_t) - \sum_{j \in 1..t} Y_{tj} Y_{tj}^\top

(:math:`j \in 1..t-1` for the predictions :math:`\hat s_{t|t-1}`, :math:`P_{t|t-1}`), with
:math:`\operatorname{Cov}(s_t) = \sum_u \Psi_{tu} \Psi_{tu}^\top`. Everything but the last
matrix products involves only the parameters: for N sequences under one model (a shared
covariance recursion) a step is a few dozen small tensor operations in all, where the
recursions of :mod:`rpm.ops._kalman` and the scans of ``rpm.ops._kalman_scan`` take a few per
frame or per level. The cost grows as :math:`(T \max(D, H))^3`, so :mod:`rpm.ops._kalman` takes
this form for short windows only (:data:`rpm.ops._kalman.DENSE_THRESHOLD`) and, like the scans,
in covariance form: a Cholesky factorisation that fails, or a window whose smallest innovation
variance is below :data:`MIN_PIVOT_RATIO` times its largest marginal variance (where the
square-root recursions are the more accurate), raises :class:`NotPositiveDefiniteError` and
``method="auto"`` falls back to the recursions.

Shapes (inputs in the compute dtype): ``z`` ``(*batch, T, D)``; ``init_loc`` ``(*batch, H)``; the other
parameters ``(*cov, H, H)`` or ``(*cov, D, H)``; ``obs_scale`` ``(*cov, T or 1, D, D)``.
"""

from __future__ import annotations

import math

import torch

from rpm.ops._kalman_scan import NotPositiveDefiniteError, smoother_elements

__all__ = ["MIN_PIVOT_RATIO", "dense_backward_sample", "dense_filter", "dense_log_prob"]

#: The dense form is refused (:class:`NotPositiveDefiniteError`) where the smallest pivot of the
#: Cholesky factorisation of K (an innovation variance) is below this fraction of K's largest
#: diagonal entry (a lower bound of K's condition number is its inverse): the rounding error
#: of the covariance form, about the float64 epsilon times that condition number, is then no
#: longer negligible against the square-root recursions (here at most ~1e-8 relative).
MIN_PIVOT_RATIO = 1e-8


def _t(matrix: torch.Tensor) -> torch.Tensor:
    return matrix.transpose(-1, -2)


class _Joint:
    """The parameters' part: :math:`\\bar s`, :math:`\\Psi`, G, L = chol K (no sequence axis)."""

    def __init__(self, init_loc, init_scale_tril, transition_matrix, transition_scale_tril,
                 observation_matrix, obs_scale, num_steps: int):
        a, c = transition_matrix, observation_matrix
        hidden_dim, obs_dim = a.shape[-1], c.shape[-2]
        eye = torch.eye(hidden_dim, dtype=a.dtype, device=a.device)
        power_list = [eye.expand_as(a)]
        for _ in range(num_steps - 1):
            power_list.append(a @ power_list[-1])
        powers = torch.stack(power_list, -3)  # A^k, (*cov, T, H, H)
        steps = torch.arange(num_steps, device=a.device)
        lag = steps[:, None] - steps[None, :]  # t - u, (T, T)
        roots = torch.cat([
            init_scale_tril.unsqueeze(-3),
            transition_scale_tril.unsqueeze(-3).expand(
                *transition_scale_tril.shape[:-2], num_steps - 1, hidden_dim, hidden_dim)], -3)
        # Psi_{tu} = A^{t-u} N_u for u <= t, 0 above: (*cov, T, T, H, H)
        psi = (powers[..., lag.clamp(min=0), :, :] * (lag >= 0)[:, :, None, None].to(a.dtype)
               ) @ roots.unsqueeze(-4)
        g = c.unsqueeze(-3).unsqueeze(-3) @ psi  # C Psi_{tu}, (*cov, T, T, D, H)
        self.psi = psi.transpose(-3, -2).reshape(*psi.shape[:-4], num_steps * hidden_dim,
                                                 num_steps * hidden_dim)  # (*cov, TH, TH)
        self.g = g.transpose(-3, -2).reshape(*g.shape[:-4], num_steps * obs_dim,
                                             num_steps * hidden_dim)  # (*cov, TD, TH)
        r = obs_scale @ _t(obs_scale)  # (*cov, T or 1, D, D)
        r = r.expand(*r.shape[:-3], num_steps, obs_dim, obs_dim)
        eye_t = torch.eye(num_steps, dtype=r.dtype, device=r.device)
        r = (r.unsqueeze(-2) * eye_t[:, None, :, None]).reshape(
            *r.shape[:-3], num_steps * obs_dim, num_steps * obs_dim)  # blockdiag R_t
        cov_z = self.g @ _t(self.g) + r  # K, (*cov, TD, TD)
        chol, info = torch.linalg.cholesky_ex(cov_z)
        if bool((info > 0).any()):
            raise NotPositiveDefiniteError(
                "the dense Kalman covariance of the window is not positive definite; use "
                "method='sequential', the square-root filter")
        pivots = torch.diagonal(chol, dim1=-2, dim2=-1).square()
        if bool((pivots.min(-1).values < MIN_PIVOT_RATIO * torch.diagonal(
                cov_z, dim1=-2, dim2=-1).max(-1).values).any()):
            raise NotPositiveDefiniteError(
                "the dense Kalman covariance of the window is ill-conditioned; use "
                "method='sequential', the square-root filter")
        self.chol = chol
        self.mean_s = (powers @ init_loc[..., None, :, None]).squeeze(-1)  # A^{t-1} m_1, (*, T, H)
        self.mean_z = (c.unsqueeze(-3) @ self.mean_s.unsqueeze(-1)).squeeze(-1)  # (*, T, D)
        self.shape = (num_steps, obs_dim, hidden_dim)

    def whiten(self, z: torch.Tensor) -> torch.Tensor:
        """:math:`w = L^{-1}(z - \\bar z)`, ``(*batch, T D)``."""
        num_steps, obs_dim, _ = self.shape
        diff = (z - self.mean_z).reshape(*torch.broadcast_shapes(z.shape, self.mean_z.shape)[:-2],
                                         num_steps * obs_dim)
        chol = self.chol
        if chol.dim() == 2 or chol.shape[:-2].numel() == 1:  # one factor for every sequence
            chol = chol.reshape(chol.shape[-2:])
            flat = diff.reshape(-1, diff.shape[-1])
            return torch.linalg.solve_triangular(chol, _t(flat), upper=False).transpose(
                0, 1).reshape(diff.shape)
        return torch.linalg.solve_triangular(chol, diff.unsqueeze(-1), upper=False).squeeze(-1)

    def log_prob(self, white: torch.Tensor) -> torch.Tensor:
        size = white.shape[-1]
        return (-0.5 * white.square().sum(-1)
                - torch.diagonal(self.chol, dim1=-2, dim2=-1).log().sum(-1)
                - 0.5 * size * math.log(2 * math.pi))


def dense_log_prob(z: torch.Tensor, init_loc: torch.Tensor, init_scale_tril: torch.Tensor,
                   transition_matrix: torch.Tensor, transition_scale_tril: torch.Tensor,
                   observation_matrix: torch.Tensor, obs_scale: torch.Tensor) -> torch.Tensor:
    r""":math:`\log P(z_{1:T})` of the window's joint Gaussian (module docstring),

    .. math::

        \log P(z_{1:T}) = -\tfrac12 \lVert L^{-1}(z - \bar z) \rVert^2 - \sum_i \log L_{ii}
            - \tfrac{TD}{2} \log 2\pi, \qquad L L^\top = K = G G^\top + \operatorname{blockdiag}(R_t).

    :param torch.Tensor z: observations, ``(*batch, T, D)``.
    :param torch.Tensor init_loc: :math:`m_1`, ``(*batch, H)``.
    :param torch.Tensor init_scale_tril: square root of :math:`S_1`, ``(*cov, H, H)``.
    :param torch.Tensor transition_matrix: A, ``(*cov, H, H)``.
    :param torch.Tensor transition_scale_tril: square root of Q, ``(*cov, H, H)``.
    :param torch.Tensor observation_matrix: C, ``(*cov, D, H)``.
    :param torch.Tensor obs_scale: square roots of :math:`R_t`, ``(*cov, T or 1, D, D)``.
    :return: shape ``(*batch,)``.
    :raises NotPositiveDefiniteError: where K is not numerically positive definite or is
        ill-conditioned (:data:`MIN_PIVOT_RATIO`).
    """
    joint = _Joint(init_loc, init_scale_tril, transition_matrix, transition_scale_tril,
                   observation_matrix, obs_scale, z.shape[-2])
    return joint.log_prob(joint.whiten(z))


def dense_filter(z: torch.Tensor, init_loc: torch.Tensor, init_scale_tril: torch.Tensor,
                 transition_matrix: torch.Tensor, transition_scale_tril: torch.Tensor,
                 observation_matrix: torch.Tensor, obs_scale: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""The Kalman filter from the dense joint Gaussian (module docstring): with the whitened
    innovations :math:`w = L^{-1}(z - \bar z)` and :math:`Y = \Psi G^\top L^{-\top}`,
    :math:`\hat s_{t|t} = \bar s_t + \sum_{j \le t} Y_{tj} w_j`, :math:`P_{t|t} =
    \operatorname{Cov}(s_t) - \sum_{j \le t} Y_{tj} Y_{tj}^\top` (:math:`j < t` for the
    predictions). Arguments as for :func:`dense_log_prob`.

    :return: (log_prob ``(*batch,)``, filtered_loc ``(*batch, T, H)``, filtered_scale_tril
        ``(*cov, T, H, H)``, predicted_loc, predicted_scale_tril): the Cholesky factors of :math:`P_{t|t}` and
        :math:`P_{t|t-1}`.
    :raises NotPositiveDefiniteError: as :func:`dense_log_prob`, and where a filtered or
        predicted covariance is not numerically positive definite (a singular noise).
    """
    num_steps, obs_dim = z.shape[-2:]
    joint = _Joint(init_loc, init_scale_tril, transition_matrix, transition_scale_tril,
                   observation_matrix, obs_scale, num_steps)
    white = joint.whiten(z)  # (*batch, TD)
    hidden_dim = joint.shape[2]
    # Y = Cov(s, w) = Psi G^T L^{-T}: rows (t, H), columns the TD innovations
    regression = _t(torch.linalg.solve_triangular(joint.chol, joint.g @ _t(joint.psi), upper=False))
    regression = regression.reshape(*regression.shape[:-2], num_steps, hidden_dim,
                                    num_steps * obs_dim)  # (*cov, T, H, TD)
    frame = torch.arange(num_steps * obs_dim, device=z.device) // obs_dim  # frame of a column
    steps = torch.arange(num_steps, device=z.device)[:, None, None]
    seen = (regression * (frame <= steps).to(regression.dtype),  # innovations 1..t
            regression * (frame < steps).to(regression.dtype))  # 1..t-1
    rows = joint.psi.reshape(*joint.psi.shape[:-2], num_steps, hidden_dim, num_steps * hidden_dim)
    marginal = rows @ _t(rows)  # Cov(s_t), (*cov, T, H, H)
    out = []
    for y in seen:
        loc = joint.mean_s + (y @ white[..., None, :, None]).squeeze(-1)  # (*batch, T, H)
        cov = marginal - y @ _t(y)
        factor, info = torch.linalg.cholesky_ex(0.5 * (cov + _t(cov)))
        if bool((info > 0).any()):
            raise NotPositiveDefiniteError(
                "a filtered covariance of the dense Kalman filter is not positive definite; use "
                "method='sequential', the square-root filter")
        out.append((loc, factor))
    (loc_f, scale_f), (loc_p, scale_p) = out
    return joint.log_prob(white), loc_f, scale_f, loc_p, scale_p


def dense_backward_sample(loc_f: torch.Tensor, scale_f: torch.Tensor, loc_p: torch.Tensor,
                          scale_p: torch.Tensor, transition_matrix: torch.Tensor,
                          transition_scale_tril: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    r"""Forward filtering, backward sampling as one triangular solve.

    The draw of :func:`rpm.ops._kalman.backward_sample`, :math:`s_T = \hat s_{T|T} + L_{T|T}
    \epsilon_T` and :math:`s_t = E_t s_{t+1} + g_t + L^c_t \epsilon_t` (:math:`E_t` the smoother
    gain, :math:`g_t = \hat s_{t|t} - E_t \hat s_{t+1|t}`, :math:`L^c_t` the square root of
    :math:`Cov[s_t | s_{t+1}, z_{1:t}]`), is the solution of :math:`B s = c` with B the block
    upper-bidiagonal matrix of identities on the diagonal and :math:`-E_t` above it, and
    :math:`c_t = g_t + L^c_t \epsilon_t`: back substitution, the recursion itself, in one call
    instead of T steps or the levels of a scan. Inputs time first, as for
    :func:`rpm.ops._kalman_scan.parallel_backward_sample`: ``noise`` ``(T, *sample, *batch, H)``.
    Returns the draws, ``(T, *sample, *batch, H)``.
    """
    num_steps, hidden_dim = loc_f.shape[0], loc_f.shape[-1]
    gain, offset, conditional_scale = smoother_elements(
        loc_f, scale_f, loc_p, scale_p, transition_matrix, transition_scale_tril)
    last = loc_f[-1] + (scale_f[-1] @ noise[-1].unsqueeze(-1)).squeeze(-1)
    shifts = offset + (conditional_scale @ noise[:-1].unsqueeze(-1)).squeeze(-1)  # (T-1, ..., H)
    shape = torch.broadcast_shapes(shifts.shape[1:], last.shape)
    rhs = torch.cat([shifts.expand(num_steps - 1, *shape), last.expand(shape).unsqueeze(0)])
    rhs = rhs.movedim(0, -2).reshape(*shape[:-1], num_steps * hidden_dim)  # (..., T H)
    # B = I - superdiag(E_t): E_t at block (t, t + 1)
    gain = torch.cat([gain, gain.new_zeros(1, *gain.shape[1:])]).movedim(0, -3)  # (*cov, T, H, H)
    above = torch.ones(num_steps, num_steps, dtype=gain.dtype, device=gain.device).triu(1).tril(1)
    blocks = gain.unsqueeze(-3) * above[:, :, None, None]  # E_t at (t, t + 1), (*cov, T, T, H, H)
    size = num_steps * hidden_dim
    band = torch.eye(size, dtype=gain.dtype, device=gain.device) - blocks.transpose(-3, -2).reshape(
        *blocks.shape[:-4], size, size)
    if band.shape[:-2].numel() == 1:  # one matrix for every sequence and draw
        flat = rhs.reshape(-1, size)
        states = torch.linalg.solve_triangular(band.reshape(size, size), _t(flat), upper=True,
                                               unitriangular=True).transpose(0, 1)
    else:
        states = torch.linalg.solve_triangular(band, rhs.unsqueeze(-1), upper=True,
                                               unitriangular=True).squeeze(-1)
    return states.reshape(*rhs.shape[:-1], num_steps, hidden_dim).movedim(-2, 0)
