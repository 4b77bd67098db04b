r"""Missing frames on the bouncing balls: forecasts and imputations of the state-space prior
when a fraction of the held-out frames is dropped at random (issue "Sequences 2", item 4).

With a mask over frames (:func:`rpm.data.missing.drop_frames`, each held-out frame dropped
with probability p) the learned chain is conditioned on the recognition means of the observed
frames only (:class:`~rpm.distributions.StateSpacePosterior` with the mask: the Kalman filter skips
the dropped frames' updates), and the scores are those of
:func:`~rpm.experiments.bouncing_balls.state_space.evaluate_dynamics`, decoded to positions by
the same affine decoder fitted on the training frames' means:

* ``forecast_error_px``: the one-step forecast :math:`C\,E[s_t | \mu_{\text{observed}, <t}]`
  of every held-out frame (its own frame unseen, as without drops), mean distance per ball;
* ``imputation_error_px``: :math:`C\,E[s_t | \mu_\text{observed}]` (the smoother) at the
  dropped held-out frames;
* ``observed_error_px``: the same smoothed read-out at those frames when nothing is dropped
  (the reference the imputation is compared with), and ``full_forecast_error_px`` the
  forecast without drops.

Training with dropped frames is ``python -m rpm bouncing-balls --drop-frames p``: each window of a
minibatch loses each frame with probability p, and the ELBO is that of the observed frames
(``mask=`` of :meth:`rpm.RPM.model`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

import rpm
from rpm.data.missing import drop_frames
from rpm.experiments.bouncing_balls.evaluate import encode, fit_linear_decoder
from rpm.ops._kalman import rts_smoother

__all__ = ["MissingFramesEvaluation", "evaluate_missing_frames"]


class MissingFramesEvaluation(NamedTuple):
    """Scores with a fraction of the held-out frames dropped (module docstring), in pixels."""

    forecast_error_px: float
    imputation_error_px: float
    observed_error_px: float
    full_forecast_error_px: float
    dropped_frames: int


def _decode(latent: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    design = torch.cat([latent, torch.ones(len(latent), 1, dtype=latent.dtype)], 1)
    return design @ coef


@torch.no_grad()
def evaluate_missing_frames(model: rpm.RPM, frames: torch.Tensor, centres: torch.Tensor,
                            num_train: int, fraction: float, seed: int = 0
                            ) -> MissingFramesEvaluation:
    """Forecast and imputation errors of a trained state-space RPM with each held-out frame
    dropped with probability ``fraction`` (module docstring). The encoder is left in
    evaluation mode.

    :param model: an RPM with a :class:`~rpm.experiments.bouncing_balls.encoders.GaussianBallEncoder`
        and a state-space prior (:class:`~rpm.priors.StationaryStateSpacePrior` or
        :class:`~rpm.priors.StateSpacePrior`).
    :param torch.Tensor frames: the whole video, shape (F, C, H, W).
    :param torch.Tensor centres: true centres, shape (F, K, 2).
    :param int num_train: number of leading training frames (never dropped).
    :param float fraction: the probability of dropping a held-out frame, in [0, 1).
    :param int seed: the seed of the dropped frames.
    """
    encoder = model.recognition.net
    loc = encode(encoder.encoder, frames)  # (F, 2K), float64 CPU
    scale = encoder.log_scale.exp().detach().to("cpu", torch.float64).expand_as(loc)
    num_frames, num_balls = centres.shape[:2]
    learned = model.prior.distribution(num_frames)  # either parametrisation of the chain
    params = {name: getattr(learned, name).detach().to("cpu", torch.float64)
              for name in learned.arg_constraints}
    mask = torch.ones(num_frames, dtype=torch.bool)
    mask[num_train:] = drop_frames((num_frames - num_train,), fraction,
                                   torch.Generator().manual_seed(seed))
    targets = centres.detach().to("cpu", torch.float64).flatten(1)  # (F, 2K)
    position = fit_linear_decoder(loc[:num_train], targets[:num_train])  # (2K + 1, 2K)
    observation, offset = params["observation_matrix"], params["observation_offset"]

    def read_out(observed: torch.Tensor | None):
        chain = rpm.distributions.GaussianStateSpace(**params, duration=num_frames,
                                              mask=None if observed is None else observed[None])
        filtered = rpm.distributions.StateSpacePosterior(chain, loc[None], scale[None]).filtered
        smoothed = rts_smoother(filtered, params["transition_matrix"],
                                params["transition_scale_tril"]).loc[0]  # (F, H)
        forecast = _decode(filtered.predicted_loc[0] @ observation.T + offset, position)
        return forecast, _decode(smoothed @ observation.T + offset, position)

    def error(prediction: torch.Tensor, rows: torch.Tensor) -> float:
        difference = (prediction[rows] - targets[rows]).reshape(-1, num_balls, 2)
        return difference.norm(dim=-1).mean().item() if len(difference) else float("nan")

    held_out = torch.arange(num_frames) >= num_train
    dropped = held_out & ~mask
    forecast, imputed = read_out(mask)
    full_forecast, smoothed = read_out(None)
    return MissingFramesEvaluation(
        forecast_error_px=error(forecast, held_out),
        imputation_error_px=error(imputed, dropped),
        observed_error_px=error(smoothed, dropped),
        full_forecast_error_px=error(full_forecast, held_out),
        dropped_frames=int(dropped.sum()),
    )
