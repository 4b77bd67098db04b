r"""The Kalman filter, RTS smoother and backward sampler as associative scans over time.

Särkkä & García-Fernández (2021), "Temporal parallelization of Bayesian smoothers" (IEEE TAC
66(1)), write each step of the filter and of the smoother as an element of an associative
operation, so that all T filtered (smoothed) distributions are the prefix (suffix) products of
the elements, computed by :func:`~rpm.ops._associative_scan.associative_scan` in
:math:`O(\log T)` depth. The model is that of :mod:`rpm.ops._kalman`:
:math:`s_1 \sim \mathcal{N}(m_1, S_1)`, :math:`s_{t+1} = A s_t + w_t`,
:math:`w_t \sim \mathcal{N}(0, Q)`, :math:`z_t = C s_t + v_t`, :math:`v_t \sim \mathcal{N}(0, R_t)`.

**Filter** (Lemmas 7-8 of the paper; our first state is drawn from :math:`\mathcal{N}(m_1,
S_1)` directly instead of one transition after :math:`x_0`). Element t >= 2 is the conditional
:math:`p(s_t | s_{t-1}, z_t) = \mathcal{N}(F_t s_{t-1} + b_t, C_t)` together with the
likelihood of :math:`s_{t-1}` given :math:`z_t`, :math:`\propto \mathcal{N}_I(s_{t-1};
\eta_t, J_t)` (information form):

.. math::

    S_t = C Q C^\top + R_t, \quad K_t = Q C^\top S_t^{-1}, \quad
    F_t = (I - K_t C) A, \quad b_t = K_t z_t, \quad C_t = (I - K_t C) Q,

    \eta_t = A^\top C^\top S_t^{-1} z_t, \quad J_t = A^\top C^\top S_t^{-1} C A;

element 1 is the filtered distribution of the first state (:math:`F_1 = 0`, :math:`b_1 =
m_1 + K_1 (z_1 - C m_1)`, :math:`C_1 = S_1 - K_1 C S_1`, :math:`K_1 = S_1 C^\top (C S_1
C^\top + R_1)^{-1}`, :math:`\eta_1 = 0`, :math:`J_1 = 0`). The combination of an earlier
element i and a later j is (Eq. 30-32 of the paper)

.. math::

    F_{ij} = F_j (I + C_i J_j)^{-1} F_i, \quad
    b_{ij} = F_j (I + C_i J_j)^{-1} (b_i + C_i \eta_j) + b_j, \quad
    C_{ij} = F_j (I + C_i J_j)^{-1} C_i F_j^\top + C_j,

    \eta_{ij} = F_i^\top (I + J_j C_i)^{-1} (\eta_j - J_j b_i) + \eta_i, \quad
    J_{ij} = F_i^\top (I + J_j C_i)^{-1} J_j F_i + J_i,

and the prefix product up to t holds the filtered mean :math:`b` and covariance :math:`C` of
:math:`s_t` given :math:`z_{1:t}`. A missing frame (``mask`` False) has no observation: its
element is the bare transition, :math:`F_t = A`, :math:`b_t = 0`, :math:`C_t = Q`,
:math:`\eta_t = 0`, :math:`J_t = 0` (for t = 1: :math:`b_1 = m_1`, :math:`C_1 = S_1`).
The log-likelihood is then the prediction-error decomposition evaluated at every t at once,
:math:`\sum_t \log \mathcal{N}(z_t; C A \hat s_{t-1|t-1}, C (A P_{t-1|t-1} A^\top + Q) C^\top
+ R_t)`, over the observed frames.

**Smoother** (Lemmas 9-10). Element t < T is :math:`p(s_t | s_{t+1}, z_{1:t}) =
\mathcal{N}(E_t s_{t+1} + g_t, L_t)` with :math:`E_t = P_{t|t} A^\top P_{t+1|t}^{-1}`,
:math:`g_t = \hat s_{t|t} - E_t \hat s_{t+1|t}`, :math:`L_t = (I - E_t A) P_{t|t} (I - E_t
A)^\top + E_t Q E_t^\top`; element T is :math:`(0, \hat s_{T|T}, P_{T|T})`. The combination is
:math:`E_{ij} = E_i E_j`, :math:`g_{ij} = E_i g_j + g_i`, :math:`L_{ij} = E_i L_j E_i^\top +
L_i` and the suffix product from t holds the smoothed mean and covariance. Backward sampling
is the same affine recursion on a draw, :math:`s_t = E_t s_{t+1} + g_t + \operatorname{chol}(
L_t)\,\epsilon_t`, a scan over :math:`(E_t, c_t)` with the same combination.

The arithmetic is in the covariance form (not square roots), in the dtype of the inputs
(float64 from :mod:`rpm.ops._kalman`); the square roots returned are Cholesky factors of the
symmetrised covariances. Shapes: the time axis is axis 0 inside this module; the parameters
carry the batch dimensions of the covariances (``cov``), the means those of the sequences.
"""

from __future__ import annotations

import math

import torch

from rpm.ops._associative_scan import associative_scan
from rpm.ops._square_root import triangularize

__all__ = ["NotPositiveDefiniteError", "parallel_backward_sample", "parallel_filter",
           "parallel_smoother"]


class NotPositiveDefiniteError(ValueError):
    """A covariance of the scans is not numerically positive definite."""


def _t(matrix: torch.Tensor) -> torch.Tensor:
    return matrix.transpose(-1, -2)


def _sym(matrix: torch.Tensor) -> torch.Tensor:
    return 0.5 * (matrix + _t(matrix))


def _matvec(matrix: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
    return (matrix @ vector.unsqueeze(-1)).squeeze(-1)


def _cholesky(matrix: torch.Tensor, what: str) -> torch.Tensor:
    factor, info = torch.linalg.cholesky_ex(_sym(matrix))
    if bool((info > 0).any()):
        raise NotPositiveDefiniteError(
            f"the parallel Kalman {what} covariance is not positive definite (a singular process "
            "or observation noise, or an ill-conditioned model); use method='sequential', the "
            "square-root filter, which keeps semi-definite covariances exact")
    return factor


def _filter_combine(earlier, later):
    """Eq. 30-32 of Särkkä & García-Fernández (2021) for many pairs at once."""
    f1, b1, c1, eta1, j1 = earlier
    f2, b2, c2, eta2, j2 = later
    eye = torch.eye(f1.shape[-1], dtype=f1.dtype, device=f1.device)
    m = eye + c1 @ j2  # I + C_i J_j
    x = _t(torch.linalg.solve(_t(m), _t(f2)))  # F_j (I + C_i J_j)^{-1}
    y = _t(torch.linalg.solve(m, f1))  # F_i^T (I + J_j C_i)^{-1}, as (I + J_j C_i) = m^T
    return (x @ f1,
            _matvec(x, b1 + _matvec(c1, eta2)) + b2,
            _sym(x @ c1 @ _t(f2)) + c2,
            _matvec(y, eta2 - _matvec(j2, b1)) + eta1,
            _sym(y @ j2 @ f1) + j1)


def _smoother_combine(earlier, later):
    e1, g1, l1 = earlier
    e2, g2, l2 = later
    return e1 @ e2, _matvec(e1, g2) + g1, _sym(e1 @ l2 @ _t(e1)) + l1


def _affine_combine(earlier, later):
    e1, c1 = earlier
    e2, c2 = later
    return e1 @ e2, _matvec(e1, c2) + c1


def parallel_filter(z, mask, init_loc, init_scale_tril, transition_matrix, transition_scale_tril,
                    observation_matrix, observation_scale_tril):
    r"""The Kalman filter as a prefix scan (module docstring).

    :param z: observations, time first: ``(T, *batch, D)``; missing frames' values are ignored.
    :param mask: None, or a bool tensor ``(T, *mask_batch)``, True where the frame is observed.
    :param init_loc: ``(*batch, H)``. :param init_scale_tril: ``(*cov, H, H)``.
    :param transition_matrix: ``(*cov, H, H)``. :param transition_scale_tril: ``(*cov, H, H)``.
    :param observation_matrix: ``(*cov, D, H)``.
    :param observation_scale_tril: square roots of R_t, time first: ``(T or 1, *cov, D, D)``.
    :return: (log_prob ``(*batch,)``, filtered_loc ``(T, *batch, H)``, filtered_scale_tril
        ``(T, *cov', H, H)``, predicted_loc, predicted_scale_tril), with cov' the covariances'
        batch shape (that of the mask included).
    """
    num_steps, obs_dim = z.shape[0], z.shape[-1]
    a, c = transition_matrix, observation_matrix
    q = transition_scale_tril @ _t(transition_scale_tril)
    s1 = init_scale_tril @ _t(init_scale_tril)
    r = observation_scale_tril @ _t(observation_scale_tril)  # (T or 1, *cov, D, D)
    if mask is not None:
        z = torch.where(mask.unsqueeze(-1), z, torch.zeros((), dtype=z.dtype, device=z.device))
    # Elements t >= 2 (computed for every t; the first is replaced below).
    cq, ca = c @ q, c @ a  # (*cov, D, H)
    scale = torch.linalg.cholesky(cq @ _t(c) + r)  # chol S_t, (T or 1, *cov, D, D)
    gain_t = torch.cholesky_solve(cq.expand(*scale.shape[:-1], cq.shape[-1]), scale)  # K_t^T
    info = torch.cholesky_solve(ca.expand(*scale.shape[:-1], ca.shape[-1]), scale)  # S^-1 C A
    f = a - _t(gain_t) @ ca
    cov = _sym(q - _t(gain_t) @ cq)
    j = _sym(_t(ca) @ info)
    b = _matvec(_t(gain_t), z)  # (T, *batch, H)
    eta = _matvec(_t(info), z)
    # Element 1: the filtered first state.
    cs1 = c @ s1
    scale1 = torch.linalg.cholesky(cs1 @ _t(c) + r[0])
    gain1_t = torch.cholesky_solve(cs1, scale1)  # K_1^T, (*cov, D, H)
    b1 = init_loc + _matvec(_t(gain1_t), z[0] - _matvec(c, init_loc))
    c1 = _sym(s1 - _t(gain1_t) @ cs1)
    zero_h = torch.zeros_like(a)
    steps = num_steps - 1

    def first_then_rest(first, rest):
        rest = rest.expand(num_steps, *rest.shape[1:]) if rest.shape[0] == 1 else rest
        shape = torch.broadcast_shapes(first.shape, rest.shape[1:])
        return torch.cat([first.expand(shape).unsqueeze(0), rest[1:].expand(steps, *shape)], 0)

    f = first_then_rest(zero_h, f)
    b = first_then_rest(b1, b)
    cov = first_then_rest(c1, cov)
    eta = first_then_rest(torch.zeros_like(b1), eta)
    j = first_then_rest(torch.zeros_like(c1), j)
    if mask is not None:
        observed = mask.unsqueeze(-1)  # (T, *mask_batch, 1)
        observed2 = observed.unsqueeze(-1)
        bare_f = torch.cat([zero_h.unsqueeze(0), a.expand(steps, *a.shape)], 0)
        bare_b = torch.cat([init_loc.unsqueeze(0), torch.zeros_like(b[1:])], 0)
        bare_c = torch.cat([s1.unsqueeze(0), q.expand(steps, *q.shape)], 0)
        f = torch.where(observed2, f, bare_f)
        b = torch.where(observed, b, bare_b)
        cov = torch.where(observed2, cov, bare_c)
        eta = torch.where(observed, eta, torch.zeros_like(eta))
        j = torch.where(observed2, j, torch.zeros_like(j))
    _, loc_f, cov_f, _, _ = associative_scan(_filter_combine, (f, b, cov, eta, j))
    # Predictions from the filtered states; the likelihood by prediction-error decomposition.
    loc_p = torch.cat([init_loc.expand_as(loc_f[:1]), _matvec(a, loc_f[:-1])], 0)
    cov_p = torch.cat([s1.expand_as(cov_f[:1]),
                       _sym(a @ cov_f[:-1] @ _t(a)) + q], 0)
    innovation_scale = torch.linalg.cholesky(_sym(c @ cov_p @ _t(c)) + r)  # (T, *cov', D, D)
    white = torch.linalg.solve_triangular(
        innovation_scale, (z - _matvec(c, loc_p)).unsqueeze(-1), upper=False).squeeze(-1)
    terms = (-0.5 * white.square().sum(-1)
             - torch.diagonal(innovation_scale, dim1=-2, dim2=-1).log().sum(-1)
             - 0.5 * obs_dim * math.log(2 * math.pi))  # (T, *batch)
    if mask is not None:
        terms = torch.where(mask, terms, torch.zeros((), dtype=terms.dtype, device=terms.device))
    return (terms.sum(0), loc_f, _cholesky(cov_f, "filtered"), loc_p,
            _cholesky(cov_p, "predicted"))


def smoother_elements(loc_f, scale_f, loc_p, scale_p, transition_matrix, transition_scale_tril):
    """The smoother's gains E_t, offsets g_t and square roots of L_t (t < T), time first (also
    the elements of ``rpm.ops._kalman_dense.dense_backward_sample``)."""
    cov_f = scale_f[:-1] @ _t(scale_f[:-1])
    # E_t^T = P_{t+1|t}^{-1} A P_{t|t}
    gain = _t(torch.cholesky_solve(transition_matrix @ cov_f, scale_p[1:]))  # (T-1, *cov, H, H)
    offset = loc_f[:-1] - _matvec(gain, loc_p[1:])
    eye = torch.eye(gain.shape[-1], dtype=gain.dtype, device=gain.device)
    # Joseph form: L_t = (I - E A) P (I - E A)^T + E Q E^T, one batched QR for every t.
    residual = (eye - gain @ transition_matrix) @ scale_f[:-1]
    noise = gain @ transition_scale_tril.expand(*gain.shape)
    conditional_scale = triangularize(torch.cat([residual, noise], -1))
    return gain, offset, conditional_scale


def parallel_smoother(loc_f, scale_f, loc_p, scale_p, transition_matrix, transition_scale_tril):
    r"""The RTS smoother as a suffix scan (module docstring); inputs time first, as returned by
    :func:`parallel_filter`. Returns the smoothed loc ``(T, *batch, H)`` and scale_tril."""
    gain, offset, conditional_scale = smoother_elements(
        loc_f, scale_f, loc_p, scale_p, transition_matrix, transition_scale_tril)
    last_cov = scale_f[-1:] @ _t(scale_f[-1:])
    shape = torch.broadcast_shapes(gain.shape[1:], last_cov.shape[1:])
    e = torch.cat([gain.expand(gain.shape[0], *shape), torch.zeros_like(last_cov.expand(1, *shape))])
    g = torch.cat([offset, loc_f[-1:].expand(1, *offset.shape[1:])])
    cov = torch.cat([(conditional_scale @ _t(conditional_scale)).expand(gain.shape[0], *shape),
                     last_cov.expand(1, *shape)])
    _, loc, cov = associative_scan(_smoother_combine, (e, g, cov), reverse=True)
    return loc, _cholesky(cov, "smoothed")


def parallel_backward_sample(loc_f, scale_f, loc_p, scale_p, transition_matrix,
                             transition_scale_tril, noise):
    r"""Forward filtering, backward sampling as a suffix scan: the affine recursion
    :math:`s_t = E_t s_{t+1} + g_t + \operatorname{chol}(L_t) \epsilon_t`; ``noise`` time first,
    ``(T, *sample, *batch, H)``. Returns the draws, ``(T, *sample, *batch, H)``."""
    gain, offset, conditional_scale = smoother_elements(
        loc_f, scale_f, loc_p, scale_p, transition_matrix, transition_scale_tril)
    last = loc_f[-1] + _matvec(scale_f[-1], noise[-1])
    shifts = offset + _matvec(conditional_scale, noise[:-1])  # (T-1, *sample, *batch, H)
    shape = torch.broadcast_shapes(shifts.shape[1:], last.shape)
    c = torch.cat([shifts.expand(shifts.shape[0], *shape), last.expand(shape).unsqueeze(0)])
    e = torch.cat([gain, gain.new_zeros((1, *gain.shape[1:]))])
    _, states = associative_scan(_affine_combine, (e, c), reverse=True)
    return states
