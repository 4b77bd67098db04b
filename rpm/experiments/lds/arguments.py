"""The command-line arguments that ``rpm lds`` and ``rpm pendulum`` share: the state-space RPM
(prior, marginals, recognition noise) and its training on windows of sequences. Each command
keeps its own defaults and its data arguments; nothing here imports torch."""

from __future__ import annotations

import argparse

from rpm.experiments.common import (
    add_training_arguments,
    at_least_two_frames,
    check_batch_size,
    positive_float,
)

__all__ = ["add_state_space_model_arguments", "add_window_training_arguments",
           "check_window_batch_size"]


def add_state_space_model_arguments(group, *, marginal: str = "pooled", prior: str = "free") -> None:
    """Adds ``--prior`` (default ``prior``), ``--marginal`` (default ``marginal``) and
    ``--recognition-noise`` to an argument group."""
    group.add_argument("--prior", choices=("free", "stationary"), default=prior,
                       help="the state-space prior: free (rpm.priors.StateSpacePrior, every "
                       "parameter learned) or stationary (rpm.priors.StationaryStateSpacePrior: "
                       f"s_t ~ N(0, I), Q = I - A A^T) (default: {prior})")
    group.add_argument("--marginal", choices=("per-view", "pooled", "gaussian"), default=marginal,
                       help="the marginals Q_t: the mixture over the t-th frames of the batch's "
                       "windows (per-view), over all its frames (pooled; frames of one window "
                       "are not independent draws), or the Gaussian with that mixture's mean and "
                       "covariance (gaussian; exact for an affine encoder of linear-Gaussian "
                       f"data, no log M ceiling) (default: {marginal})")
    group.add_argument("--recognition-noise", type=positive_float, default=0.1,
                       help="the encoder's constant standard deviation sigma (default: 0.1)")


def add_window_training_arguments(parser: argparse.ArgumentParser, *, steps: int,
                                  batch_size: int, window: int, lr: float, eval_every: int,
                                  held_out: str, prior_lr: float = 1e-2) -> None:
    """Adds the ``training`` group (:func:`~rpm.experiments.common.add_training_arguments`:
    ``--steps``, ``--batch-size`` of windows, ``--lr`` of the encoder, ``--prior-lr``,
    ``--eval-every``; then ``--window``) with a command's defaults; ``held_out`` names what is
    scored (e.g. "sequences", "videos")."""
    train = add_training_arguments(
        parser, {"steps": steps, "batch_size": batch_size, "lr": lr, "prior_lr": prior_lr,
                 "eval_every": eval_every},
        descriptions={"batch_size": "windows per step", "lr": "peak learning rate of the encoder",
                      "prior_lr": "peak learning rate of the prior",
                      "eval_every": f"score the held-out {held_out} every STEPS steps; 0: at the "
                      "end only"})
    train.add_argument("--window", type=at_least_two_frames, default=window,
                       help=f"frames per window (default: {window})")


def check_window_batch_size(batch_size: int, sequences: int, length: int, window: int) -> None:
    """Refuse a ``--batch-size`` of windows below 2 or above the distinct training windows,
    ``sequences * (length - window + 1)`` (every start of a window in every training sequence;
    :func:`~rpm.experiments.common.check_batch_size`).

    :param int batch_size: windows per step.
    :param int sequences: training sequences.
    :param int length: frames per sequence, >= ``window``.
    :param int window: frames per window.
    :raises ConfigurationError: one line.
    """
    starts = length - window + 1
    check_batch_size(batch_size, sequences * starts, "windows",
                     what=f"{sequences} training sequences x {starts} starts of a --window "
                     f"{window} in {length} frames")
