"""Tests of the bouncing-balls video generator (Appendix D of Aitchison & Ganev)."""

import math

import numpy as np
import pytest
import scipy.stats
import torch

from rpm.data.bouncing_balls import BouncingBalls, generate_bouncing_balls, render_balls

SIZE, DIAMETER = 32, 5.0


@pytest.fixture(scope="module")
def video() -> BouncingBalls:
    return generate_bouncing_balls(num_frames=600, image_size=SIZE, ball_diameter=DIAMETER,
                                   num_balls=3, angle_noise=math.pi / 4, seed=1,
                                   dtype=torch.float64)


def test_shapes_dtypes_and_range(video):
    frames, centres = video  # unpacks as a tuple
    assert frames.shape == (600, 3, SIZE, SIZE)
    assert centres.shape == (600, 3, 2)
    assert frames.dtype == centres.dtype == torch.float64
    assert frames.min() >= 0.0 and frames.max() <= 1.0
    assert frames.max() == 1.0  # every ball has a fully covered interior
    default = generate_bouncing_balls(num_frames=5)
    assert default.frames.dtype == default.centres.dtype == torch.float32
    assert default.frames.shape == (5, 3, 32, 32)


def test_balls_stay_inside_the_box(video):
    radius = DIAMETER / 2
    assert video.centres.min() >= radius
    assert video.centres.max() <= SIZE - radius


def test_no_two_balls_overlap_in_any_frame(video):
    centres = video.centres.numpy()
    for i in range(3):
        for j in range(i + 1, 3):
            gaps = np.linalg.norm(centres[:, i] - centres[:, j], axis=-1)
            assert gaps.min() >= DIAMETER - 1e-9


def test_every_step_is_one_diameter(video):
    steps = (video.centres[1:] - video.centres[:-1]).norm(dim=-1)  # (T-1, K)
    torch.testing.assert_close(steps, torch.full_like(steps, DIAMETER), rtol=0, atol=1e-9)


def _turns(centres: np.ndarray) -> np.ndarray:
    """Signed change of direction between consecutive steps. Shape: (T-2, K)."""
    steps = np.diff(centres, axis=0)  # (T-1, K, 2)
    angles = np.arctan2(steps[..., 1], steps[..., 0])  # (T-1, K)
    return np.angle(np.exp(1j * np.diff(angles, axis=0)))  # wrapped to (-pi, pi]


def _free_moves(centres: np.ndarray, diameter: float, size: float) -> np.ndarray:
    """Moves t -> t+1 (t >= 1) whose whole circle of candidate positions was valid: the ball is
    at least 1.5 d from the walls' limits of the centre and 2 d from every other ball's centre
    at t+1, so the first draw cannot collide and the turn must be plain noise.
    Shape: (T-2, K) boolean."""
    old = centres[1:-1]  # (T-2, K, 2)
    new = centres[2:]
    radius = diameter / 2
    inside = np.all((old >= radius + diameter) & (old <= size - radius - diameter), axis=-1)
    num_balls = centres.shape[1]
    far = np.ones_like(inside)
    for k in range(num_balls):
        for j in range(num_balls):
            if j != k:
                far[:, k] &= np.linalg.norm(old[:, k] - new[:, j], axis=-1) >= 2 * diameter
    return inside & far


def test_free_turns_are_uniform_on_the_noise_range():
    noise = 0.5
    video = generate_bouncing_balls(num_frames=1500, image_size=40, ball_diameter=2.0,
                                    angle_noise=noise, seed=7, dtype=torch.float64)
    centres = video.centres.numpy()
    turns = _turns(centres)
    free = _free_moves(centres, 2.0, 40)
    assert free.sum() > 1000
    assert np.abs(turns[free]).max() <= noise + 1e-9
    # uniform on [-a, a]: Kolmogorov-Smirnov at a strict level (a true null fails 1 in 1e4)
    assert scipy.stats.kstest(turns[free], scipy.stats.uniform(-noise, 2 * noise).cdf).pvalue > 1e-4
    # collisions (bounces) are resolved by a doubled range: some turns exceed the first one
    assert np.abs(turns).max() > noise


def test_seed_determines_the_video():
    a = generate_bouncing_balls(num_frames=50, seed=3)
    b = generate_bouncing_balls(num_frames=50, seed=3)
    c = generate_bouncing_balls(num_frames=50, seed=4)
    assert torch.equal(a.frames, b.frames) and torch.equal(a.centres, b.centres)
    assert not torch.allclose(a.centres, c.centres)


def test_rendered_centroid_of_each_channel_is_the_true_centre(video):
    frames, centres = video
    mass = frames.sum(dim=(-2, -1))  # (T, K)
    grid = torch.arange(SIZE, dtype=torch.float64) + 0.5
    x = (frames.sum(dim=-2) * grid).sum(-1) / mass  # (T, K)
    y = (frames.sum(dim=-1) * grid).sum(-1) / mass
    centroid = torch.stack((x, y), dim=-1)
    # the one-pixel linear ramp is symmetric about the centre up to the pixel grid: the
    # discretisation error is below 0.04 px for these sizes
    torch.testing.assert_close(centroid, centres, rtol=0, atol=0.06)
    # the total intensity approximates the disc area pi d^2 / 4 (the ramp is a coverage estimate)
    area = math.pi * DIAMETER**2 / 4
    torch.testing.assert_close(mass, torch.full_like(mass, area), rtol=0.05, atol=0)


def test_render_matches_a_pixel_loop():
    centres = torch.tensor([[[3.3, 4.1], [7.0, 2.5]]], dtype=torch.float64)  # (1, 2, 2)
    size, diameter = 9, 3.4
    frames = render_balls(centres, size, diameter)
    expected = torch.zeros(1, 2, size, size, dtype=torch.float64)
    for k in range(2):
        cx, cy = centres[0, k].tolist()
        for i in range(size):
            for j in range(size):
                distance = math.hypot(j + 0.5 - cx, i + 0.5 - cy)
                expected[0, k, i, j] = min(1.0, max(0.0, diameter / 2 + 0.5 - distance))
    torch.testing.assert_close(frames, expected)
    grey = render_balls(centres, size, diameter, per_ball_channels=False)
    torch.testing.assert_close(grey, expected.sum(1, keepdim=True).clamp(max=1.0))


def test_grey_video_is_the_clipped_sum_of_the_colour_video():
    colour = generate_bouncing_balls(num_frames=20, seed=5)
    grey = generate_bouncing_balls(num_frames=20, seed=5, per_ball_channels=False)
    assert grey.frames.shape == (20, 1, 32, 32)
    torch.testing.assert_close(grey.centres, colour.centres)
    torch.testing.assert_close(grey.frames, colour.frames.sum(1, keepdim=True).clamp(max=1.0))


def test_default_settings_work_for_many_seeds():
    for seed in range(10):
        video = generate_bouncing_balls(num_frames=900, seed=seed)
        assert video.frames.shape[0] == 900


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"angle_noise": 0.0}, ValueError, "angle_noise"),
        ({"angle_noise": 4.0}, ValueError, "angle_noise"),
        ({"ball_diameter": 32.0}, ValueError, "ball_diameter"),
        ({"ball_diameter": -1.0}, ValueError, "ball_diameter"),
        ({"num_frames": 0}, ValueError, "num_frames"),
        ({"num_frames": 10.0}, TypeError, "num_frames"),
        ({"num_balls": True}, TypeError, "num_balls"),
        ({"dtype": torch.int64}, TypeError, "dtype"),
    ],
)
def test_bad_arguments_are_rejected(kwargs, error, match):
    with pytest.raises(error, match=match):
        generate_bouncing_balls(num_frames=kwargs.pop("num_frames", 3), **kwargs)


def test_impossible_settings_raise_a_clear_error():
    # two balls of diameter 5 do not fit side by side in a 6 px box
    with pytest.raises(RuntimeError, match="could not place"):
        generate_bouncing_balls(num_frames=2, image_size=6, num_balls=2, max_tries=20)
    # in an 8 px box a ball's centre lives in [2.5, 5.5]^2, whose diagonal 3 sqrt(2) < 5: no
    # step of one diameter stays inside, so no valid move exists
    with pytest.raises(RuntimeError, match="no valid move"):
        generate_bouncing_balls(num_frames=2, image_size=8, num_balls=1, max_tries=5)
