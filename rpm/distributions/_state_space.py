r"""The distributions of a linear-Gaussian state-space model over a sequence of latents: the
marginal of the latents, and the structured posterior given Gaussian pseudo-observations.

A hidden state :math:`s_t \in \mathbb{R}^H` moves linearly and each latent is a noisy linear
read-out of it (``docs/theory.md#linear-gaussian-state-space-prior``):

.. math::

    s_1 \sim \mathcal{N}(m_1, S_1), \quad s_{t+1} = A s_t + w_t,\ w_t \sim \mathcal{N}(0, Q), \quad
    z_t = C s_t + b + v_t,\ v_t \sim \mathcal{N}(0, R).

:class:`GaussianStateSpace` is :math:`P(z_{1:T})`, whose log-density is the Kalman filter's
marginal likelihood (:func:`rpm.ops.kalman_log_prob`, in float64). :class:`StateSpacePosterior`
is that prior conditioned on Gaussian pseudo-observations :math:`\mu_t` with standard deviations
:math:`\sigma_t`,

.. math::

    Q(z_{1:T}) \propto P(z_{1:T}) \prod_t \mathcal{N}(\mu_t;\ z_t, \operatorname{diag}\sigma_t^2),

the structured guide of the state-space priors (:class:`~rpm.priors.StateSpacePrior`,
:class:`~rpm.priors.StationaryStateSpacePrior`).
"""

from __future__ import annotations

import torch
from pyro.distributions import Normal, TorchDistribution
from torch.distributions import constraints

from rpm._validation import check_positive_int
from rpm.ops._kalman import (
    KalmanFilterResult,
    KalmanForecast,
    KalmanSmootherResult,
    backward_sample,
    check_mask,
    kalman_filter,
    kalman_forecast,
    kalman_log_prob,
    rts_smoother,
    triangularize,
)

__all__ = ["GaussianStateSpace", "StateSpacePosterior"]


def _matvec(matrix: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
    return (matrix @ vector.unsqueeze(-1)).squeeze(-1)


def _compact(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor with each broadcast (stride 0) dimension but the last reduced to size 1; a
    tensor that needs no gradient (a fixed noise level, ``torch.full_like``) also with each
    dimension along which its values are all equal (no gradient is lost by reading one)."""
    index = tuple(slice(0, 1) if stride == 0 and size > 1 else slice(None)
                  for stride, size in zip(tensor.stride()[:-1], tensor.shape[:-1], strict=True))
    tensor = tensor[index]
    if not tensor.requires_grad:
        for dim in range(tensor.dim() - 1):
            if tensor.shape[dim] > 1 and torch.equal(tensor, tensor.narrow(dim, 0, 1).expand_as(tensor)):
                tensor = tensor.narrow(dim, 0, 1)
    return tensor


class GaussianStateSpace(TorchDistribution):
    r"""The marginal distribution of :math:`z_{1:T}` under a linear-Gaussian state-space model.

    ``event_shape`` (T, D); ``batch_shape`` is that of the parameters' leading dimensions (or
    set by ``expand``, e.g. by a plate over sequences). ``log_prob`` is the Kalman filter's
    :math:`\log P(z_{1:T})` (prediction-error decomposition); ``rsample`` simulates the chain
    with reparameterised noise. It is the distribution Pyro's
    :class:`~pyro.distributions.GaussianHMM` describes with the initial state moved one
    transition later, computed in square-root form in float64 so that it stays positive
    definite for long windows and nearly deterministic dynamics: the initial distribution
    :math:`\mathcal{N}(m_1, S_1)` is that of the state of the first view, which
    ``GaussianHMM`` reproduces with time-varying transitions whose first one has matrix 0 and
    noise :math:`\mathcal{N}(m_1, S_1)` (``docs/theory.md#linear-gaussian-state-space-prior``).

    :param torch.Tensor init_loc: :math:`m_1`, shape (..., H).
    :param torch.Tensor init_scale_tril: Cholesky factor of :math:`S_1`, (..., H, H).
    :param torch.Tensor transition_matrix: A, (..., H, H).
    :param torch.Tensor transition_scale_tril: Cholesky factor of Q, (..., H, H).
    :param torch.Tensor observation_matrix: C, (..., D, H).
    :param torch.Tensor observation_scale_tril: Cholesky factor of R, (..., D, D).
    :param int duration: T, the number of views.
    :param observation_offset: b, a constant added to every observation, :math:`z_t = C s_t +
        b + v_t`, shape (..., D); None: 0 (the offset of the stationary prior,
        :class:`~rpm.priors.StationaryStateSpacePrior`, whose states have mean 0).
    :param mask: None, or a bool tensor (..., T), True where the frame is observed: ``log_prob``
        is then the marginal density of the observed frames' latents,
        :math:`\log P(z_{t \in \text{observed}})` (the Kalman filter with the missing frames
        removed from the observation model; the missing frames' values are ignored), and the
        batch shape includes the mask's. Held as ``frame_mask`` (``mask`` is Pyro's method
        that masks the log density, ``d.mask(m)``).
    """

    arg_constraints = {
        "init_loc": constraints.real_vector,
        "init_scale_tril": constraints.lower_cholesky,
        "transition_matrix": constraints.independent(constraints.real, 2),
        "transition_scale_tril": constraints.lower_cholesky,
        "observation_matrix": constraints.independent(constraints.real, 2),
        "observation_scale_tril": constraints.lower_cholesky,
        "observation_offset": constraints.real_vector,
    }
    support = constraints.independent(constraints.real, 2)
    has_rsample = True

    def __init__(self, init_loc, init_scale_tril, transition_matrix, transition_scale_tril,
                 observation_matrix, observation_scale_tril, duration: int,
                 observation_offset: torch.Tensor | None = None, mask=None, validate_args=None):
        check_positive_int("duration", duration)
        hidden_dim = init_loc.shape[-1]
        obs_dim = observation_matrix.shape[-2]
        if observation_matrix.shape[-1] != hidden_dim:
            raise ValueError(
                f"observation_matrix must have shape (D, H) with H = {hidden_dim}, got "
                f"{tuple(observation_matrix.shape)}")
        if observation_offset is None:
            observation_offset = observation_matrix.new_zeros(obs_dim)
        if observation_offset.shape[-1:] != (obs_dim,):
            raise ValueError(f"observation_offset must have shape (..., D) with D = {obs_dim}, "
                             f"got {tuple(observation_offset.shape)}")
        batch_shape = torch.broadcast_shapes(
            init_loc.shape[:-1], init_scale_tril.shape[:-2], transition_matrix.shape[:-2],
            transition_scale_tril.shape[:-2], observation_matrix.shape[:-2],
            observation_scale_tril.shape[:-2], observation_offset.shape[:-1],
            () if mask is None else mask.shape[:-1])
        self.frame_mask = check_mask(mask, duration)
        self.init_loc = init_loc
        self.init_scale_tril = init_scale_tril
        self.transition_matrix = transition_matrix
        self.transition_scale_tril = transition_scale_tril
        self.observation_matrix = observation_matrix
        self.observation_scale_tril = observation_scale_tril
        self.observation_offset = observation_offset
        self.duration = duration
        self.hidden_dim = hidden_dim
        super().__init__(batch_shape, torch.Size([duration, obs_dim]), validate_args=validate_args)

    @property
    def _params(self) -> dict:
        """The arguments of :func:`rpm.ops._kalman.kalman_filter` (all but the offset)."""
        return {name: getattr(self, name) for name in self.arg_constraints
                if name != "observation_offset"}

    def expand(self, batch_shape, _instance=None):
        # The parameters keep their own (smaller) batch shape: the covariance recursion of the
        # filter then runs once for all sequences that share them.
        new = self._get_checked_instance(GaussianStateSpace, _instance)
        batch_shape = torch.Size(batch_shape)
        torch.broadcast_shapes(batch_shape, self.batch_shape)  # raises if incompatible
        for name in self.arg_constraints:
            setattr(new, name, getattr(self, name))
        new.duration = self.duration
        new.hidden_dim = self.hidden_dim
        new.frame_mask = self.frame_mask
        super(GaussianStateSpace, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def masked(self, mask: torch.Tensor | None) -> GaussianStateSpace:
        """This distribution over the frames observed in ``mask`` ((..., T) bool, True =
        observed): the same parameters, ``log_prob`` the density of the observed frames'
        latents. None: this distribution."""
        if mask is None:
            return self
        return GaussianStateSpace(**self._params, duration=self.duration,
                                  observation_offset=self.observation_offset, mask=mask,
                                  validate_args=self._validate_args)

    def filter(self, value: torch.Tensor) -> KalmanFilterResult:
        """The Kalman filter of ``value`` (..., T, D): log-likelihood and filtered states."""
        params = dict(self._params,
                      observation_scale_tril=self.observation_scale_tril.unsqueeze(-3))
        return kalman_filter(value - self.observation_offset.unsqueeze(-2), **params,
                             mask=self.frame_mask)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        if self._validate_args:
            self._validate_sample(value)
        log_prob = kalman_log_prob(value - self.observation_offset.unsqueeze(-2), **dict(
            self._params, observation_scale_tril=self.observation_scale_tril.unsqueeze(-3)),
            mask=self.frame_mask)
        return log_prob.expand(torch.broadcast_shapes(log_prob.shape, self.batch_shape))

    def smooth(self, value: torch.Tensor) -> KalmanSmootherResult:
        r""":math:`P(s_t | z_{1:T})` for each t (RTS smoother): loc (..., T, H), scale_tril."""
        return rts_smoother(self.filter(value), self.transition_matrix, self.transition_scale_tril)

    def forecast(self, value: torch.Tensor, steps: int = 1) -> KalmanForecast:
        r"""The predictive distributions of :math:`s_{T+j}` and :math:`z_{T+j}`, j = 1..steps,
        given :math:`z_{1:T}` = ``value`` (:func:`rpm.ops._kalman.kalman_forecast`)."""
        forecast = kalman_forecast(self.filter(value), self.transition_matrix,
                                   self.transition_scale_tril, self.observation_matrix,
                                   self.observation_scale_tril, steps)
        return forecast._replace(loc=forecast.loc + self.observation_offset.unsqueeze(-2).to(
            forecast.loc.dtype))

    def rsample(self, sample_shape=torch.Size()) -> torch.Tensor:
        shape = torch.Size(sample_shape) + self.batch_shape
        noise = torch.randn(shape + (self.duration, self.hidden_dim + self.event_shape[1]),
                            dtype=self.init_loc.dtype, device=self.init_loc.device)
        noise_s, noise_z = noise.split([self.hidden_dim, self.event_shape[1]], dim=-1)
        state = self.init_loc + _matvec(self.init_scale_tril, noise_s[..., 0, :])
        values = []
        for t in range(self.duration):
            if t > 0:
                state = (_matvec(self.transition_matrix, state)
                         + _matvec(self.transition_scale_tril, noise_s[..., t, :]))
            values.append(_matvec(self.observation_matrix, state) + self.observation_offset
                          + _matvec(self.observation_scale_tril, noise_z[..., t, :]))
        return torch.stack(values, dim=-2)


class StateSpacePosterior(TorchDistribution):
    r"""The structured guide: a state-space prior conditioned on Gaussian pseudo-observations.

    .. math::

        Q(z_{1:T}) \propto P(z_{1:T}) \prod_t \mathcal{N}(\mu_t;\ z_t, \operatorname{diag}\sigma_t^2)

    with P a :class:`GaussianStateSpace`. Given the states, the pseudo-observations are
    :math:`\mu_t = C s_t + v_t + e_t` with :math:`e_t \sim \mathcal{N}(0, \Sigma_t)`, so

    * :math:`s_{1:T} | \mu_{1:T}` is the smoothing distribution of the same chain with
      observation noise :math:`R + \Sigma_t`, drawn by forward filtering and backward sampling
      (:func:`rpm.ops._kalman.backward_sample`), and
    * :math:`z_t | s_t, \mu_t \sim \mathcal{N}(C s_t + K_t(\mu_t - C s_t),\ R - K_t R)`,
      :math:`K_t = R (R + \Sigma_t)^{-1}`, independently over t;

    both draws are reparameterised. The density is exact:

    .. math::

        \log Q(z_{1:T}) = \log P(z_{1:T}) + \sum_t \log\mathcal{N}(\mu_t; z_t, \Sigma_t)
            - \log P_{R+\Sigma}(\mu_{1:T}),

    the last term the Kalman likelihood of the pseudo-observations (the normaliser).

    **Missing frames.** With a mask on the prior (``prior.frame_mask``, (N, T), True = observed) a
    missing frame has no pseudo-observation: the filter skips its update, its term
    :math:`\log\mathcal{N}(\mu_t; z_t, \Sigma_t)` is dropped, and both :math:`\log
    P(z_{1:T})` and :math:`\log Q(z_{1:T})` are the densities of the observed frames' latents
    (the missing frames' latents drawn, :math:`z_t | s_t \sim \mathcal{N}(C s_t, R)`, are the
    imputations, on which no density depends).

    ``batch_shape`` (N,) (that of the pseudo-observations), ``event_shape`` (T, D).

    :param GaussianStateSpace prior: the prior P, batch_shape broadcastable to (N,).
    :param torch.Tensor loc: the pseudo-observations :math:`\mu_t`, shape (N, T, D).
    :param torch.Tensor scale: their standard deviations :math:`\sigma_t > 0`, shape (N, T, D).
    """

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.independent(constraints.real, 2)
    has_rsample = True

    def __init__(self, prior: GaussianStateSpace, loc: torch.Tensor, scale: torch.Tensor,
                 validate_args=None):
        if not isinstance(prior, GaussianStateSpace):
            raise TypeError(f"prior must be a GaussianStateSpace, got {type(prior).__name__}")
        if loc.dim() < 2 or loc.shape[-2:] != prior.event_shape or scale.shape != loc.shape:
            raise ValueError(
                f"loc and scale must both have shape (N, T, D) with (T, D) = "
                f"{tuple(prior.event_shape)}, got {tuple(loc.shape)} and {tuple(scale.shape)}")
        self.prior = prior
        self.loc = loc
        self.scale = scale
        batch_shape = torch.broadcast_shapes(loc.shape[:-2], prior.batch_shape)
        super().__init__(batch_shape, prior.event_shape, validate_args=validate_args)
        obs_dim = loc.shape[-1]
        # Observation noise of the pseudo-observations given the states: R + Sigma_t, in
        # float64. A scale broadcast over sequences or views (a learned noise level) is kept
        # compact, so that the covariance recursions run once for all of them.
        sigma = torch.diag_embed(_compact(scale).to(torch.float64))  # (n, t, D, D), n in {1, N}
        r_scale = prior.observation_scale_tril.to(torch.float64).unsqueeze(-3)  # (..., 1, D, D)
        shape = torch.broadcast_shapes(r_scale.shape[:-2], sigma.shape[:-2])
        r_scale, sigma = r_scale.expand(*shape, obs_dim, obs_dim), sigma.expand(*shape, obs_dim, obs_dim)
        # Triangularize [[L_Sigma, L_R], [0, L_R]] -> [[L_{R+Sigma}, 0], [K_bar, L_post]]:
        # K = K_bar L_{R+Sigma}^{-1} = R (R + Sigma)^{-1}, L_post L_post^T = R - K R.
        post = triangularize(torch.cat([
            torch.cat([sigma, r_scale], -1),
            torch.cat([torch.zeros_like(r_scale), r_scale], -1)], -2))
        self._noise_scale = post[..., :obs_dim, :obs_dim]  # chol(R + Sigma_t), (..., T, D, D)
        self._gain_bar = post[..., obs_dim:, :obs_dim]
        self._conditional_scale = post[..., obs_dim:, obs_dim:]
        self._observation_scale = r_scale  # chol(R): the conditional of a missing frame
        self.frame_mask = prior.frame_mask
        self._filtered: KalmanFilterResult | None = None

    @property
    def filtered(self) -> KalmanFilterResult:
        """The Kalman filter of the pseudo-observations under observation noise R + Sigma_t."""
        if self._filtered is None:
            params = dict(self.prior._params, observation_scale_tril=self._noise_scale)
            offset = self.prior.observation_offset.unsqueeze(-2)
            self._filtered = kalman_filter(self.loc - offset, **params, mask=self.frame_mask)
        return self._filtered

    @property
    def mean(self) -> torch.Tensor:
        r""":math:`E_Q[z_t] = C \hat s_t + b + K_t (\mu_t - C \hat s_t - b)` with
        :math:`\hat s_t` the smoothed state given the pseudo-observations
        (:func:`rpm.ops._kalman.rts_smoother`), b the observation offset and :math:`K_t = R (R +
        \Sigma_t)^{-1}`; :math:`C \hat s_t + b` at a missing frame (its imputation). Shape
        (N, T, D)."""
        smoothed = rts_smoother(self.filtered, self.prior.transition_matrix,
                                self.prior.transition_scale_tril)
        observation_matrix = self.prior.observation_matrix.to(torch.float64).unsqueeze(-3)
        offset = self.prior.observation_offset.to(torch.float64).unsqueeze(-2)
        predicted = _matvec(observation_matrix, smoothed.loc.to(torch.float64)) + offset
        white = torch.linalg.solve_triangular(
            self._noise_scale, (self.loc.to(torch.float64) - predicted).unsqueeze(-1),
            upper=False).squeeze(-1)
        value = predicted + _matvec(self._gain_bar, white)
        if self.frame_mask is not None:
            value = torch.where(self.frame_mask.unsqueeze(-1), value, predicted)
        return value.to(self.loc.dtype)

    def expand(self, batch_shape, _instance=None):
        if torch.Size(batch_shape) != self.batch_shape:
            raise ValueError(
                f"the structured posterior of {tuple(self.batch_shape)} sequences cannot be "
                f"expanded to {tuple(batch_shape)}; use a plate of the number of sequences")
        return self

    def _rsample_from_noise(self, noise: torch.Tensor) -> torch.Tensor:
        """The draw as an affine function of standard normal noise (..., N, T, H + D)."""
        hidden_dim = self.prior.hidden_dim
        noise_s, noise_z = noise.split([hidden_dim, self.event_shape[1]], dim=-1)
        states = backward_sample(self.filtered, self.prior.transition_matrix,
                                 self.prior.transition_scale_tril, noise_s)  # (..., N, T, H)
        states, noise_z = states.to(torch.float64), noise_z.to(torch.float64)
        observation_matrix = self.prior.observation_matrix.to(torch.float64).unsqueeze(-3)
        offset = self.prior.observation_offset.to(torch.float64).unsqueeze(-2)
        predicted = _matvec(observation_matrix, states) + offset  # C s_t + b, (..., N, T, D)
        # K (mu - C s) with K = K_bar L^{-1}
        white = torch.linalg.solve_triangular(
            self._noise_scale, (self.loc.to(torch.float64) - predicted).unsqueeze(-1),
            upper=False).squeeze(-1)
        value = (predicted + _matvec(self._gain_bar, white)
                 + _matvec(self._conditional_scale, noise_z))
        if self.frame_mask is not None:  # no pseudo-observation: z_t | s_t ~ N(C s_t, R)
            value = torch.where(self.frame_mask.unsqueeze(-1), value,
                                predicted + _matvec(self._observation_scale, noise_z))
        return value.to(self.loc.dtype)

    def rsample(self, sample_shape=torch.Size()) -> torch.Tensor:
        shape = torch.Size(sample_shape) + self.batch_shape + torch.Size(
            [self.event_shape[0], self.prior.hidden_dim + self.event_shape[1]])
        return self._rsample_from_noise(torch.randn(shape, dtype=self.loc.dtype,
                                                    device=self.loc.device))

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        if self._validate_args:
            self._validate_sample(value)
        pseudo = Normal(value, self.scale).log_prob(self.loc).sum(-1)  # (..., N, T)
        if self.frame_mask is not None:
            pseudo = torch.where(self.frame_mask, pseudo, torch.zeros((), dtype=pseudo.dtype,
                                                                 device=pseudo.device))
        return self.prior.log_prob(value) + pseudo.sum(-1) - self.filtered.log_prob
