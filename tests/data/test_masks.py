"""The mask video: its steps follow the truncated generalized normal exactly (probability
integral transform against scipy.stats.gennorm, Kolmogorov-Smirnov), a gennorm fit recovers the
chosen shape, the rendered masks against a float64 loop, pairs and windows, bad input."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from rpm.data.masks import MaskVideo, render_masks


@pytest.fixture(scope="module")
def video():
    return MaskVideo(num_videos=60, num_frames=60, num_objects=2, shape=0.5, scale=0.02,
                     image_size=16, seed=1)


def test_steps_are_the_truncated_generalized_normal(video):
    """u = (F(step) - F(low)) / (F(high) - F(low)) is uniform for steps of the box-truncated
    law, F the gennorm CDF, [low, high] = [-1 - u_t, 1 - u_t]."""
    start = video.factors[:, :-1].reshape(-1).numpy()
    step = (video.factors[:, 1:] - video.factors[:, :-1]).reshape(-1).numpy()
    law = stats.gennorm(0.5, scale=0.02)
    low, high = law.cdf(-1 - start), law.cdf(1 - start)
    uniform = (law.cdf(step) - low) / (high - low)
    assert stats.kstest(uniform, "uniform").pvalue > 1e-3


def test_fitted_shape_matches_the_chosen_shape():
    """A gennorm fit (location 0) of each factor's steps at delta_t = 1 is within 10% of the
    chosen shape (the truncation to the box thins the tails: the fit is a little above it);
    steps three frames apart are sums of three steps, markedly less sparse."""
    video = MaskVideo(num_videos=100, num_frames=100, num_objects=1, shape=0.6, scale=0.02,
                      image_size=8, seed=2)
    for delta_t, (low, high) in {1: (0.6, 0.66), 3: (0.85, 1.5)}.items():
        steps = (video.factors[:, delta_t:] - video.factors[:, :-delta_t]).reshape(-1, video.dim)
        for d in range(video.dim):
            shape, _, _ = stats.gennorm.fit(steps[:, d].numpy(), floc=0)
            assert low <= shape <= high, (delta_t, d, shape)


def test_render_matches_a_float64_loop():
    torch.manual_seed(0)
    factors = torch.rand(3, 12, dtype=torch.float64) * 2 - 1
    frames = render_masks(factors, 20)
    assert frames.shape == (3, 1, 20, 20)
    for b in range(3):
        expected = np.zeros((20, 20), dtype=bool)
        for k, q in enumerate((2.0, 1.0, 6.0)):
            x, y, area, aspect = factors[b, 4 * k:4 * k + 4].tolist()
            radius = math.sqrt((0.06 + 0.04 * area) / math.pi)
            rx, ry = radius * math.exp(-0.4 * aspect), radius * math.exp(0.4 * aspect)
            for i in range(20):
                for j in range(20):
                    px, py = (j + 0.5) / 20, (i + 0.5) / 20
                    if (abs((px - 0.5 - 0.3 * x) / rx) ** q
                            + abs((py - 0.5 - 0.3 * y) / ry) ** q) <= 1:
                        expected[i, j] = True
        assert np.array_equal(frames[b, 0].numpy().astype(bool), expected)


def test_pairs_and_windows(video):
    first_video, first_frame = video.pairs(3)
    assert len(first_video) == 60 * 57 and int(first_frame.max()) == 56
    windows = video.windows(4, delta_t=2)
    assert windows.shape == (60 * (60 - 6), 4)
    assert torch.equal(windows[:, 1:] - windows[:, :-1], torch.full((len(windows), 3), 2))
    flat = video.factors.reshape(-1, video.dim)
    assert torch.equal(flat[windows[61, 0]], video.factors[1, 7])  # window 61: video 1, start 7


@pytest.mark.parametrize("kwargs, match", [
    ({"num_objects": 4}, "num_objects must be 1 to 3"),
    ({"num_frames": 1}, "num_frames must be >= 2"),
    ({"shape": 0.0}, "shape"),
])
def test_bad_configuration_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MaskVideo(**{"num_videos": 2, "num_frames": 5, "image_size": 4, **kwargs})


def test_bad_delta_t_and_factors_raise(video):
    with pytest.raises(ValueError, match="delta_t must be 1 to 59"):
        video.pairs(60)
    with pytest.raises(ValueError, match="4 K entries"):
        render_masks(torch.zeros(2, 5), 8)
