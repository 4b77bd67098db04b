r"""The linear-Gaussian state-space prior over a sequence of latents, and its structured posterior.

A hidden state :math:`s_t \in \mathbb{R}^H` moves linearly and each view's latent is a noisy
linear read-out of it (``docs/theory.md``, sequences; the prior over :math:`z_{1:T}` of an RPM
with T views):

.. math::

    s_1 \sim \mathcal{N}(m_1, S_1), \quad s_{t+1} = A s_t + w_t,\ w_t \sim \mathcal{N}(0, Q), \quad
    z_t = C s_t + v_t,\ v_t \sim \mathcal{N}(0, R).

The prior is the distribution :class:`~rpm.distributions.GaussianStateSpace`:
:math:`\log P(z_{1:T})` is the Kalman filter's marginal likelihood
(:func:`rpm.ops.kalman_log_prob`, in float64: the window's dense Gaussian for short
windows, the square-root recursions or the associative scans otherwise). With H = 2D and A
initialised as constant velocity, :math:`A = \begin{pmatrix} I & I \\ 0 & I\end{pmatrix}`,
:math:`C = (I\ 0)`, the prior knows that objects keep moving, which no prior over a pair can
express: two frames carry no velocity.

:class:`~rpm.distributions.StateSpacePosterior` is the structured guide: with Gaussian recognition
:math:`Q(z_t|x_t) = \mathcal{N}(\mu_t, \Sigma_t)`, the prior conditioned on the recognition
means as pseudo-observations,

.. math::

    Q(z_{1:T} | x_{1:T}) \propto P(z_{1:T}) \prod_t \mathcal{N}(\mu_t;\ z_t, \Sigma_t),

which shares the prior's dynamics, so the latents of a sequence are inferred together (the
recognition-parametrised Gaussian state-space model of Hromadka et al., 2025). Any guide gives
an ELBO of the same RPM (Eq. 12 of Aitchison & Ganev).
"""

from __future__ import annotations

import math

import pyro
import torch
from pyro.distributions import TorchDistribution
from pyro.nn import PyroParam
from torch.distributions import constraints

from rpm._validation import check_positive_int
from rpm.distributions._state_space import GaussianStateSpace, StateSpacePosterior
from rpm.marginals._sequence_marginal import sequence_components, sequence_mask
from rpm.ops._kalman import KalmanForecast, KalmanSmootherResult
from rpm.priors._base import SequencePrior

__all__ = ["LinearGaussianPrior", "StateSpacePrior"]


def _cholesky_init(name: str, value, size: int) -> torch.Tensor:
    """``value`` (a number, or ``size`` numbers: the diagonal; or a (size, size) Cholesky
    factor) as a Cholesky factor."""
    try:
        value = torch.as_tensor(value, dtype=torch.get_default_dtype())
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{name} must be a number or {size} numbers, got {value!r}") from None
    if value.shape == (size, size):
        if not (torch.equal(value, value.tril()) and (value.diagonal() > 0).all()
                and torch.isfinite(value).all()):
            raise ValueError(f"{name} given as a ({size}, {size}) matrix must be a Cholesky "
                             "factor: lower triangular with a positive diagonal")
        return value.clone()
    if value.dim() > 1 or (value.dim() == 1 and value.shape[0] != size):
        raise ValueError(f"{name} must be a number or {size} numbers (one standard deviation "
                         f"per coordinate), got shape {tuple(value.shape)}")
    if not ((value > 0) & (value < math.inf)).all():
        raise ValueError(f"{name} must be finite positive numbers (initial standard "
                         f"deviations), got {value.tolist()}")
    return torch.diag(value.expand(size).clone())


class LinearGaussianPrior(SequencePrior):
    r"""Base class of the linear-Gaussian priors over T views: a chain of hidden states read out
    linearly with Gaussian noise, :math:`P(z_{1:T})` = :class:`~rpm.distributions.GaussianStateSpace`.

    A subclass implements :meth:`distribution`; this class declares the site ``"z"`` from it
    and gives the structured guide (:meth:`posterior`, :class:`~rpm.distributions.StateSpacePosterior`), its
    closed-form log-ratio, the smoother and forecasts. :class:`StateSpacePrior` (free
    parameters) and :class:`~rpm.priors.StationaryStateSpacePrior` (stationary, scale-pinned)
    are the two.
    """

    #: an explicit continuous density: Delta recognition needs noise (Appendix B).
    accepts_delta_recognition = False
    #: missing frames are marginalised exactly (the Kalman filter skips their updates).
    accepts_mask = True

    def distribution(self, duration: int) -> GaussianStateSpace:
        r""":math:`P(z_{1:T})` for T = ``duration`` views, batch_shape (), event_shape (T, D)."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement distribution(duration), returning the "
            "GaussianStateSpace of its parameters")

    def forward(self, q: TorchDistribution, marginal=None) -> torch.Tensor:
        """Declares ``"z"`` ~ :class:`~rpm.distributions.GaussianStateSpace` for the T views of
        the recognition distributions ``q`` (batch_shape (N, T), event_shape (D,)); returns z,
        (N, T, D). The marginals are not used (an explicit prior). For ``q`` masked over frames
        (``q.mask(mask)``, as :meth:`rpm.RPM.model` builds it for ``mask=``), the density of
        the observed frames' latents (missing frames marginalised)."""
        return pyro.sample("z", self.distribution(q.batch_shape[-1]).masked(sequence_mask(q)))

    def posterior(self, q: TorchDistribution) -> StateSpacePosterior:
        r"""The structured guide :math:`Q(z_{1:T}) \propto P(z_{1:T}) \prod_t \mathcal{N}(\mu_t;
        z_t, \operatorname{diag}\sigma_t^2)` for Gaussian recognition distributions
        ``q = Normal(mu, sigma).to_event(1)`` with batch_shape (N, T), event_shape (D,), or
        masked over frames (``q.mask(mask)``): the missing frames are not conditioned on."""
        loc, scale = sequence_components(q)
        if scale is None:
            raise ValueError(
                "the structured guide conditions the prior on Gaussian pseudo-observations and "
                "needs stochastic recognition; use GaussianRecognition or DeltaRecognition(net, "
                "noise_scale=...) with a positive noise scale")
        return StateSpacePosterior(self.distribution(loc.shape[-2]).masked(sequence_mask(q)),
                                   loc, scale)

    def posterior_log_ratio(self, z: torch.Tensor, q: TorchDistribution,
                            posterior: TorchDistribution) -> torch.Tensor | None:
        r"""Under the structured guide, :math:`\log P(z_{1:T}) + \sum_t \log
        \mathcal{N}(z_t; \mu_t, \sigma_t^2) - \log Q(z_{1:T}) = \log P_{R+\Sigma}(\mu_{1:T})`
        for every :math:`z_{1:T}`: the prior's log-density cancels against the posterior's
        (:class:`~rpm.distributions.StateSpacePosterior`), and the Gaussian factor is symmetric in z and
        :math:`\mu`, leaving the Kalman likelihood of the recognition means under observation
        noise :math:`R + \Sigma_t`, which the guide's filter already computed. Shape (N,); None
        for a posterior that is not this prior's."""
        if not isinstance(posterior, StateSpacePosterior):
            return None
        return posterior.filtered.log_prob.to(z.dtype).expand(z.shape[:-2])

    def smooth(self, z: torch.Tensor, mask: torch.Tensor | None = None) -> KalmanSmootherResult:
        r"""The hidden states given the latents, :math:`P(s_t | z_{1:T})` (RTS smoother); ``z``
        (N, T, D); returns loc (N, T, H) and scale_tril (N, T, H, H). With ``mask`` (N, T)
        (True = observed) the states given the observed frames only: :math:`C\,\text{loc}_t`
        at a missing frame is its imputation."""
        return self.distribution(z.shape[-2]).masked(mask).smooth(z)

    def forecast(self, z: torch.Tensor, steps: int = 1,
                 mask: torch.Tensor | None = None) -> KalmanForecast:
        r"""The next ``steps`` latents given :math:`z_{1:T}` (the observed frames of ``mask``,
        if given): loc (N, steps, D) and the state predictions
        (:func:`rpm.ops._kalman.kalman_forecast`)."""
        return self.distribution(z.shape[-2]).masked(mask).forecast(z, steps)


class StateSpacePrior(LinearGaussianPrior):
    r"""A learned linear-Gaussian state-space prior :math:`P(z_{1:T})` over T views.

    .. math::

        s_1 \sim \mathcal{N}(m_1, S_1), \quad s_{t+1} \sim \mathcal{N}(A s_t, Q), \quad
        z_t \sim \mathcal{N}(C s_t, R)

    with :math:`m_1`, A and C unconstrained and :math:`S_1`, Q, R held through their Cholesky
    factors (``constraints.lower_cholesky``), all learned. Called inside the model's plate over
    sequences as ``prior(q)`` it declares the site ``"z"`` ~
    :class:`~rpm.distributions.GaussianStateSpace` with event_shape (T, D). As an explicit
    density it needs stochastic recognition (Appendix B of Aitchison & Ganev).
    :meth:`posterior` gives the structured guide.

    :param int dim: D, the latent dimension.
    :param int state_dim: H, the hidden-state dimension (default 2 D).
    :param bool constant_velocity: start at :math:`A = \begin{pmatrix} I & I \\ 0 & I
        \end{pmatrix}`, :math:`C = (I\ 0)` (needs H = 2D; default: whenever H = 2D); otherwise
        A starts at the identity and C at the first D coordinates of the state.
    :param init_loc: :math:`m_1` starts at this value (a number or H numbers).
    :param init_scale: :math:`S_1` starts at ``diag(init_scale)**2`` (a number or H numbers).
    :param process_noise: Q starts at ``diag(process_noise)**2`` (a number or H numbers), or
        at ``L L^T`` for a given (H, H) Cholesky factor L.
    :param observation_noise: R starts at ``diag(observation_noise)**2`` (a number or D
        numbers).
    """

    def __init__(self, dim: int, state_dim: int | None = None, constant_velocity: bool | None = None,
                 init_loc=0.0, init_scale=1.0, process_noise=0.1, observation_noise=0.1):
        super().__init__()
        check_positive_int("dim", dim)
        state_dim = 2 * dim if state_dim is None else state_dim
        check_positive_int("state_dim", state_dim)
        if constant_velocity is None:
            constant_velocity = state_dim == 2 * dim
        if constant_velocity and state_dim != 2 * dim:
            raise ValueError(
                f"constant_velocity needs state_dim = 2 * dim = {2 * dim} (a position and a "
                f"velocity per latent coordinate), got state_dim={state_dim}")
        self.dim = dim
        self.state_dim = state_dim
        eye = torch.eye(dim)
        if constant_velocity:
            transition = torch.cat([torch.cat([eye, eye], 1), torch.cat([0 * eye, eye], 1)])
        else:
            transition = torch.eye(state_dim)
        try:
            init_loc = torch.as_tensor(init_loc, dtype=torch.get_default_dtype())
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"init_loc must be a number or {state_dim} numbers, got "
                            f"{init_loc!r}") from None
        if init_loc.dim() > 1 or (init_loc.dim() == 1 and init_loc.shape[0] != state_dim):
            raise ValueError(f"init_loc must be a number or {state_dim} numbers, got shape "
                             f"{tuple(init_loc.shape)}")
        self.init_loc = torch.nn.Parameter(init_loc.expand(state_dim).clone())  # m_1, (H,)
        self.init_scale_tril: torch.Tensor = PyroParam(  # type: ignore[assignment]  # PyroParam -> tensor
            _cholesky_init("init_scale", init_scale, state_dim),
            constraints.lower_cholesky)  # chol(S_1), (H, H)
        self.transition_matrix = torch.nn.Parameter(transition)  # A, (H, H)
        # PyroParam -> tensor (PyroModule's __setattr__)
        self.transition_scale_tril: torch.Tensor = PyroParam(  # type: ignore[assignment]
            _cholesky_init("process_noise", process_noise, state_dim),
            constraints.lower_cholesky)  # chol(Q), (H, H)
        self.observation_matrix = torch.nn.Parameter(torch.eye(dim, state_dim))  # C, (D, H)
        # PyroParam -> tensor (PyroModule's __setattr__)
        self.observation_scale_tril: torch.Tensor = PyroParam(  # type: ignore[assignment]
            _cholesky_init("observation_noise", observation_noise, dim),
            constraints.lower_cholesky)  # chol(R), (D, D)

    def distribution(self, duration: int, mask: torch.Tensor | None = None) -> GaussianStateSpace:
        r""":math:`P(z_{1:T})` for T = ``duration`` views, batch_shape () (or the mask's),
        event_shape (T, D); with a mask (N, T) over frames (True = observed), the density of
        the observed frames' latents."""
        return GaussianStateSpace(self.init_loc, self.init_scale_tril, self.transition_matrix,
                                  self.transition_scale_tril, self.observation_matrix,
                                  self.observation_scale_tril, duration)
