r"""The datasets of ``rpm benchmark`` and their augmentations.

* ``mnist1d``: MNIST-1D (Greydanus & Kobak, 2024), generated offline by the ``mnist1d`` package
  (the ``benchmark`` extra): ``mnist1d.data.make_dataset(get_dataset_args())``, 4,000 training
  and 1,000 test sequences of length 40, ten classes. ``make_dataset`` only computes (it never
  downloads: the package's download path is ``get_dataset``, not used here); it reseeds
  Python's and NumPy's global generators, whose states are restored afterwards. The views
  (:func:`mnist1d_views`) follow the MNIST-1D self-supervised notebook's three augmentations:
  for each sequence :math:`x_{0..L-1}` independently,

  .. math::

      x'_t = x_{(t - s) \bmod L} + a + b\,\big(t - \tfrac{L-1}{2}\big),
      \qquad s \sim \mathcal U\{-10, \dots, 10\},\ a \sim \mathcal U(-0.3, 0.3),\
      b \sim \mathcal U(-0.04, 0.04),

  a circular shift of at most 10 positions, a constant offset and a linear slope. A *local*
  view (:func:`mnist1d_local_views`, for the objectives over J views) is a window of such a
  view, :math:`x'_{a}, \dots, x'_{a + w}` with a length fraction :math:`w / L \sim
  \mathcal U` :data:`LOCAL_FRACTION` and a uniform start, stretched back to length L by
  linear interpolation: the 1-D analogue of multi-crop's smaller crops, which the encoder's
  fixed-length input needs back at length L (a shorter input would change h's dimension).
* ``digits``: scikit-learn's 8 x 8 digits with the fixed split of
  :func:`rpm.data.digits.load_digits_split` (1,347 training and 450 test images, nothing
  downloaded) and the views of ``rpm digits``: :class:`rpm.data.augment.RandomView` with its
  defaults (a small affine map and pixel noise); a local view is a 4 x 4 crop of a fifth to a
  half of the area (:func:`rpm.data.augment.multi_crop_views`, ``rpm digits --methods
  multicrop``'s).

Every draw comes from a ``torch.Generator`` passed in, so a step's views are a function of the
seed and the step (a resumed row draws the same views).

References:
    S. Greydanus and D. Kobak, "Scaling down deep learning with MNIST-1D", ICML 2024.
"""

from __future__ import annotations

import importlib.util
from typing import NamedTuple

import torch

__all__ = ["DATASETS", "EXTRA", "LOCAL_FRACTION", "BenchmarkData", "load_dataset",
           "missing_packages", "mnist1d_local_views", "mnist1d_views", "multi_views", "view_pair"]

#: The datasets, in the table's order.
DATASETS = ("mnist1d", "digits")
#: The optional packages each dataset needs beyond the ``experiments`` extra (import names).
_PACKAGES = {"mnist1d": ("mnist1d",), "digits": ()}
#: The extra that installs them.
EXTRA = "pip install 'rpm-pyro[benchmark]'"
#: The MNIST-1D notebook's augmentations: largest shift (positions), offset and slope.
MAX_SHIFT, MAX_OFFSET, MAX_SLOPE = 10, 0.3, 0.04
#: The range of the length fraction of an MNIST-1D local view's window.
LOCAL_FRACTION = (0.5, 0.75)


class BenchmarkData(NamedTuple):
    """One dataset's fixed split: inputs (N, ...) float32 and integer labels (N,)."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor


def missing_packages(datasets) -> list[str]:
    """The packages the ``datasets`` need that are not installed (found without importing
    them)."""
    return sorted({name for dataset in datasets for name in _PACKAGES[dataset]
                   if importlib.util.find_spec(name) is None})


def _mnist1d() -> BenchmarkData:
    import random

    import numpy as np
    from mnist1d.data import get_dataset_args, make_dataset

    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        data = make_dataset(get_dataset_args())
    finally:  # make_dataset seeds the global generators
        random.setstate(python_state)
        np.random.set_state(numpy_state)
    return BenchmarkData(torch.as_tensor(data["x"], dtype=torch.float32),
                         torch.as_tensor(data["y"], dtype=torch.long),
                         torch.as_tensor(data["x_test"], dtype=torch.float32),
                         torch.as_tensor(data["y_test"], dtype=torch.long))


def _digits() -> BenchmarkData:
    from rpm.data.digits import load_digits_split

    split = load_digits_split()
    return BenchmarkData(split.train.images, split.train.labels, split.test.images,
                         split.test.labels)


def load_dataset(name: str) -> BenchmarkData:
    """The split of dataset ``name`` (one of :data:`DATASETS`; module docstring)."""
    if name == "mnist1d":
        return _mnist1d()
    if name == "digits":
        return _digits()
    raise ValueError(f"dataset must be one of {', '.join(DATASETS)}, got {name!r}")


def mnist1d_views(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    r"""One augmented view of each sequence (module docstring): circular shift, offset, slope.

    :param torch.Tensor x: sequences. Shape: (N, L).
    :param torch.Generator generator: a CPU generator; the draws are moved to ``x``'s device.
    :returns: the views. Shape: (N, L).
    """
    n, length = x.shape
    shift = torch.randint(-MAX_SHIFT, MAX_SHIFT + 1, (n, 1), generator=generator)
    offset = (2 * torch.rand(n, 1, generator=generator) - 1) * MAX_OFFSET
    slope = (2 * torch.rand(n, 1, generator=generator) - 1) * MAX_SLOPE
    t = torch.arange(length)
    source = (t[None, :] - shift) % length                                    # (N, L)
    centred = (t - (length - 1) / 2)[None, :]
    return (x.gather(1, source.to(x.device)) + offset.to(x.device)
            + slope.to(x.device) * centred.to(x.device))


def view_pair(dataset: str, x: torch.Tensor, generator: torch.Generator) -> list[torch.Tensor]:
    """Two independent views of each input of ``dataset`` (module docstring).

    :param str dataset: one of :data:`DATASETS`.
    :param torch.Tensor x: inputs, (N, L) or (N, 1, 8, 8).
    :param torch.Generator generator: a CPU generator.
    """
    if dataset == "mnist1d":
        return [mnist1d_views(x, generator), mnist1d_views(x, generator)]
    from rpm.data.augment import MultiViewTransform, RandomView

    return MultiViewTransform([RandomView(), RandomView()])(x, generator)


def mnist1d_local_views(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    r"""One local view of each sequence (module docstring): a window of an augmented view
    (:func:`mnist1d_views`), of length fraction :math:`\phi \sim \mathcal U`
    :data:`LOCAL_FRACTION` and start :math:`a \sim \mathcal U(0, (1 - \phi) L)`, resampled
    to length L by linear interpolation (``torch.nn.functional.grid_sample``: output t is the
    view at the continuous position :math:`a + (t + \tfrac12)\phi`, sample i sitting at
    :math:`i + \tfrac12`, the end samples' values held beyond them).

    :param torch.Tensor x: sequences. Shape: (N, L).
    :param torch.Generator generator: a CPU generator; the draws are moved to ``x``'s device.
    :returns: the views. Shape: (N, L).
    """
    view = mnist1d_views(x, generator)
    n, length = view.shape
    low, high = LOCAL_FRACTION
    fraction = low + (high - low) * torch.rand(n, 1, generator=generator).to(view)  # (N, 1)
    start = (1 - fraction) * length * torch.rand(n, 1, generator=generator).to(view)
    position = start + (torch.arange(length).to(view) + 0.5) * fraction            # (N, L)
    grid_x = 2 * position / length - 1  # grid_sample's coordinates, align_corners=False
    grid = torch.stack([grid_x, torch.zeros_like(grid_x)], dim=-1)[:, None]     # (N, 1, L, 2)
    sampled = torch.nn.functional.grid_sample(
        view[:, None, None, :], grid, mode="bilinear",
        padding_mode="border", align_corners=False)                              # (N, 1, 1, L)
    return sampled[:, 0, 0]


def multi_views(dataset: str, x: torch.Tensor, generator: torch.Generator,
                num_local: int) -> list[torch.Tensor]:
    """Two global views of each input of ``dataset`` then ``num_local`` local ones (module
    docstring); with ``num_local`` 0, :func:`view_pair`.

    :param str dataset: one of :data:`DATASETS`.
    :param torch.Tensor x: inputs, (N, L) or (N, 1, 8, 8).
    :param torch.Generator generator: a CPU generator.
    :param int num_local: the local views, >= 0.
    """
    if num_local == 0:
        return view_pair(dataset, x, generator)
    if dataset == "mnist1d":
        pair = view_pair(dataset, x, generator)
        return pair + [mnist1d_local_views(x, generator) for _ in range(num_local)]
    from rpm.data.augment import multi_crop_views

    return multi_crop_views(2, num_local)(x, generator)
