r"""Training and scoring of ``rpm digits`` on any small images: :func:`fit` for arrays (a
notebook), the command's ``--data FILE.npz``, one implementation
(:func:`~rpm.experiments.digits.train.train_method`).

The arrays: ``images`` (N, H, W) or (N, C, H, W), channels first, intensities in [0, 1] (the
augmentations clip to it; ``uint8`` images are divided by 255), H and W at least 4; optional
``labels`` (N,) integer classes, for the scores only; optional ``held_out`` (N,) boolean, the
test images (never trained on). Without ``held_out`` a quarter of the images is the test set,
split stratified by class with ``random_state=0`` (the rule of the bundled digits,
:func:`rpm.data.digits.load_digits_split`) when there are labels, and none without (nothing to
score). With labels, every class needs at least 10 training images (the label-efficiency curve
draws 1, 5 and 10 per class); without labels the scores are skipped and ``scores_skipped`` says
why.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from rpm.data.digits import Digits, DigitsSplit
from rpm.experiments.common import resolve_device, torch_threads
from rpm.experiments.data_file import command_options, float_array, held_out_mask, read_arrays
from rpm.experiments.digits.command import ARRAYS
from rpm.experiments.digits.train import train_method
from rpm.experiments.lds.fitting import run_folder

__all__ = ["ARRAYS", "DigitsFit", "check_arrays", "check_methods", "fit", "load_data"]

#: The share of the images held out by the default split.
TEST_FRACTION = 0.25
#: Training images every class needs (the largest label count of the curve).
MIN_PER_CLASS = 10
#: The smallest side of an image (the local crops of ``multicrop`` are 4 x 4).
MIN_SIDE = 4


class DigitsFit(NamedTuple):
    """Trained methods and their results.

    :ivar dict encoders: method -> the trained :class:`~rpm.experiments.digits.model.DigitsEncoder`,
        in evaluation mode (``encoder.backbone(x)`` is the representation h, ``encoder(x)`` the
        latent z).
    :ivar dict results: method -> the JSON-ready result of
        :func:`~rpm.experiments.digits.train.train_method` (no scores without labels).
    :ivar scores_skipped: why there are no scores, else None.
    """

    encoders: dict
    results: dict
    scores_skipped: str | None


def check_arrays(images: Any, labels: Any, held_out: Any, batch_size: int) -> DigitsSplit:
    """The checked images as a training and a test part (module docstring); every problem is a
    one-line :class:`ValueError` naming the array and what it must be: a wrong layout, NaN or
    infinity, intensities outside [0, 1], images smaller than 4 x 4, labels that are not
    integers of shape (N,), a class with fewer than 10 training images, a ``held_out`` that is
    not boolean of shape (N,), an empty split, fewer training images than ``batch_size``."""
    x = float_array("images", images, (3, 4), "(N, H, W) or (N, C, H, W)", np.float32)
    if x.ndim == 3:
        x = x[:, None]  # (N, 1, H, W)
    num = len(x)
    if min(x.shape[-2:]) < MIN_SIDE:
        raise ValueError(f"the images are {x.shape[-2]} x {x.shape[-1]} pixels: at least "
                         f"{MIN_SIDE} x {MIN_SIDE} are needed (images of shape (N, H, W) or "
                         "(N, C, H, W), channels first)")
    low, high = float(x.min()), float(x.max())
    if low < 0 or high > 1:
        raise ValueError(f"images must hold intensities in [0, 1] (the augmentations clip to "
                         f"it), got values in [{low:g}, {high:g}]; divide by the data's maximum "
                         "(uint8 images are divided by 255)")
    y = None
    if labels is not None:
        y = np.asarray(labels.detach().cpu() if hasattr(labels, "detach") else labels)
        if y.dtype.kind not in "iu" or y.shape != (num,):
            raise ValueError(f"labels must be integer classes of shape ({num},), one per image, got "
                             f"dtype {y.dtype} and shape {tuple(y.shape)}")
    if held_out is not None:
        mask = held_out_mask(held_out, num, "images")
    else:
        mask = np.zeros(num, dtype=bool)
        if y is not None:
            from sklearn.model_selection import train_test_split

            try:
                _, test = train_test_split(np.arange(num), test_size=TEST_FRACTION, stratify=y,
                                           random_state=0)
            except ValueError as err:
                raise ValueError(f"the default split stratifies the labels ({err}); give a "
                                 "held_out array") from None
            mask[test] = True
    train = int((~mask).sum())
    if train == 0:
        raise ValueError(f"held_out marks all {num} images: none is left to train on")
    if train < batch_size:
        raise ValueError(f"{train} training images, fewer than --batch-size {batch_size}: use "
                         f"--batch-size {train} or less")
    if y is not None:
        if train == num:
            raise ValueError("held_out marks no image, but the scores need test images (or "
                             "leave out the labels)")
        classes, counts = np.unique(y[~mask], return_counts=True)
        if len(classes) < 2 or counts.min() < MIN_PER_CLASS:
            raise ValueError(f"the training images need at least 2 classes of at least "
                             f"{MIN_PER_CLASS} images each (the label-efficiency curve draws up "
                             f"to {MIN_PER_CLASS} per class), got {len(classes)} class(es), the "
                             f"smallest with {int(counts.min())}")

    def part(rows: np.ndarray) -> Digits:
        return Digits(torch.as_tensor(x[rows]), None if y is None else torch.as_tensor(y[rows]),
                      torch.as_tensor(rows, dtype=torch.int64))

    return DigitsSplit(part(np.flatnonzero(~mask)), part(np.flatnonzero(mask)))


def check_methods(data: DigitsSplit, methods) -> None:
    """``multicrop`` keeps its global views at the bundled digits' 8 x 8 (no crop, no resize):
    other images are refused with a one-line :class:`ValueError`."""
    side = tuple(data.train.images.shape[-2:])
    if "multicrop" in methods and side != (8, 8):
        raise ValueError(f"the multicrop method's global views are 8 x 8 images, these are "
                         f"{side[0]} x {side[1]}: choose other --methods")


def load_data(path: str, batch_size: int, methods=()) -> DigitsSplit:
    """The checked arrays of ``rpm digits --data path`` (:data:`ARRAYS`, :func:`check_arrays`,
    :func:`check_methods`)."""
    arrays = read_arrays(path, *ARRAYS)
    data = check_arrays(arrays["images"], arrays.get("labels"), arrays.get("held_out"),
                        batch_size)
    check_methods(data, methods)
    return data


def fit(images: Any, labels: Any = None, held_out: Any = None, *, out: str | None = None,
        **options: Any) -> DigitsFit:
    r"""Trains the methods of ``rpm digits`` on ``images`` without labels and scores their
    representations with ``labels`` (module docstring): what ``rpm digits --data FILE`` does
    for one seed, without the run folder's results and figures.

    :param images: (N, H, W) or (N, C, H, W), intensities in [0, 1] (NumPy or torch).
    :param labels: (N,) integer classes, for the scores only; or None.
    :param held_out: (N,) boolean, the test images; default a stratified quarter with labels,
        none without.
    :param out: a folder for the checkpoints and histories (kept); default a temporary one.
    :param options: the flags of ``rpm digits`` by name (``methods``, ``temperature``,
        ``width``, ``latent_dim``, ``steps``, ``batch_size``, ``lr``, ``warmup``,
        ``eval_every``, ``draws``, ``seed``, ``device``, ``threads``, ``progress``,
        ``checkpoint_every``), each with the command's default.
    :raises ValueError: a bad array or option, in one line.
    """
    from rpm.experiments.digits.command import add_parser

    args = command_options(add_parser, "digits", options, exclude=("num_seeds",))
    data = check_arrays(images, labels, held_out, args.batch_size)
    check_methods(data, args.methods)
    encoders, results = {}, {}
    with run_folder(out) as folder, torch_threads(args.threads):
        device = resolve_device(args.device)
        for name in args.methods:
            results[name], encoders[name] = train_method(name, args, data, device, folder / name,
                                                         args.seed)
    return DigitsFit(encoders, results, None if labels is not None else "no labels given")
