"""The digits split: values against scikit-learn's raw array, stratification, a fixed split."""

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from rpm.data.digits import NUM_CLASSES, load_digits_split


def test_images_are_the_raw_digits_over_16_with_their_labels():
    raw = load_digits()
    split = load_digits_split()
    for part in split:
        assert part.images.shape == (part.labels.shape[0], 1, 8, 8)
        assert part.images.dtype == torch.float32 and part.labels.dtype == torch.int64
        rows = part.indices.numpy()
        np.testing.assert_allclose(part.images[:, 0].double().numpy(), raw.images[rows] / 16.0, rtol=0,
                                   atol=1e-7)
        np.testing.assert_array_equal(part.labels.numpy(), raw.target[rows])
        assert float(part.images.min()) == 0.0 and float(part.images.max()) == 1.0


def test_split_is_disjoint_covers_everything_and_is_stratified():
    train, test = load_digits_split(test_fraction=0.25)
    assert train.labels.shape[0] == 1347 and test.labels.shape[0] == 450
    rows = torch.cat([train.indices, test.indices])
    assert torch.equal(rows.sort().values, torch.arange(1797))
    total = torch.bincount(torch.cat([train.labels, test.labels]), minlength=NUM_CLASSES)
    held_out = torch.bincount(test.labels, minlength=NUM_CLASSES)
    # each class's share of the test part is 0.25 of its images, to within one image
    assert bool(((held_out.double() - 0.25 * total.double()).abs() <= 1.0).all())


def test_split_is_fixed_by_the_seed():
    a, b, c = load_digits_split(seed=3), load_digits_split(seed=3), load_digits_split(seed=4)
    assert torch.equal(a.test.indices, b.test.indices)
    assert not torch.equal(a.test.indices, c.test.indices)
    assert load_digits_split(dtype=torch.float64).train.images.dtype == torch.float64


@pytest.mark.parametrize("kwargs, error, match", [
    ({"test_fraction": 1.0}, ValueError, "test_fraction must lie in"),
    ({"test_fraction": "0.2"}, TypeError, "test_fraction must be a float"),
    ({"seed": -1}, ValueError, "seed must be >= 0"),
    ({"dtype": torch.int64}, TypeError, "dtype must be a floating"),
])
def test_bad_arguments_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        load_digits_split(**kwargs)
