r"""The stationary covariance of a stable linear-Gaussian chain (discrete Lyapunov equation).

For :math:`s_{t+1} = A s_t + w_t`, :math:`w_t \sim \mathcal{N}(0, Q)`, with every eigenvalue of
A inside the unit circle, the state's distribution converges to :math:`\mathcal{N}(0, P)` with

.. math::

    P = A P A^\top + Q \quad\Longleftrightarrow\quad
    (I - A \otimes A)\, \operatorname{vec} P = \operatorname{vec} Q,

the series :math:`P = \sum_{k \ge 0} A^k Q (A^k)^\top`. The vectorised form is an
:math:`H^2 \times H^2` linear solve, exact and differentiable, meant for the small hidden
dimensions of the state-space priors (H up to a few dozen).
"""

from __future__ import annotations

import torch

__all__ = ["stationary_covariance"]


def stationary_covariance(transition_matrix: torch.Tensor, process_covariance: torch.Tensor
                          ) -> torch.Tensor:
    r"""The solution P of :math:`P = A P A^\top + Q` (module docstring).

    :param torch.Tensor transition_matrix: A, shape (..., H, H), spectral radius below 1.
    :param torch.Tensor process_covariance: Q, shape (..., H, H), symmetric positive definite.
    :return: P, shape (..., H, H), symmetrised.
    :raises ValueError: if A has an eigenvalue of modulus 1 or more (no stationary
        distribution).
    """
    hidden = transition_matrix.shape[-1]
    if transition_matrix.shape[-2:] != (hidden, hidden) or process_covariance.shape[-2:] != (
            hidden, hidden):
        raise ValueError("transition_matrix and process_covariance must both be square (..., H, "
                         f"H), got {tuple(transition_matrix.shape)} and "
                         f"{tuple(process_covariance.shape)}")
    radius = torch.linalg.eigvals(transition_matrix.detach()).abs().max().item()
    if radius >= 1.0:
        raise ValueError(f"the chain has no stationary distribution: the transition matrix has "
                         f"an eigenvalue of modulus {radius:.4g} >= 1; damp it (e.g. multiply by "
                         "0.99)")
    batch = torch.broadcast_shapes(transition_matrix.shape[:-2], process_covariance.shape[:-2])
    a = transition_matrix.expand(*batch, hidden, hidden)
    q = process_covariance.expand(*batch, hidden, hidden)
    eye = torch.eye(hidden * hidden, dtype=a.dtype, device=a.device)
    kron = (a.unsqueeze(-1).unsqueeze(-3) * a.unsqueeze(-2).unsqueeze(-4)).reshape(
        *batch, hidden * hidden, hidden * hidden)  # (A kron A)[(i,k),(j,l)] = A_ij A_kl
    solution = torch.linalg.solve(eye - kron, q.reshape(*batch, hidden * hidden, 1))
    p = solution.reshape(*batch, hidden, hidden)
    return 0.5 * (p + p.transpose(-1, -2))
