r"""Linear dynamical systems: the ``linear_small``, ``linear_medium`` and ``linear_large`` tasks of
RP-GSSM (Hromadka et al., 2025), generated here (``rpm lds``).

A hidden state :math:`s_t \in \mathbb{R}^H` follows a *stationary* linear-Gaussian chain and
each observation :math:`x_t \in \mathbb{R}^P` is a noisy linear read-out of it,

.. math::

    s_1 \sim \mathcal{N}(0, I), \quad s_{t+1} = A s_t + w_t,\ w_t \sim \mathcal{N}(0, I - A A^\top),
    \quad x_t = C s_t + v_t,\ v_t \sim \mathcal{N}(0, \sigma^2 I),

with :math:`A = \rho R`, R a random rotation (orthogonal, determinant +1, drawn from the Haar
measure) and :math:`\rho` = ``decay`` (0.95): the eigenvalues of A are :math:`\rho e^{\pm i
\phi_k}` (and :math:`\rho` for odd H), on a circle of radius :math:`\rho`. Since
:math:`A A^\top = \rho^2 I`, the process noise is :math:`(1 - \rho^2) I` and every
:math:`s_t` is exactly :math:`\mathcal{N}(0, I)`: the chain starts in its stationary law. The
emission is :math:`C = \sqrt{P/H}\, U V^\top` with U (P x H) and V (H x H) random orthonormal
columns: every direction of the state is observed equally well (all singular values
:math:`\sqrt{P/H}`; a Gaussian C is often nearly singular at these sizes, which would cap the
recoverable :math:`R^2` below 0.99), and the coordinates of :math:`C s_t` have variance 1 on
average, against the observation noise :math:`\sigma` = 0.1.

:data:`LDS_SIZES` lists the three tasks: (H, P) = (3, 5), (5, 10), (10, 20); each has 200
sequences of 100 steps.

References:
    M. Hromadka, Y. Jiang, L. Duncker et al., "Recognition-parametrised Gaussian state-space
    models" (RP-GSSM), 2025.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from rpm._validation import check_positive_int

__all__ = ["LDS_SIZES", "LinearDynamicalSystem", "generate_lds", "random_rotation"]

#: The tasks of ``rpm lds --size``: name -> (state dimension H, observation dimension P).
LDS_SIZES: dict[str, tuple[int, int]] = {"small": (3, 5), "medium": (5, 10), "large": (10, 20)}


class LinearDynamicalSystem(NamedTuple):
    r"""Sequences of a linear dynamical system and the system itself (module docstring).

    :ivar torch.Tensor observations: :math:`x_{1:T}` of every sequence, shape (N, T, P).
    :ivar torch.Tensor states: :math:`s_{1:T}`, shape (N, T, H).
    :ivar torch.Tensor transition_matrix: A, shape (H, H).
    :ivar torch.Tensor process_covariance: :math:`I - A A^\top`, shape (H, H).
    :ivar torch.Tensor observation_matrix: C, shape (P, H).
    :ivar float observation_noise: :math:`\sigma`, the standard deviation of :math:`v_t`.
    """

    observations: torch.Tensor
    states: torch.Tensor
    transition_matrix: torch.Tensor
    process_covariance: torch.Tensor
    observation_matrix: torch.Tensor
    observation_noise: float

    @property
    def eigenvalues(self) -> torch.Tensor:
        """The eigenvalues of A (complex), shape (H,)."""
        return torch.linalg.eigvals(self.transition_matrix)


def random_rotation(dim: int, generator: torch.Generator | None = None) -> torch.Tensor:
    r"""A rotation of :math:`\mathbb{R}^{dim}` drawn from the Haar measure on SO(dim).

    The QR decomposition of a matrix of standard normals, :math:`G = QR`, with the columns of Q
    multiplied by the signs of :math:`\operatorname{diag} R` is Haar-distributed on O(dim)
    (Mezzadri 2007); one column flipped when the determinant is -1 gives SO(dim).

    :param int dim: the dimension, >= 1.
    :param torch.Generator generator: the random stream (default: torch's global one).
    :return: an orthogonal matrix with determinant +1, float64, shape (dim, dim).
    """
    check_positive_int("dim", dim)
    gaussian = torch.randn(dim, dim, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(gaussian)
    q = q * torch.sign(torch.diagonal(r))  # the Haar measure on O(dim)
    if torch.linalg.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


def _random_emission(obs_dim: int, state_dim: int, generator: torch.Generator) -> torch.Tensor:
    """C = sqrt(P / H) U V^T with U (P, m) and V (H, m) random orthonormal columns, m = min(P, H):
    all singular values equal, so every direction of the state is observed equally well."""
    u = random_rotation(obs_dim, generator)[:, :min(obs_dim, state_dim)]
    v = random_rotation(state_dim, generator)[:, :min(obs_dim, state_dim)]
    return (obs_dim / state_dim) ** 0.5 * u @ v.T


def generate_lds(num_sequences: int, num_steps: int, state_dim: int, obs_dim: int,
                 decay: float = 0.95, observation_noise: float = 0.1,
                 seed: int = 0) -> LinearDynamicalSystem:
    r"""Simulates ``num_sequences`` sequences of ``num_steps`` steps of one random stationary
    linear dynamical system (module docstring), all in float64.

    The system (A, C) is drawn first and the sequences after it, from one generator seeded by
    ``seed``: more sequences with the same seed share the system and extend the set (the first
    sequences do not change), so held-out sequences are the last ones of a longer call.

    :param int num_sequences: N, >= 1.
    :param int num_steps: T, >= 1.
    :param int state_dim: H, >= 1.
    :param int obs_dim: P, >= 1.
    :param float decay: :math:`\rho`, the modulus of every eigenvalue of A, in (0, 1).
    :param float observation_noise: :math:`\sigma \ge 0`.
    :param int seed: the seed of the system and the sequences.
    """
    for name, value in (("num_sequences", num_sequences), ("num_steps", num_steps),
                        ("state_dim", state_dim), ("obs_dim", obs_dim)):
        check_positive_int(name, value)
    if not 0.0 < decay < 1.0:
        raise ValueError(f"decay must lie in (0, 1) for a stationary chain, got {decay!r}")
    if not 0.0 <= observation_noise < float("inf"):
        raise ValueError(f"observation_noise must be finite and >= 0, got {observation_noise!r}")
    generator = torch.Generator().manual_seed(seed)
    transition = decay * random_rotation(state_dim, generator)  # A, (H, H)
    emission = _random_emission(obs_dim, state_dim, generator)  # C, (P, H)
    covariance = torch.eye(state_dim, dtype=torch.float64) - transition @ transition.T
    process_scale = torch.linalg.cholesky(covariance)
    # One draw per sequence, in order, so that the first sequences do not depend on N.
    noise = torch.stack([torch.randn(num_steps, state_dim + obs_dim, generator=generator,
                                     dtype=torch.float64)
                         for _ in range(num_sequences)])  # (N, T, H + P)
    noise_s, noise_x = noise.split([state_dim, obs_dim], dim=-1)
    path = [noise_s[:, 0]]  # s_1 ~ N(0, I), (N, H)
    for t in range(1, num_steps):
        path.append(path[-1] @ transition.T + noise_s[:, t] @ process_scale.T)
    states = torch.stack(path, dim=1)  # (N, T, H)
    observations = states @ emission.T + observation_noise * noise_x  # (N, T, P)
    return LinearDynamicalSystem(
        observations=observations, states=states,
        transition_matrix=transition, process_covariance=covariance,
        observation_matrix=emission, observation_noise=float(observation_noise))
