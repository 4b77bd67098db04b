r"""Sequences given as arrays (``rpm lds --data``, ``rpm pendulum --data`` and their ``fit``
functions): the checks and the split into training and held-out sequences.

The arrays: ``observations`` (N, T, ...), N sequences of T frames; optional ``states`` (N, T, K),
the true state of every frame, used for scoring only; optional ``held_out`` (N,) boolean, the
sequences that are scored and not trained on. Without ``held_out`` the last
:math:`\max(1, \lfloor N / d \rfloor)` sequences are held out when there are states to score
(d = 3 for ``rpm lds`` and 5 for ``rpm pendulum``, the shares of their generated data), and none
without states (there is nothing to score, so every sequence trains).

:class:`SequenceData` holds the sequences with the training ones first, in their order, then the
held-out ones: the scores of :mod:`rpm.experiments.lds.evaluate` take the first ``num_train``
sequences as the training set.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import numpy as np
import torch

from rpm.experiments.data_file import float_array, held_out_split

__all__ = ["SequenceData", "sequence_data"]


class SequenceData(NamedTuple):
    """Checked sequences, the training ones first (module docstring).

    :ivar torch.Tensor observations: (N, T, ...), float32 or float64 as given.
    :ivar states: (N, T, K), float64, or None.
    :ivar int num_train: the training sequences (the first ones), >= 1.
    :ivar torch.Tensor index: (N,), each sequence's row in the arrays given.
    """

    observations: torch.Tensor
    states: torch.Tensor | None
    num_train: int
    index: torch.Tensor


def sequence_data(observations: Any, states: Any = None, held_out: Any = None, *,
                  frame_ndims: Iterable[int], layout: str, window: int, held_out_share: int,
                  min_train_frames: int, dtype=np.float64) -> SequenceData:
    """The checked sequences (module docstring), each problem a one-line :class:`ValueError`
    that names the array and the expected shape: a wrong layout, NaN or infinity, fewer than 2
    (or fewer than ``window``) frames, too few sequences or training frames to score, a
    ``held_out`` that is not boolean of shape (N,), an empty training (or, with states,
    held-out) split.

    :param observations: (N, T, ...) with ``frame_ndims`` axes per frame.
    :param states: (N, T, K) or None.
    :param held_out: (N,) boolean or None.
    :param frame_ndims: the accepted numbers of axes of one frame.
    :param str layout: the expected shape of ``observations`` in words, e.g. ``"(N, T, D)"``.
    :param int window: frames per training window (``--window``).
    :param int held_out_share: d, the default split holds out the last N // d sequences.
    :param int min_train_frames: training frames the scores need (with states).
    :param dtype: NumPy floating dtype of the observations.
    """
    x = float_array("observations", observations, [2 + k for k in frame_ndims], layout, dtype)
    num, length = x.shape[:2]
    if length < 2:
        raise ValueError(f"observations has {length} frame per sequence: a state-space prior "
                         "needs at least 2 (shape (N, T, ...) with T >= 2)")
    if length < window:
        raise ValueError(f"the sequences have {length} frames, fewer than --window {window}: use "
                         f"--window {length} or less")
    s = None
    if states is not None:
        s = float_array("states", states, (3,), "(N, T, K)")
        if s.shape[:2] != (num, length):
            raise ValueError(f"states must have shape (N, T, K) = ({num}, {length}, K) like "
                             f"observations, got shape {tuple(s.shape)}")
    mask = held_out_split(held_out, num, "sequences", share=held_out_share,
                          scored_by=None if s is None else "states")
    train = int((~mask).sum())
    if s is not None:
        if train * length < min_train_frames:
            raise ValueError(f"too few training frames to score ({train} sequences of {length}): "
                             f"the read-out of the states needs at least {min_train_frames}; "
                             "give more or longer sequences")
    index = torch.as_tensor(np.concatenate([np.flatnonzero(~mask), np.flatnonzero(mask)]))
    order = index.numpy()
    return SequenceData(torch.as_tensor(x[order]),
                        None if s is None else torch.as_tensor(s[order]), train, index)
