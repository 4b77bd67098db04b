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

  a circular shift of at most 10 positions, a constant offset and a linear slope.
* ``digits``: scikit-learn's 8 x 8 digits with the fixed split of
  :func:`rpm.data.digits.load_digits_split` (1,347 training and 450 test images, nothing
  downloaded) and the views of ``rpm digits``: :class:`rpm.data.augment.RandomView` with its
  defaults (a small affine map and pixel noise).

Every draw comes from a ``torch.Generator`` passed in, so a step's views are a function of the
seed and the step (a resumed row draws the same views).

References:
    S. Greydanus and D. Kobak, "Scaling down deep learning with MNIST-1D", ICML 2024.
"""

from __future__ import annotations

import importlib.util
from typing import NamedTuple

import torch

__all__ = ["DATASETS", "EXTRA", "BenchmarkData", "load_dataset", "missing_packages",
           "mnist1d_views", "view_pair"]

#: The datasets, in the table's order.
DATASETS = ("mnist1d", "digits")
#: The optional packages each dataset needs beyond the ``experiments`` extra (import names).
_PACKAGES = {"mnist1d": ("mnist1d",), "digits": ()}
#: The extra that installs them.
EXTRA = "pip install 'rpm-pyro[benchmark]'"
#: The MNIST-1D notebook's augmentations: largest shift (positions), offset and slope.
MAX_SHIFT, MAX_OFFSET, MAX_SLOPE = 10, 0.3, 0.04


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
