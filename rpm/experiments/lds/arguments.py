"""The command-line arguments that ``rpm lds`` and ``rpm pendulum`` share: the state-space RPM
(prior, marginals, recognition noise) and its training on windows of sequences. Each command
keeps its own defaults and its data arguments; nothing here imports torch."""

from __future__ import annotations

import argparse

from rpm.experiments.common import nonnegative_int, positive_float, positive_int

__all__ = ["add_state_space_model_arguments", "add_window_training_arguments",
           "at_least_two_frames"]


def at_least_two_frames(text: str) -> int:
    """An integer >= 2: a window or a sequence of at least 2 frames (a state-space prior over
    one frame has no dynamics)."""
    value = positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(
            f"expected an integer >= 2 (a window needs at least 2 frames), got {text!r}")
    return value


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
    """Adds the ``training`` group (``--steps``, ``--batch-size``, ``--window``, ``--lr``,
    ``--prior-lr``, ``--eval-every``) with a command's defaults; ``held_out`` names what is
    scored (e.g. "sequences", "videos")."""
    train = parser.add_argument_group("training")
    train.add_argument("--steps", type=positive_int, default=steps,
                       help="optimiser steps; on --resume it may grow to extend a run "
                       f"(default: {steps})")
    train.add_argument("--batch-size", type=positive_int, default=batch_size,
                       help=f"windows per step (default: {batch_size})")
    train.add_argument("--window", type=at_least_two_frames, default=window,
                       help=f"frames per window (default: {window})")
    train.add_argument("--lr", type=positive_float, default=lr,
                       help=f"peak learning rate of the encoder (default: {lr:g})")
    train.add_argument("--prior-lr", type=positive_float, default=prior_lr,
                       help=f"peak learning rate of the prior (default: {prior_lr:g})")
    train.add_argument("--eval-every", type=nonnegative_int, default=eval_every,
                       help=f"score the held-out {held_out} every STEPS steps; 0: at the end only "
                       f"(default: {eval_every})")
