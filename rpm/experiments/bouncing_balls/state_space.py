r"""The state-space prior of ``rpm bouncing-balls``: an RPM over windows of T consecutive frames.

A prior over a *pair* of frames cannot know that a ball keeps moving: two frames show no
velocity. :class:`~rpm.RPM` with a state-space prior sees windows of ``--window``
consecutive frames (8 by default) and models the 6 numbers of
:class:`~rpm.experiments.bouncing_balls.encoders.GaussianBallEncoder` as the noisy read-out of a hidden state
of positions and velocities (H = 12). Two priors (``--state-space-prior``):

* ``stationary`` (the default), :class:`~rpm.priors.StationaryStateSpacePrior`: the scale-pinned
  chain :math:`s_t \sim \mathcal{N}(0, I)` at every t, :math:`Q = I - A A^\top`,
  :math:`z_t = C s_t + b + v_t`, started as a damped constant velocity in pixels
  (:func:`damped_velocity_dynamics`) whitened by
  :meth:`~rpm.priors.StationaryStateSpacePrior.from_dynamics`; by default its emission is
  pinned (``--state-space-emission pinned``: C the whitened pixel read-out, R at
  ``--state-space-emission-noise`` 0.05 px, both buffers) and only :math:`W` (hence A) and b
  are learned, at ``--prior-lr`` 3e-4 halving every ``--prior-lr-halflife`` 100 steps
  (``--state-space-emission learned`` learns C and R too);
* ``free``, :class:`~rpm.priors.StateSpacePrior` (the first version): started at constant
  velocity, :math:`A_0 = \begin{pmatrix} I & I \\ 0 & I \end{pmatrix}`, :math:`C_0 = (I\ 0)`,
  all of :math:`m_1, S_1, A, Q, C, R` learned.

The encoder's recognition noise :math:`\sigma` is fixed (``--state-space-noise``) unless
``--learn-recognition-noise``. The guide is the structured posterior
(:class:`~rpm.distributions.StateSpacePosterior`): the chain conditioned on the recognition means as
Gaussian pseudo-observations, sampled by forward filtering and backward sampling, so the
latents of a window are inferred together (``guide="recognition"`` is the ablation). The
objective is the RPM ELBO, or RP-GSSM's (``--state-space-objective rp-gssm``,
:mod:`rpm.experiments.bouncing_balls.rp_gssm`). The marginals are per view (the mixture over
the t-th frames of the batch's windows), the :class:`~rpm.RPM` default: pooling them
over all frames (the video is stationary and the encoder shared, so it is allowed) gave a lower
position R^2 in the measurements of ``benchmarks/README.md``.

**Training length.** At most ``--state-space-steps`` (1500) steps; the run stops earlier when it
has converged (:func:`~rpm.experiments.bouncing_balls.command.converged`: the mean training loss
over the last ``--stop-window`` steps moved by less than ``--stop-tolerance`` nats per frame
from the window before, checked at every evaluation). Why the prior is the stationary one and
how each choice holds over training is measured in ``benchmarks/README.md`` and explained in
``docs/theory.md`` (why the unpinned chain drifts). In short: with a broad (pixel) emission the
encoder's means spread about 0.5, far inside the prior's marginal, and the ELBO's gradient on
the transition is dominated by the log-determinant, which pushes A's singular values to 1 and
its velocity eigenvalues down (the forecast drifts) whatever the data; learning C and R lets
them absorb that too. With the emission pinned the encoder stays where it is (a VAR(2) refitted
on its means forecasts at 0.66 of the baseline from step 100 to 600, seed 0, however the
transition moves), so the dynamics hold once the transition stops moving: the halving
learning rate bounds its total movement (about ``--prior-lr * --prior-lr-halflife / ln 2``),
and the loss rule then finds a flat loss.

**Emission noise.** R = (0.05 px)^2 (``--state-space-emission-noise``), below the recognition
noise: the filter that forecasts sees the means through :math:`R + \sigma^2`, and a smaller R
gives sharper filtered velocities (one-step forecast 0.68 of the last-position baseline
against 0.69 with R at 0.15 px, seed 0) at the same positions.

**Window length.** T = 8 (``--window``): a velocity needs 2 frames and a change of velocity 3, so the prior
only acts on windows of 3 or more, and its dynamics are identified better the more transitions
a window holds; but balls collide with a wall or each other every few frames (the velocity's
lag-1 correlation is well below 1), so beyond a few frames a window adds bounces rather than
evidence about A, and the cost of a step grows with T (the filter is sequential in t). With 16
windows of 8 frames a step sees 128 frames, as the pair priors' 128 pairs do.

**Recognition noise.** :math:`\sigma` = 0.15 (``--state-space-noise``, also the start of the
observation noise R and of the position noise). The encoder's means do not move in pixels but
on a shrunk copy of the balls' paths (the centre of mass of a map with a non-zero background):
their spread over the frames is below one pixel per coordinate, so 0.3, the dynamics prior's
noise, would blur each latent by a sizeable fraction of its spread; 0.15 keeps the factors
sharper against that spread (better positions, velocities and forecasts over three seeds with
the free prior at 150 steps: the numbers are in benchmarks/README.md, which also shows how both
priors' dynamics drift over longer training).

**Evaluation** on the held-out frames (the last ``--test-frames``), with the encoder in
evaluation mode and :math:`\mu_t` its means over the whole video:

* ``r2``, ``pixel_error``: the affine position decoder of the other priors
  (:func:`~rpm.experiments.bouncing_balls.evaluate.evaluate`);
* ``smoothed_r2``, ``smoothed_pixel_error``: the same affine position decoder fitted on the
  smoothed latents :math:`C\,E[s_t | \mu_{1:F}]` instead of the means :math:`\mu_t` (reported
  beside ``r2``; the dynamics do not denoise the positions further: equal or slightly lower);
* ``velocity_r2``: an affine decoder from the smoothed hidden states
  :math:`E[s_t | \mu_{1:F}]` (the posterior of the learned chain given every frame's
  recognition factor) to the true velocities :math:`v_t = c_t - c_{t-1}`, fitted on the
  training frames, :math:`R^2` on the held-out ones;
* ``forecast_error_px``: the one-step forecast with the learned dynamics, no refit,
  :math:`\hat z_{t} = C A\, E[s_{t-1} | \mu_{1:t-1}]` (Kalman filter), decoded to positions by the
  position decoder: the mean distance to the true centre per ball;
* ``baseline_forecast_error_px``: the last true position as the forecast, :math:`\lVert c_t -
  c_{t-1}\rVert`, one ball diameter (5 px) by construction.
"""

from __future__ import annotations

import argparse
from typing import NamedTuple

import torch

import rpm
from rpm.experiments.bouncing_balls.encoders import GaussianBallEncoder
from rpm.experiments.bouncing_balls.evaluate import encode, fit_linear_decoder
from rpm.metrics import r2_per_dimension
from rpm.ops._kalman import rts_smoother
from rpm.priors import StateSpacePrior, StationaryStateSpacePrior

__all__ = ["DynamicsEvaluation", "build_state_space_model", "damped_velocity_dynamics",
           "displacement_noise", "emission_noise", "evaluate_dynamics", "window_batch"]

def build_state_space_model(args: argparse.Namespace, in_channels: int, num_balls: int,
                            guide: str = "structured", learn_noise: bool = False,
                            kind: str = "stationary", emission: str = "learned") -> rpm.RPM:
    """The RPM of the state-space prior with a fresh :class:`GaussianBallEncoder`
    (pixel units, recognition noise ``--state-space-noise``, fixed unless ``learn_noise``).

    ``kind="stationary"`` (the default; :class:`~rpm.priors.StationaryStateSpacePrior`): the
    chain starts as a damped constant velocity in pixels (:func:`damped_velocity_dynamics`)
    whitened to unit stationary covariance (``from_dynamics``), the offset b at the box centre,
    R at :func:`emission_noise`; ``emission="pinned"`` keeps C and R at that start (buffers:
    only the transition and b are learned), ``"learned"`` learns them. ``kind="free"``
    (:class:`~rpm.priors.StateSpacePrior`): the chain starts at constant velocity with the
    statistics of the video: positions around the box centre (spread a quarter of the box),
    velocities of one ball diameter per frame (about ``d / sqrt(2)`` per coordinate), position
    noise ``--state-space-noise``, velocity noise half a diameter per frame (the headings turn
    by up to 45 degrees and bounce), the velocity being the displacement into each frame
    (:func:`displacement_noise`).
    """
    if kind not in ("stationary", "free"):
        raise ValueError(f"kind must be 'stationary' or 'free', got {kind!r}")
    if emission not in ("learned", "pinned") or (emission == "pinned" and kind != "stationary"):
        raise ValueError(f"emission must be 'learned', or 'pinned' with kind='stationary', got "
                         f"{emission!r} with kind={kind!r}")
    encoder = GaussianBallEncoder(in_channels=in_channels, hidden_channels=args.hidden_channels,
                                  kernel_size=5, num_maps=num_balls,
                                  init_scale=args.state_space_noise)
    if not learn_noise:  # a constant: the encoder's log_scale becomes a buffer
        log_scale = encoder.log_scale.detach()
        del encoder.log_scale
        encoder.register_buffer("log_scale", log_scale)
    dim = 2 * num_balls
    if kind == "stationary":
        transition, noise = damped_velocity_dynamics(dim, args.state_space_noise,
                                                     args.ball_diameter)
        prior = StationaryStateSpacePrior.from_dynamics(
            transition, noise, torch.eye(dim, 2 * dim), observation_offset=args.image_size / 2,
            observation_noise=emission_noise(args),
            learn_observation_matrix=emission == "learned",
            learn_observation_noise=emission == "learned")
        return rpm.RPM(rpm.GaussianRecognition(encoder), prior, guide=guide, encoder_calls="concat")
    speed = args.ball_diameter / 2 ** 0.5
    prior = StateSpacePrior(
        dim, constant_velocity=True,
        init_loc=[args.image_size / 2] * dim + [0.0] * dim,
        init_scale=[args.image_size / 4] * dim + [speed] * dim,
        process_noise=displacement_noise(dim, args.state_space_noise, args.ball_diameter / 2),
        observation_noise=args.state_space_noise,
    )
    return rpm.RPM(rpm.GaussianRecognition(encoder), prior, guide=guide, encoder_calls="concat")


def emission_noise(args: argparse.Namespace) -> float:
    """The stationary prior's emission noise (standard deviation of R, pixels):
    ``--state-space-emission-noise``, or ``--state-space-noise`` for arguments without it."""
    value = getattr(args, "state_space_emission_noise", None)
    return args.state_space_noise if value is None else value


#: Damping of the stationary prior's starting dynamics: position, velocity.
POSITION_DECAY, VELOCITY_DECAY = 0.9, 0.8


def damped_velocity_dynamics(dim: int, position_noise: float, ball_diameter: float
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The start of the stationary prior: a damped constant velocity in pixels,

    .. math::

        u_{t+1} = \rho\, u_t + \epsilon_t, \quad p_{t+1} = \alpha\, p_t + u_{t+1} + \eta_t,
        \qquad A_0 = \begin{pmatrix} \alpha I & \rho I \\ 0 & \rho I \end{pmatrix},

    with :math:`\alpha` = ``POSITION_DECAY`` (positions return towards the box centre),
    :math:`\rho` = ``VELOCITY_DECAY`` (bounces reverse velocities), velocity noise
    :math:`0.3 d` and position noise ``position_noise``; the process noise is that of
    :func:`displacement_noise` (the velocity is the displacement into the frame). Its stationary
    spread is about 14 px for the positions and 2.5 px for the velocities.

    :return: :math:`A_0` and the Cholesky factor of :math:`Q_0`, each (2 dim, 2 dim).
    """
    eye = torch.eye(dim)
    transition = torch.cat([torch.cat([POSITION_DECAY * eye, VELOCITY_DECAY * eye], 1),
                            torch.cat([0 * eye, VELOCITY_DECAY * eye], 1)])
    return transition, displacement_noise(dim, position_noise, 0.3 * ball_diameter)


def displacement_noise(dim: int, position: float, velocity: float) -> torch.Tensor:
    r"""The Cholesky factor of the process noise of a constant-velocity state whose velocity is
    the displacement *into* frame t, :math:`u_t = p_t - p_{t-1}`:

    .. math::

        u_{t+1} = u_t + \epsilon_t, \quad p_{t+1} = p_t + u_t + \epsilon_t + \eta_t, \qquad
        Q = \begin{pmatrix} (\sigma_p^2 + \sigma_v^2) I & \sigma_v^2 I \\
                            \sigma_v^2 I & \sigma_v^2 I \end{pmatrix},

    with :math:`\epsilon_t \sim \mathcal{N}(0, \sigma_v^2 I)` and
    :math:`\eta_t \sim \mathcal{N}(0, \sigma_p^2 I)`. With
    :math:`A = \begin{pmatrix} I & I \\ 0 & I\end{pmatrix}` this describes the same
    observations as independent position and velocity noise, whose velocity is the displacement
    *out of* frame t; the likelihood cannot tell the two apart, so the start decides which one
    the smoothed states hold, and the velocity read-out :math:`v_t = c_t - c_{t-1}` needs this
    one (with the true centres as latents the smoothed states give velocity :math:`R^2` 0.97
    under it and 0.44 under the other).

    :return: shape (2 dim, 2 dim), lower triangular.
    """
    total = (position ** 2 + velocity ** 2) ** 0.5
    eye = torch.eye(dim)
    return torch.cat([
        torch.cat([total * eye, 0 * eye], 1),
        torch.cat([velocity ** 2 / total * eye, position * velocity / total * eye], 1)])


def window_batch(frames: torch.Tensor, starts: torch.Tensor, length: int) -> torch.Tensor:
    """The windows ``frames[s : s + length]`` for each start s.

    :param torch.Tensor frames: the video, shape (F, C, H, W).
    :param torch.Tensor starts: first frames, shape (N,).
    :return: shape (N, length, C, H, W).
    """
    index = starts[:, None] + torch.arange(length, device=starts.device)  # (N, T)
    return frames[index]


class DynamicsEvaluation(NamedTuple):
    r"""Scores of the learned dynamics on the held-out frames (module docstring).

    :ivar float velocity_r2: held-out R^2 of the velocities read from the smoothed states.
    :ivar float forecast_error_px: one-step forecast error per ball, pixels.
    :ivar float baseline_forecast_error_px: the last true position as the forecast, pixels.
    :ivar float smoothed_r2: held-out position R^2 of the affine decoder fitted on the smoothed
        latents :math:`C\,E[s_t | \mu_{1:F}]` instead of the recognition means.
    :ivar float smoothed_pixel_error: its mean decoding error per ball, pixels.
    :ivar torch.Tensor forecast: forecast centres of the held-out frames, (T_test, K, 2).
    :ivar torch.Tensor velocity: decoded velocities of the held-out frames, (T_test, K, 2).
    """

    velocity_r2: float
    forecast_error_px: float
    baseline_forecast_error_px: float
    forecast: torch.Tensor
    velocity: torch.Tensor
    smoothed_r2: float
    smoothed_pixel_error: float


@torch.no_grad()
def evaluate_dynamics(model: rpm.RPM, frames: torch.Tensor, centres: torch.Tensor,
                      num_train: int) -> DynamicsEvaluation:
    """Velocity read-out and one-step forecasts of a trained state-space RPM (module
    docstring). The encoder is left in evaluation mode.

    :param model: an RPM with a :class:`GaussianBallEncoder` and a StateSpacePrior.
    :param torch.Tensor frames: the whole video, shape (F, C, H, W).
    :param torch.Tensor centres: true centres, shape (F, K, 2).
    :param int num_train: number of leading training frames.
    """
    encoder = model.recognition.net
    loc = encode(encoder.encoder, frames)  # (F, 2K), float64 CPU
    scale = encoder.log_scale.exp().detach().to("cpu", torch.float64).expand_as(loc)
    learned = model.prior.distribution(loc.shape[0])
    params = {name: getattr(learned, name).detach().to("cpu", torch.float64)
              for name in learned.arg_constraints}
    chain = rpm.distributions.GaussianStateSpace(**params, duration=loc.shape[0])
    posterior = rpm.distributions.StateSpacePosterior(chain, loc[None], scale[None])
    filtered = posterior.filtered  # Kalman filter of mu_{1:F} under noise R + Sigma
    smoothed = rts_smoother(filtered, params["transition_matrix"],
                            params["transition_scale_tril"]).loc[0]  # (F, H)

    targets = centres.detach().to("cpu", torch.float64).flatten(1)  # (F, 2K)
    velocity = targets[1:] - targets[:-1]  # v_t for t = 1..F-1, (F-1, 2K)
    velocity_r2 = r2_per_dimension(velocity, smoothed[1:], num_train=num_train - 1).mean()
    coef = fit_linear_decoder(smoothed[1:num_train], velocity[:num_train - 1])
    design = torch.cat([smoothed, torch.ones(len(smoothed), 1, dtype=torch.float64)], 1)
    decoded_velocity = (design @ coef)[num_train:]

    position = fit_linear_decoder(loc[:num_train], targets[:num_train])  # (2K + 1, 2K)
    offset = params["observation_offset"]
    predicted = filtered.predicted_loc[0] @ params["observation_matrix"].T + offset  # C s_{t|t-1} + b
    design = torch.cat([predicted, torch.ones(len(predicted), 1, dtype=torch.float64)], 1)
    forecast = (design @ position)[num_train:].reshape(-1, centres.shape[1], 2)
    truth = targets[num_train:].reshape(forecast.shape)
    previous = targets[num_train - 1:-1].reshape(forecast.shape)

    latent = smoothed @ params["observation_matrix"].T + offset  # (F, 2K): C E[s_t | mu_{1:F}] + b
    smoothed_r2 = r2_per_dimension(targets, latent, num_train=num_train).mean()
    coef = fit_linear_decoder(latent[:num_train], targets[:num_train])
    design = torch.cat([latent, torch.ones(len(latent), 1, dtype=torch.float64)], 1)
    smoothed_error = ((design @ coef)[num_train:].reshape(truth.shape) - truth).norm(dim=-1).mean()
    return DynamicsEvaluation(
        velocity_r2=velocity_r2.item(),
        forecast_error_px=(forecast - truth).norm(dim=-1).mean().item(),
        baseline_forecast_error_px=(previous - truth).norm(dim=-1).mean().item(),
        forecast=forecast,
        velocity=decoded_velocity.reshape(-1, centres.shape[1], 2),
        smoothed_r2=smoothed_r2.item(),
        smoothed_pixel_error=smoothed_error.item(),
    )
