r"""Training and scoring of ``rpm lds`` on any sequences of vectors: :func:`fit` for arrays
(a notebook), :func:`train_and_score` for the command, one implementation.

The model and its training are those of the command (:mod:`rpm.experiments.lds.command`): a
Gaussian encoder of each frame (:class:`~rpm.experiments.lds.model.GaussianMLPEncoder`, D
latents), a learned linear-Gaussian state-space prior (H = D) with the structured guide, trained
on windows of the training sequences (:func:`~rpm.experiments.lds.train.train_sequence_model`).
With true states the held-out scores of :mod:`rpm.experiments.lds.evaluate` are computed
(``r2``, ``means_r2``, the forecast errors, and ``eigenvalue_error`` when the true transition
matrix is given too); without states they are skipped and ``scores_skipped`` says why.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

import rpm
from rpm.experiments.common import resolve_device, seed_everything, torch_threads
from rpm.experiments.data_file import command_options, float_array, read_arrays
from rpm.experiments.lds.command import ARRAYS
from rpm.experiments.lds.evaluate import (
    Inference,
    eigenvalue_error,
    forecast_errors,
    heldout_r2,
    infer_states,
)
from rpm.experiments.lds.model import model_from_arguments
from rpm.experiments.lds.sequences import SequenceData, sequence_data
from rpm.experiments.lds.train import train_sequence_model
from rpm.experiments.trained import write_model_record

__all__ = ["ARRAYS", "GENERATION_FLAGS", "SequenceFit", "check_arrays", "fit", "load_data",
           "model_arguments", "train_and_score", "train_scored"]

#: The flags of the generated data, which ``--data`` replaces.
GENERATION_FLAGS = ("size", "sequences", "test_sequences", "length")
#: The default split holds out the last N // 3 sequences (100 of the generated 300).
HELD_OUT_SHARE = 3
#: Training frames the affine read-out of the states needs.
MIN_TRAIN_FRAMES = 20


class SequenceFit(NamedTuple):
    """A trained sequence model and its scores.

    :ivar rpm.RPM model: the trained model, in evaluation mode.
    :ivar scores: the held-out scores (module docstring), or None without states.
    :ivar untrained: the same scores of the untrained model, or None.
    :ivar scores_skipped: why the scores are None, else None.
    :ivar Inference inference: the encoder's means and the smoothed latents of every sequence,
        training ones first (``data.index`` gives their rows in the arrays given).
    :ivar SequenceData data: the sequences as trained and scored.
    :ivar dict history: the trainer's losses and evaluations.
    """

    model: rpm.RPM
    scores: dict | None
    untrained: dict | None
    scores_skipped: str | None
    inference: Inference
    data: SequenceData
    history: dict


def check_arrays(observations: Any, states: Any, held_out: Any, transition_matrix: Any,
                 window: int) -> tuple[SequenceData, torch.Tensor | None]:
    """The checked sequences (:func:`~rpm.experiments.lds.sequences.sequence_data`: observations
    (N, T, D), states (N, T, K)) and the true transition matrix (K, K), float64, or None."""
    data = sequence_data(observations, states, held_out, frame_ndims=(1,), layout="(N, T, D)",
                         window=window, held_out_share=HELD_OUT_SHARE,
                         min_train_frames=MIN_TRAIN_FRAMES)
    if transition_matrix is None:
        return data, None
    if data.states is None:
        raise ValueError("transition_matrix scores the learned dynamics against the states': "
                         "give states too, or leave it out")
    matrix = torch.as_tensor(float_array("transition_matrix", transition_matrix, (2,), "(K, K)"))
    size = data.states.shape[-1]
    if tuple(matrix.shape) != (size, size):
        raise ValueError(f"transition_matrix must have shape (K, K) = ({size}, {size}), the states' "
                         f"K, got shape {tuple(matrix.shape)}")
    return data, matrix


def load_data(path: str, window: int) -> tuple[SequenceData, torch.Tensor | None]:
    """The checked arrays of ``rpm lds --data path`` (:data:`ARRAYS`, :func:`check_arrays`);
    every problem is a one-line :class:`ValueError`."""
    arrays = read_arrays(path, *ARRAYS)
    return check_arrays(arrays["observations"], arrays.get("states"), arrays.get("held_out"),
                        arrays.get("transition_matrix"), window)


def _scores(model, x: torch.Tensor, states: torch.Tensor, transition: torch.Tensor | None,
            num_train: int) -> dict:
    inference = infer_states(model, x)
    error = None
    if transition is not None and inference.transition_matrix.shape == transition.shape:
        error = eigenvalue_error(inference.transition_matrix, transition)
    return {
        "r2": heldout_r2(states, inference.smoothed, num_train).mean().item(),
        "means_r2": heldout_r2(states, inference.means, num_train).mean().item(),
        "eigenvalue_error": error,
        "_inference": inference,
    }


def model_arguments(args, obs_dim: int, latent_dim: int) -> dict:
    """The model record of ``rpm lds`` (:mod:`rpm.experiments.trained`): the arguments of
    :func:`~rpm.experiments.lds.model.model_from_arguments` for observations of ``obs_dim``
    numbers (D, read from the data) and ``latent_dim`` latents, with the flags ``args``
    (``hidden``, ``recognition_noise``, ``marginal``, ``prior``)."""
    return {"obs_dim": int(obs_dim), "dim": int(latent_dim), "hidden": args.hidden,
            "recognition_noise": args.recognition_noise, "marginal": args.marginal,
            "prior": args.prior}


def train_and_score(data: SequenceData, args, out: Path, device: torch.device,
                    transition_matrix: torch.Tensor | None = None,
                    description: str = "lds") -> SequenceFit:
    """Builds the model of the flags ``args`` (``latent_dim``: default the states' K, else the
    observations' D) from its model record (:func:`model_arguments`, written to
    ``out/model.json`` for :func:`rpm.load`), trains it on ``data``'s training sequences with
    its checkpoint in ``out`` and scores it (module docstring).

    :param SequenceData data: the checked sequences.
    :param args: the flags of ``rpm lds`` (:func:`fit` fills them from keyword arguments).
    :param Path out: the folder of the checkpoint and history.
    :param torch.device device: the training device.
    :param transition_matrix: the true A, (K, K), or None.
    :param str description: the progress bar's label.
    """
    x = data.observations.to(device, torch.get_default_dtype())  # (N, T, D)
    states, num_train = data.states, data.num_train
    latent = args.latent_dim or (states.shape[-1] if states is not None else x.shape[-1])
    arguments = model_arguments(args, obs_dim=x.shape[-1], latent_dim=latent)
    seed_everything(args.seed)
    model = model_from_arguments(arguments).to(device)
    write_model_record(out, "lds", arguments, x.shape[2:])  # what rpm.load rebuilds it from

    def scores() -> dict:
        return _scores(model, x, states, transition_matrix, num_train)

    return train_scored(model, x, data, scores, ("r2", "means_r2", "eigenvalue_error"), args,
                        out, description)


def train_scored(model: rpm.RPM, observations: torch.Tensor, data: SequenceData,
                 scores: Callable[[], dict], logged: Sequence[str], args, out: Path,
                 description: str, drop_frames: float = 0.0) -> SequenceFit:
    """Trains the state-space RPM ``model`` on the training sequences of ``observations``
    (:func:`~rpm.experiments.lds.train.train_sequence_model` with the flags ``args``: ``steps``,
    ``batch_size``, ``window``, ``lr``, ``prior_lr``, ``seed``, ``eval_every``,
    ``checkpoint_every``, ``progress``, ``resume``) and scores it against ``data.states``: what
    ``rpm lds`` and ``rpm pendulum`` share.

    ``scores()`` scores the model as it is now and returns a dict with ``_inference``, the
    :class:`~rpm.experiments.lds.evaluate.Inference` of every sequence. It is called before
    training (the untrained scores), at every evaluation (the entries ``logged`` that are not
    None go into the history) and after training, unless the evaluation after the last step
    already scored the trained model (a resumed run that had finished trains no step and is
    scored afresh). The trained scores get the held-out forecast errors of the smoothed latents
    (:func:`~rpm.experiments.lds.evaluate.forecast_errors`: ``forecast_error`` of the model's
    dynamics, ``var_forecast_error`` of a VAR fitted to the means). Without states nothing is
    scored and ``scores`` is never called.

    :param rpm.RPM model: the model, on the device of ``observations``.
    :param torch.Tensor observations: every sequence, training ones first (``data``'s order),
        (N, T, ...).
    :param SequenceData data: the checked sequences (``states``, ``num_train``).
    :param scores: the scoring closure (above).
    :param logged: the keys of the scores that each evaluation records.
    :param args: the command's flags.
    :param Path out: the folder of the checkpoint and history.
    :param str description: the progress bar's label.
    :param float drop_frames: the probability of dropping each frame of a training window.
    """
    states, num_train = data.states, data.num_train
    untrained = None if states is None else scores()
    latest = {}  # the scores of the latest evaluation, reused below if it is the last step's

    def eval_fn(step: int) -> dict:
        if states is None:
            return {}  # nothing to score: the evaluation records the time only
        result = scores()
        latest.update(step=step, scores=result)
        return {key: result[key] for key in logged if result.get(key) is not None}

    history = train_sequence_model(
        model, observations[:num_train], steps=args.steps, batch_size=args.batch_size,
        window=args.window, lr=args.lr, prior_lr=args.prior_lr, seed=args.seed,
        out=out, eval_fn=eval_fn, eval_every=args.eval_every,
        checkpoint_every=args.checkpoint_every, progress=args.progress, resume=args.resume,
        description=description, drop_frames=drop_frames)
    model.eval()
    if states is None:
        return SequenceFit(model, None, None, "no states given", infer_states(model, observations),
                           data, history)
    # the trainer evaluates after the last step: its scores are the trained model's
    result = latest["scores"] if latest.get("step") == args.steps else scores()
    inference = result.pop("_inference")
    forecasts = forecast_errors(inference, states, num_train)
    result.update(forecast_error=forecasts["model"], var_forecast_error=forecasts["var"])
    untrained.pop("_inference")
    return SequenceFit(model, result, untrained, None, inference, data, history)


@contextlib.contextmanager
def run_folder(out: str | None):
    """``out`` as a :class:`~pathlib.Path`, or a temporary folder removed at the end."""
    if out is not None:
        yield Path(out)
        return
    with tempfile.TemporaryDirectory(prefix="rpm-fit-") as folder:
        yield Path(folder)


def fit(observations: Any, states: Any = None, held_out: Any = None, *,
        transition_matrix: Any = None, out: str | None = None, **options: Any) -> SequenceFit:
    r"""Trains the model of ``rpm lds`` on the sequences ``observations`` and scores it against
    ``states`` (module docstring): what ``rpm lds --data FILE`` does, without the run folder's
    results and figures.

    :param observations: (N, T, D): N sequences of T >= 2 frames of D numbers (NumPy or torch).
    :param states: (N, T, K), the true state of every frame, for the scores only; or None.
    :param held_out: (N,) boolean, the sequences held out from training and scored; default
        the last N // 3 with states, none without (:mod:`rpm.experiments.lds.sequences`).
    :param transition_matrix: (K, K), the true dynamics, for ``eigenvalue_error``; or None.
    :param out: a folder for the checkpoint and history (kept); default a temporary one.
    :param options: the flags of ``rpm lds`` by name (``steps=600``, ``batch_size=64``,
        ``window=25``, ``latent_dim``, ``hidden``, ``prior``, ``marginal``,
        ``recognition_noise``, ``lr``, ``prior_lr``, ``eval_every``, ``seed``, ``device``,
        ``threads``, ``progress``, ``checkpoint_every``), each with the command's default.
    :raises ValueError: a bad array or option, in one line.
    """
    from rpm.experiments.lds.command import add_parser

    args = command_options(add_parser, "lds", options, exclude=GENERATION_FLAGS)
    data, transition = check_arrays(observations, states, held_out, transition_matrix,
                                    args.window)
    with run_folder(out) as folder, torch_threads(args.threads):
        return train_and_score(data, args, folder, resolve_device(args.device), transition)

