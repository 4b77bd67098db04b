"""drop_frames: the fraction of dropped frames by Monte Carlo, reproducibility, refusals."""

import pytest
import torch

from rpm.data.missing import drop_frames


def test_each_frame_is_dropped_with_the_given_probability():
    mask = drop_frames((400, 50), 0.25, torch.Generator().manual_seed(0))
    assert mask.dtype == torch.bool and mask.shape == (400, 50)
    # 20000 Bernoulli(0.75) draws: standard error sqrt(0.75 * 0.25 / 20000) = 0.0031
    assert abs(mask.double().mean().item() - 0.75) < 4 * 0.0031
    # independent over frames: the lag-1 correlation of the kept indicators is ~0
    m = mask.double() - mask.double().mean()
    corr = (m[:, 1:] * m[:, :-1]).mean() / m.square().mean()
    assert abs(corr.item()) < 4 / (400 * 49) ** 0.5


def test_reproducible_and_none_dropped_at_zero():
    a = drop_frames((3, 7), 0.5, torch.Generator().manual_seed(1))
    b = drop_frames((3, 7), 0.5, torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    assert drop_frames((3, 7), 0.0).all()


@pytest.mark.parametrize("fraction", [-0.1, 1.0, "0.2", True])
def test_bad_fractions_are_refused(fraction):
    with pytest.raises(ValueError, match=r"fraction must be a number in \[0, 1\)"):
        drop_frames((2, 3), fraction)
