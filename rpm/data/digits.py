r"""The 8x8 handwritten digits that scikit-learn ships (``sklearn.datasets.load_digits``).

1797 grey images of the digits 0-9 (about 180 per class), 8 x 8 pixels with integer intensities
0..16, bundled inside scikit-learn: nothing is downloaded. :func:`load_digits_split` returns them
as float tensors in :math:`[0, 1]` (intensity / 16) of shape ``(N, 1, 8, 8)``, with integer labels,
split once into a training and a test part that is *stratified* (each class keeps its share of
the data in both parts, to within one image) and *fixed* by ``seed`` (the same seed gives the
same split on every machine: the permutation is scikit-learn's ``train_test_split`` with
``random_state=seed``).

References:
    E. Alpaydin and C. Kaynak, "Optical recognition of handwritten digits", UCI Machine Learning
    Repository (1998): the test part of that set is what scikit-learn ships.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from rpm._validation import check_int

__all__ = ["Digits", "DigitsSplit", "NUM_CLASSES", "load_digits_split"]

#: Number of classes (the digits 0-9).
NUM_CLASSES = 10
#: The largest raw intensity of scikit-learn's digits (4 x 4 blocks of 32 x 32 bitmaps counted).
_MAX_INTENSITY = 16.0


class Digits(NamedTuple):
    """Images and labels of one part of the split (unpacks as ``images, labels, indices``).

    :ivar torch.Tensor images: intensities in ``[0, 1]``. Shape: (N, 1, 8, 8).
    :ivar torch.Tensor labels: the digit shown, int64 in ``0..9``. Shape: (N,).
    :ivar torch.Tensor indices: each image's row in ``sklearn.datasets.load_digits()``, int64.
        Shape: (N,).
    """

    images: torch.Tensor
    labels: torch.Tensor
    indices: torch.Tensor


class DigitsSplit(NamedTuple):
    """The fixed stratified split (unpacks as ``train, test``)."""

    train: Digits
    test: Digits


def load_digits_split(test_fraction: float = 0.25, seed: int = 0,
                      dtype: torch.dtype = torch.float32) -> DigitsSplit:
    r"""scikit-learn's bundled digits as tensors, split into a stratified training and test part.

    Intensities are divided by 16, the largest raw value, so that every pixel lies in
    :math:`[0, 1]`. The split is ``sklearn.model_selection.train_test_split(...,
    stratify=labels, random_state=seed)``: every class keeps its share of the data in both parts
    and the same ``seed`` gives the same split everywhere.

    :param float test_fraction: share of the images held out for testing, in (0, 1); the
        default 0.25 gives 1347 training and 450 test images.
    :param int seed: seed of the split (not of any training).
    :param torch.dtype dtype: floating dtype of the images.
    :returns: the two parts, each on the CPU.
    :rtype: DigitsSplit
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)):
        raise TypeError(f"test_fraction must be a float in (0, 1), got {type(test_fraction).__name__} "
                        f"{test_fraction!r}")
    if not 0.0 < float(test_fraction) < 1.0:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction!r}")
    seed = check_int("seed", seed, minimum=0, maximum=2**32 - 1)
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating torch.dtype (e.g. torch.float32), got {dtype!r}")

    bunch = load_digits()
    images = np.asarray(bunch.images, dtype=np.float64) / _MAX_INTENSITY  # (1797, 8, 8)
    labels = np.asarray(bunch.target, dtype=np.int64)  # (1797,)
    rows = np.arange(labels.shape[0])
    train_rows, test_rows = train_test_split(rows, test_size=float(test_fraction), stratify=labels,
                                             random_state=seed)

    def part(r: np.ndarray) -> Digits:
        r = np.sort(r)
        return Digits(torch.as_tensor(images[r], dtype=dtype).unsqueeze(1),  # (n, 1, 8, 8)
                      torch.as_tensor(labels[r]), torch.as_tensor(r, dtype=torch.int64))

    return DigitsSplit(part(train_rows), part(test_rows))
