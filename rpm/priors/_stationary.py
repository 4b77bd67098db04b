r"""A stationary, scale-pinned linear-Gaussian state-space prior (``docs/theory.md``,
*Stationary state-space prior*; the chain of RP-GSSM, Hromadka et al. 2025).

The hidden state has the same distribution at every frame,

.. math::

    s_1 \sim \mathcal{N}(0, I), \quad s_{t+1} = A s_t + w_t,\ w_t \sim \mathcal{N}(0, I - A A^\top),
    \quad z_t = C s_t + b + v_t,\ v_t \sim \mathcal{N}(0, R),

so :math:`s_t \sim \mathcal{N}(0, I)` for every t (:math:`A I A^\top + Q = I`) and
:math:`z_t \sim \mathcal{N}(b, C C^\top + R)`: the scale of the latents lives in C and R alone,
and the transition A carries only the temporal correlation, :math:`\mathrm{Cov}(s_{t+k}, s_t) =
A^k`. The free state-space prior (:class:`~rpm.priors.StateSpacePrior`) can fit the scale of
the latents through A as well as through Q, C and R, and under the RPM's ELBO its dynamics drift
while the ELBO rises (``docs/theory.md``, why the unpinned chain drifts); here they cannot trade.

**Parametrisation.** A must keep its singular values below 1 (Q positive definite). With an
unconstrained :math:`W \in \mathbb{R}^{H \times H}` and :math:`L L^\top = I + W W^\top`
(Cholesky),

.. math::

    A = L^{-1} W, \qquad Q = I - A A^\top = L^{-1} L^{-\top},

since :math:`A A^\top = L^{-1} (L L^\top - I) L^{-\top} = I - L^{-1} L^{-\top}`. The singular
values of A are :math:`\sigma_i(W) / \sqrt{1 + \sigma_i(W)^2} < 1` for every W, Q's Cholesky
factor is the triangular :math:`L^{-1}` itself (no subtraction that could lose definiteness, no
SVD, no clipping), and the map is onto the strict contractions: given A with
:math:`\lVert A\rVert_2 < 1`, :math:`W = \operatorname{chol}(I - A A^\top)^{-1} A`. Any stable
chain :math:`(A_0, Q_0)` is such a chain in the basis that whitens its stationary covariance
:math:`P_0 = S S^\top`: :math:`A = S^{-1} A_0 S`, :math:`C = C_0 S`
(:meth:`StationaryStateSpacePrior.from_dynamics`).

The log-likelihood is the Kalman filter's (:class:`~rpm.distributions.GaussianStateSpace`, square-root
form in float64), the structured guide the same as the free prior's
(:class:`~rpm.distributions.StateSpacePosterior`). Pyro's :class:`~pyro.distributions.GaussianHMM`
with initial state :math:`\mathcal{N}(0, I)` describes this chain without any conversion: one
transition from the stationary distribution leaves it unchanged.
"""

from __future__ import annotations

import pyro
import torch
from pyro.nn import PyroParam
from torch.distributions import constraints

from rpm._validation import check_positive_int
from rpm.distributions._state_space import GaussianStateSpace
from rpm.ops._lyapunov import stationary_covariance
from rpm.priors._state_space import LinearGaussianPrior, _cholesky_init

__all__ = ["StationaryStateSpacePrior", "contraction_weight"]


def contraction_weight(transition_matrix: torch.Tensor) -> torch.Tensor:
    r"""The W of a strict contraction A (:math:`\lVert A \rVert_2 < 1`):
    :math:`W = \operatorname{chol}(I - A A^\top)^{-1} A`, the inverse of the parametrisation
    :math:`A = L^{-1} W`, :math:`L L^\top = I + W W^\top` (module docstring).

    :param torch.Tensor transition_matrix: A, shape (..., H, H).
    :return: W, shape (..., H, H).
    :raises ValueError: if a singular value of A is 1 or more.
    """
    eye = torch.eye(transition_matrix.shape[-1], dtype=transition_matrix.dtype,
                    device=transition_matrix.device)
    noise = eye - transition_matrix @ transition_matrix.transpose(-1, -2)
    scale_tril, info = torch.linalg.cholesky_ex(noise)
    if (info != 0).any():
        norm = torch.linalg.matrix_norm(transition_matrix.detach(), ord=2).max().item()
        raise ValueError(f"a stationary chain with unit state covariance needs the transition's "
                         f"singular values below 1, got a largest singular value {norm:.4g}; "
                         "give the dynamics with their own process noise to from_dynamics, "
                         "which whitens them")
    return torch.linalg.solve_triangular(scale_tril, transition_matrix, upper=False)


class StationaryStateSpacePrior(LinearGaussianPrior):
    r"""A learned stationary linear-Gaussian state-space prior :math:`P(z_{1:T})` over T views.

    .. math::

        s_1 \sim \mathcal{N}(0, I), \quad s_{t+1} \sim \mathcal{N}(A s_t,\ I - A A^\top), \quad
        z_t \sim \mathcal{N}(C s_t + b,\ R),

    with :math:`A = L^{-1} W`, :math:`L L^\top = I + W W^\top` (singular values of A below 1 for
    every W; module docstring), C and b unconstrained and R held through its Cholesky factor
    (``constraints.lower_cholesky``); W, C, b and R are learned unless switched off (then each
    stays at its start as a buffer, kept in the ``state_dict``). Every frame's latent has the
    same marginal :math:`\mathcal{N}(b, C C^\top + R)` (:meth:`marginal`). Called inside the
    model's plate over sequences as ``prior(q)`` it declares ``"z"`` ~
    :class:`~rpm.distributions.GaussianStateSpace` (event_shape (T, D)); :meth:`posterior` is the
    structured guide; as an explicit density it needs stochastic recognition (Appendix B of
    Aitchison & Ganev).

    .. code-block:: python

        prior = rpm.priors.StationaryStateSpacePrior(dim=3, state_dim=6)
        model = rpm.RPM(rpm.GaussianRecognition(net), prior, guide="structured", encoder_calls="concat")
        loss = rpm.RPMELBO().differentiable_loss(model.model, model.guide, x)  # x: (N, T, ...)
        prior.transition_matrix      # A, (6, 6), singular values < 1
        prior.smooth(z).loc          # E[s_t | z_{1:T}], (N, T, 6)

    :param int dim: D, the latent dimension.
    :param int state_dim: H, the hidden-state dimension (default D).
    :param float decay: A starts at ``decay * I`` (default 0.9, in [0, 1)) unless built by
        :meth:`from_dynamics`.
    :param observation_scale: C starts at ``observation_scale`` times the first D coordinates
        of the state (a number or D numbers; default 1): the latents' prior standard deviation
        is about this, plus R.
    :param observation_offset: b starts at this value (a number or D numbers; default 0).
    :param observation_noise: R starts at ``diag(observation_noise)**2`` (a number or D
        numbers; default 0.1).
    :param bool learn_observation_matrix: learn C (default); False keeps it at its start (a
        buffer), which pins the latents' prior scale as well as the state's: every frame's
        :math:`z_t` then has covariance :math:`C C^\top + R \succeq C C^\top`, fixed up to R
        (``docs/theory.md``: with a learned C the RPM ELBO can trade the latents' scale
        against the recognition noise).
    :param bool learn_observation_noise: learn R (default); False keeps it at its start
        :math:`\operatorname{diag}(\text{observation\_noise})^2` (a buffer holding its Cholesky
        factor). With C and R both fixed the emission is pinned and the RPM ELBO learns only the
        transition (and b): the latents' prior scale cannot move at all.
    :param bool learn_observation_offset: learn b (default); False keeps it at its start.

    References:
        M. Hromadka, ..., "Maximum likelihood learning of latent dynamics without
        reconstruction" (RP-GSSM), 2025: the stationary chain :math:`Q = I - A A^\top`.
    """

    def __init__(self, dim: int, state_dim: int | None = None, decay: float = 0.9,
                 observation_scale=1.0, observation_offset=0.0, observation_noise=0.1,
                 learn_observation_matrix: bool = True, learn_observation_noise: bool = True,
                 learn_observation_offset: bool = True):
        super().__init__()
        check_positive_int("dim", dim)
        state_dim = dim if state_dim is None else state_dim
        check_positive_int("state_dim", state_dim)
        if not (isinstance(decay, (int, float)) and 0.0 <= decay < 1.0):
            raise ValueError(f"decay must be a number in [0, 1) (A starts at decay * I, singular "
                             f"values below 1), got {decay!r}")
        self.dim = dim
        self.state_dim = state_dim
        scale = _vector("observation_scale", observation_scale, dim)
        emission = torch.eye(dim, state_dim)
        emission[:, :min(dim, state_dim)] *= scale[:min(dim, state_dim), None]
        self.transition_weight = torch.nn.Parameter(
            contraction_weight(decay * torch.eye(state_dim)))  # W, (H, H)
        if learn_observation_matrix:
            self.observation_matrix = torch.nn.Parameter(emission)  # C, (D, H)
        else:
            self.register_buffer("observation_matrix", emission)  # C, (D, H), fixed
        offset = _vector("observation_offset", observation_offset, dim, positive=False)
        if learn_observation_offset:
            self.observation_offset = torch.nn.Parameter(offset)  # b, (D,)
        else:
            self.register_buffer("observation_offset", offset)  # b, (D,), fixed
        noise_tril = _cholesky_init("observation_noise", observation_noise, dim)
        if learn_observation_noise:
            # chol(R)
            # PyroParam -> tensor (PyroModule's __setattr__)
            self.observation_scale_tril: torch.Tensor = PyroParam(  # type: ignore[assignment]
                noise_tril, constraints.lower_cholesky)
        else:
            self.register_buffer("observation_scale_tril", noise_tril)  # chol(R), (D, D), fixed

    @classmethod
    def from_dynamics(cls, transition_matrix: torch.Tensor, process_scale_tril: torch.Tensor,
                      observation_matrix: torch.Tensor, observation_offset=0.0,
                      observation_noise=0.1, learn_observation_matrix: bool = True,
                      learn_observation_noise: bool = True, learn_observation_offset: bool = True
                      ) -> StationaryStateSpacePrior:
        r"""The stationary prior that starts as the stable chain :math:`s_{t+1} = A_0 s_t + w_t`,
        :math:`w_t \sim \mathcal{N}(0, Q_0)`, :math:`z_t = C_0 s_t + b + v_t` started from its
        stationary distribution :math:`\mathcal{N}(0, P_0)`, :math:`P_0 = A_0 P_0 A_0^\top +
        Q_0` (:func:`rpm.ops._lyapunov.stationary_covariance`): in the whitened basis
        :math:`s = S \tilde s`, :math:`S S^\top = P_0`, it is :math:`A = S^{-1} A_0 S`,
        :math:`C = C_0 S` with :math:`I - A A^\top = S^{-1} Q_0 S^{-\top}`, the same
        distribution of :math:`z_{1:T}`.

        :param torch.Tensor transition_matrix: :math:`A_0`, (H, H), eigenvalues inside the
            unit circle (e.g. a damped constant velocity).
        :param torch.Tensor process_scale_tril: Cholesky factor of :math:`Q_0`, (H, H).
        :param torch.Tensor observation_matrix: :math:`C_0`, (D, H).
        :param observation_offset: b (a number or D numbers).
        :param observation_noise: R starts at ``diag(observation_noise)**2``.
        :param bool learn_observation_matrix: learn C (default) or keep it fixed.
        :param bool learn_observation_noise: learn R (default) or keep it fixed.
        :param bool learn_observation_offset: learn b (default) or keep it fixed.
        """
        a0 = torch.as_tensor(transition_matrix, dtype=torch.float64)
        q_tril = torch.as_tensor(process_scale_tril, dtype=torch.float64)
        c0 = torch.as_tensor(observation_matrix, dtype=torch.float64)
        if c0.dim() != 2 or c0.shape[1] != a0.shape[-1]:
            raise ValueError(f"observation_matrix must have shape (D, H) with H = "
                             f"{a0.shape[-1]}, got {tuple(c0.shape)}")
        covariance = stationary_covariance(a0, q_tril @ q_tril.T)  # P_0
        root = torch.linalg.cholesky(covariance)  # S
        a = torch.linalg.solve_triangular(root, a0 @ root, upper=False)  # S^{-1} A_0 S
        prior = cls(c0.shape[0], a0.shape[-1], observation_offset=observation_offset,
                    observation_noise=observation_noise,
                    learn_observation_matrix=learn_observation_matrix,
                    learn_observation_noise=learn_observation_noise,
                    learn_observation_offset=learn_observation_offset)
        dtype = prior.observation_matrix.dtype
        with torch.no_grad():
            prior.transition_weight.copy_(contraction_weight(a).to(dtype))
            prior.observation_matrix.copy_((c0 @ root).to(dtype))
        return prior

    def _cholesky_of_contraction(self) -> torch.Tensor:
        """L with L L^T = I + W W^T, (H, H)."""
        weight = self.transition_weight
        eye = torch.eye(self.state_dim, dtype=weight.dtype, device=weight.device)
        return torch.linalg.cholesky(eye + weight @ weight.T)

    @property
    def transition_matrix(self) -> torch.Tensor:
        r""":math:`A = L^{-1} W`, (H, H), singular values below 1."""
        return torch.linalg.solve_triangular(self._cholesky_of_contraction(),
                                             self.transition_weight, upper=False)

    @property
    def transition_scale_tril(self) -> torch.Tensor:
        r"""Cholesky factor of :math:`Q = I - A A^\top`: :math:`L^{-1}`, (H, H)."""
        lower = self._cholesky_of_contraction()
        eye = torch.eye(self.state_dim, dtype=lower.dtype, device=lower.device)
        return torch.linalg.solve_triangular(lower, eye, upper=False)

    def marginal(self) -> pyro.distributions.MultivariateNormal:
        r"""Every frame's prior marginal :math:`p_t(z_t) = \mathcal{N}(b, C C^\top + R)`,
        batch_shape (), event_shape (D,)."""
        emission, noise = self.observation_matrix, self.observation_scale_tril
        covariance = emission @ emission.T + noise @ noise.T
        return pyro.distributions.MultivariateNormal(self.observation_offset,
                                                     covariance_matrix=covariance)

    def distribution(self, duration: int) -> GaussianStateSpace:
        r""":math:`P(z_{1:T})` for T = ``duration`` views, batch_shape (), event_shape (T, D)."""
        lower = self._cholesky_of_contraction()
        weight = self.transition_weight
        eye = torch.eye(self.state_dim, dtype=weight.dtype, device=weight.device)
        transition = torch.linalg.solve_triangular(lower, weight, upper=False)  # A
        noise_tril = torch.linalg.solve_triangular(lower, eye, upper=False)  # chol(I - A A^T)
        return GaussianStateSpace(weight.new_zeros(self.state_dim), eye, transition, noise_tril,
                                  self.observation_matrix, self.observation_scale_tril, duration,
                                  observation_offset=self.observation_offset)


def _vector(name: str, value, size: int, positive: bool = True) -> torch.Tensor:
    """``value`` (a number or ``size`` numbers) as a vector of ``size`` finite numbers."""
    try:
        value = torch.as_tensor(value, dtype=torch.get_default_dtype())
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{name} must be a number or {size} numbers, got {value!r}") from None
    if value.dim() > 1 or (value.dim() == 1 and value.shape[0] != size):
        raise ValueError(f"{name} must be a number or {size} numbers, got shape "
                         f"{tuple(value.shape)}")
    if not torch.isfinite(value).all() or (positive and not (value > 0).all()):
        kind = "finite positive" if positive else "finite"
        raise ValueError(f"{name} must be {kind} numbers, got {value.tolist()}")
    return value.expand(size).clone()
