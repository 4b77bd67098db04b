r"""Training and scoring of ``rpm pendulum`` on any videos: :func:`fit` for arrays (a
notebook), :func:`train_and_score` for the command, one implementation.

The model and its training are those of the command (:mod:`rpm.experiments.pendulum.command`):
a convolutional Gaussian encoder of each frame (``encoder``: keypoints or flat, built for the
frames' channels and size), a learned linear-Gaussian state-space prior over the frames of a
window with the structured guide, trained on windows of the training videos
(:func:`~rpm.experiments.lds.train.train_sequence_model`). The videos are ``observations`` of
shape (N, T, H, W) or (N, T, C, H, W), channels first, H and W at least 8; ``uint8`` frames
are divided by 255, other values are taken as they are (intensities in [0, 1] suit the
encoders' initialisation). With true states (N, T, K) the held-out scores are computed
(:mod:`rpm.experiments.pendulum.command`: ``r2``, ``means_r2``, ``knn_r2``, the forecast errors,
``missing_frames``); without states they are skipped and ``scores_skipped`` says why.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rpm.experiments.common import derived_seed, resolve_device, seed_everything, torch_threads
from rpm.experiments.data_file import command_options, read_arrays
from rpm.experiments.lds.evaluate import heldout_r2, infer_states
from rpm.experiments.lds.fitting import SequenceFit, run_folder, train_scored
from rpm.experiments.lds.sequences import SequenceData, sequence_data
from rpm.experiments.pendulum.command import ARRAYS
from rpm.experiments.pendulum.missing_frames import evaluate_missing_frames
from rpm.experiments.pendulum.model import model_from_arguments
from rpm.experiments.pendulum.readout import knn_heldout_r2
from rpm.experiments.trained import write_model_record

__all__ = ["ARRAYS", "GENERATION_FLAGS", "STATE_NAMES", "check_arrays", "fit", "load_data",
           "model_arguments", "train_and_score"]

#: The flags of the generated videos, which ``--data`` replaces.
GENERATION_FLAGS = ("distractors", "sequences", "test_sequences", "length", "image_size", "noise")
#: The default split holds out the last N // 5 videos (50 of the generated 250).
HELD_OUT_SHARE = 5
#: The smallest side of a frame.
MIN_SIDE = 8
#: The neighbours of the k-nearest-neighbour read-out (``knn_r2``).
NEIGHBOURS = 10
#: Names of the coordinates of the generated pendulum's state.
STATE_NAMES = ("sin_theta", "cos_theta", "omega")


def check_arrays(observations: Any, states: Any, held_out: Any, window: int,
                 latent_dim: int) -> SequenceData:
    """The checked videos (:func:`~rpm.experiments.lds.sequences.sequence_data`), their frames
    as (N, T, C, H, W) float32 with H, W >= 8; with states, enough training frames for the
    affine (``latent_dim`` + 2) and the 10-nearest-neighbour read-outs."""
    data = sequence_data(observations, states, held_out, frame_ndims=(2, 3),
                         layout="(N, T, H, W) or (N, T, C, H, W)", window=window,
                         held_out_share=HELD_OUT_SHARE,
                         min_train_frames=max(NEIGHBOURS, latent_dim + 2), dtype=np.float32)
    frames = data.observations
    if frames.dim() == 4:
        frames = frames.unsqueeze(2)  # (N, T, 1, H, W)
    if min(frames.shape[-2:]) < MIN_SIDE:
        raise ValueError(f"the frames are {frames.shape[-2]} x {frames.shape[-1]} pixels: the "
                         f"encoders need at least {MIN_SIDE} x {MIN_SIDE} (observations of shape "
                         "(N, T, H, W) or (N, T, C, H, W), channels first)")
    return data._replace(observations=frames)


def load_data(path: str, window: int, latent_dim: int) -> SequenceData:
    """The checked arrays of ``rpm pendulum --data path`` (:data:`ARRAYS`,
    :func:`check_arrays`); every problem is a one-line :class:`ValueError`."""
    arrays = read_arrays(path, *ARRAYS)
    return check_arrays(arrays["observations"], arrays.get("states"), arrays.get("held_out"),
                        window, latent_dim)


def _scores(model, frames: torch.Tensor, states: torch.Tensor, num_train: int,
            names: tuple[str, ...]) -> dict:
    inference = infer_states(model, frames)
    per_coordinate = heldout_r2(states, inference.smoothed, num_train)
    return {
        "r2": per_coordinate.mean().item(),
        "r2_per_coordinate": dict(zip(names, per_coordinate.tolist(), strict=True)),
        "means_r2": heldout_r2(states, inference.means, num_train).mean().item(),
        "_inference": inference,
    }


def model_arguments(args, in_channels: int, image_size: tuple[int, int]) -> dict:
    """The model record of ``rpm pendulum`` (:mod:`rpm.experiments.trained`): the arguments of
    :func:`~rpm.experiments.pendulum.model.model_from_arguments` for frames of ``in_channels``
    channels and ``image_size`` (height, width) pixels (read from the data), with the flags
    ``args`` (``encoder``, ``latent_dim``, ``channels``, ``hidden``, ``keypoints``,
    ``recognition_noise``, ``state_dim``, ``marginal``, ``prior``)."""
    hidden = args.hidden if args.hidden is not None else (0 if args.encoder == "keypoints" else 64)
    height, width = (int(side) for side in image_size)
    return {"encoder": args.encoder, "image_size": [height, width],
            "in_channels": int(in_channels), "latent_dim": args.latent_dim,
            "channels": args.channels, "hidden": hidden, "keypoints": args.keypoints,
            "recognition_noise": args.recognition_noise,
            "state_dim": args.state_dim or 3 * args.latent_dim, "marginal": args.marginal,
            "prior": args.prior}


def train_and_score(data: SequenceData, args, out, device: torch.device,
                    state_names: tuple[str, ...] | None = None,
                    description: str = "pendulum") -> SequenceFit:
    """Builds the model of the flags ``args`` for the videos' channels and frame size from its
    model record (:func:`model_arguments`, written to ``out/model.json`` for :func:`rpm.load`),
    trains it on ``data``'s training videos with its checkpoint in ``out`` and scores it
    (module docstring).

    :param SequenceData data: the checked videos, (N, T, C, H, W).
    :param args: the flags of ``rpm pendulum`` (:func:`fit` fills them from keyword arguments).
    :param out: the folder of the checkpoint and history.
    :param torch.device device: the training device.
    :param state_names: names of the state's coordinates in the per-coordinate scores
        (default ``state_0``, ``state_1``, ...).
    :param str description: the progress bar's label.
    """
    frames = data.observations.to(device)  # (N, T, C, H, W)
    states, num_train = data.states, data.num_train
    if states is not None and state_names is None:
        state_names = tuple(f"state_{k}" for k in range(states.shape[-1]))
    arguments = model_arguments(args, in_channels=frames.shape[2],
                                image_size=tuple(frames.shape[-2:]))
    seed_everything(args.seed)
    model = model_from_arguments(arguments).to(device)
    write_model_record(out, "pendulum", arguments, frames.shape[2:])  # what rpm.load rebuilds it from

    def scores() -> dict:
        return _scores(model, frames, states, num_train, state_names)

    trained = train_scored(model, frames, data, scores, ("r2", "means_r2"), args, out,
                           description, drop_frames=args.drop_frames)
    if states is None:
        return trained
    result, inference = trained.scores, trained.inference
    knn = knn_heldout_r2(states, inference.smoothed, num_train, k=NEIGHBOURS)
    baseline = float((states[num_train:] - states[:num_train].mean((0, 1))).square().mean().sqrt())
    result.update(knn_r2=knn.mean().item(),
                  knn_r2_per_coordinate=dict(zip(state_names, knn.tolist(), strict=True)),
                  forecast_baseline=baseline)
    if args.eval_drop_frames > 0:
        result["missing_frames"] = {
            "fraction": args.eval_drop_frames, "trained_with_fraction": args.drop_frames,
            **evaluate_missing_frames(model, frames, states, num_train, args.eval_drop_frames,
                                      seed=derived_seed(args.seed, "drop"), inference=inference)}
    return trained


def fit(observations: Any, states: Any = None, held_out: Any = None, *, out: str | None = None,
        **options: Any) -> SequenceFit:
    r"""Trains the model of ``rpm pendulum`` on the videos ``observations`` and scores it
    against ``states`` (module docstring): what ``rpm pendulum --data FILE`` does, without the
    run folder's results and figures.

    :param observations: (N, T, H, W) or (N, T, C, H, W): N videos of T >= 2 frames, H, W >= 8.
    :param states: (N, T, K), the true state of every frame, for the scores only; or None.
    :param held_out: (N,) boolean, the videos held out from training and scored; default the
        last N // 5 with states, none without (:mod:`rpm.experiments.lds.sequences`).
    :param out: a folder for the checkpoint and history (kept); default a temporary one.
    :param options: the flags of ``rpm pendulum`` by name (``steps``, ``batch_size``,
        ``window``, ``encoder``, ``latent_dim``, ``state_dim``, ``channels``, ``keypoints``,
        ``hidden``, ``prior``, ``marginal``, ``recognition_noise``, ``lr``, ``prior_lr``,
        ``drop_frames``, ``eval_drop_frames``, ``eval_every``, ``seed``, ``device``,
        ``threads``, ``progress``, ``checkpoint_every``), each with the command's default.
    :raises ValueError: a bad array or option, in one line.
    """
    from rpm.experiments.pendulum.command import add_parser, check_model_flags

    args = command_options(add_parser, "pendulum", options, exclude=GENERATION_FLAGS)
    check_model_flags(args)
    data = check_arrays(observations, states, held_out, args.window, args.latent_dim)
    with run_folder(out) as folder, torch_threads(args.threads):
        return train_and_score(data, args, folder, resolve_device(args.device))
