r"""Missing frames on the pendulum: forecasts and imputations of the learned chain when a
fraction of the held-out frames is dropped at random (issue "Sequences 2", item 4; the same
scores as :mod:`rpm.experiments.bouncing_balls.missing_frames`, on the pendulum's state).

Each frame of the held-out videos is dropped with probability p
(:func:`rpm.data.missing.drop_frames`); the learned chain is conditioned on the recognition
means of the observed frames only (:func:`~rpm.experiments.lds.evaluate.infer_states` with the
mask: the Kalman filter skips the dropped frames' updates). Every read-out goes through the
affine map :math:`[s, 1] B` from the smoothed latents to :math:`(\sin\theta, \cos\theta,
\omega)` fitted on the training videos with every frame seen (the map the ``r2`` uses), and
every error is a root mean squared error over the three coordinates:

* ``forecast_error``: the one-step forecast :math:`E[s_t | \mu_{\text{observed}, <t}]` of
  every held-out frame t >= 2 (its own frame unseen, after a dropped frame a two-step
  forecast); ``full_forecast_error`` the same with every frame seen (``forecast_error["1"]`` of
  the run, :func:`~rpm.experiments.lds.evaluate.forecast_errors`);
* ``imputation_error``: the smoothed latents :math:`E[s_t | \mu_\text{observed}]` at the dropped
  held-out frames; ``observed_error`` the read-out at the same frames with every frame seen.
"""

from __future__ import annotations

import torch

from rpm.data.missing import drop_frames
from rpm.experiments.lds.evaluate import Inference, affine_apply, affine_fit, infer_states

__all__ = ["evaluate_missing_frames"]


def _rmse(predicted: torch.Tensor, target: torch.Tensor) -> float:
    return float((predicted - target).square().mean().sqrt()) if len(target) else float("nan")


@torch.no_grad()
def evaluate_missing_frames(model, frames: torch.Tensor, states: torch.Tensor, num_train: int,
                            fraction: float, seed: int = 0,
                            inference: Inference | None = None) -> dict[str, float]:
    r"""Forecast and imputation errors with each held-out frame dropped with probability
    ``fraction`` (module docstring). The encoder is left in evaluation mode.

    :param model: a trained :class:`~rpm.RPM` with a linear-Gaussian prior (as for
        :func:`~rpm.experiments.lds.evaluate.infer_states`).
    :param torch.Tensor frames: the videos, training ones first, (N, T, 1, S, S).
    :param torch.Tensor states: their states, (N, T, K).
    :param int num_train: the training videos (never dropped).
    :param float fraction: the probability of dropping a held-out frame, in [0, 1).
    :param int seed: the seed of the dropped frames.
    :param inference: the model's :func:`~rpm.experiments.lds.evaluate.infer_states` of
        ``frames`` with every frame seen, if already computed (its means are reused).
    :return: ``forecast_error``, ``full_forecast_error``, ``imputation_error``,
        ``observed_error`` and ``dropped_frames`` (the count).
    """
    num, length = states.shape[:2]
    if not 1 <= num_train < num:
        raise ValueError(f"num_train must lie in [1, {num}) (held-out videos are needed), "
                         f"got {num_train}")
    mask = torch.ones(num, length, dtype=torch.bool)
    mask[num_train:] = drop_frames((num - num_train, length), fraction,
                                   torch.Generator().manual_seed(seed))
    full = inference if inference is not None else infer_states(model, frames)
    masked = infer_states(model, frames, mask=mask, encoded=full)
    states = states.to(torch.float64)
    coef = affine_fit(full.smoothed[:num_train].flatten(0, 1), states[:num_train].flatten(0, 1))

    def read_out(latents: torch.Tensor) -> torch.Tensor:
        return affine_apply(coef, latents)

    test = slice(num_train, None)
    dropped = ~mask[test]  # (n, T)
    return {
        "forecast_error": _rmse(read_out(masked.filtered.predicted_loc[test, 1:]),
                                states[test, 1:]),
        "full_forecast_error": _rmse(read_out(full.filtered.predicted_loc[test, 1:]),
                                     states[test, 1:]),
        "imputation_error": _rmse(read_out(masked.smoothed[test][dropped]),
                                  states[test][dropped]),
        "observed_error": _rmse(read_out(full.smoothed[test][dropped]), states[test][dropped]),
        "dropped_frames": int(dropped.sum()),
    }
