"""Tests of the moving distractors (rpm.data.distractors): their state advances by the per-video
speeds, the images are the documented formula (against a per-pixel loop), the composite keeps
the pendulum on top, and the videos are reproducible from the seed."""

import math

import pytest
import torch

from rpm.data.distractors import moving_distractors
from rpm.data.pendulum import generate_pendulum, render_pendulum


def test_the_state_advances_by_the_per_video_speeds_at_every_frame():
    size = 20
    moving = moving_distractors(5, 40, size, torch.Generator().manual_seed(3))
    centre, phase, orientation = (moving.centre[:, 0].clone(), moving.phase[:, 0].clone(),
                                  moving.orientation[:, 0].clone())
    for t in range(1, 40):  # one frame at a time, wrapping as the docstring says
        centre = (centre + moving.velocity) % size
        phase = (phase + moving.phase_speed) % (2 * math.pi)
        orientation = (orientation + moving.rotation_speed) % math.pi
        torch.testing.assert_close(moving.centre[:, t], centre, rtol=0, atol=1e-9)
        torch.testing.assert_close(moving.phase[:, t], phase, rtol=0, atol=1e-9)
        torch.testing.assert_close(moving.orientation[:, t], orientation, rtol=0, atol=1e-9)
    speed = moving.velocity.norm(dim=-1)
    assert torch.all((speed >= 0.5) & (speed <= 1.5))
    assert torch.all((moving.phase_speed.abs() >= 0.2) & (moving.phase_speed.abs() <= 0.8))
    assert torch.all((moving.rotation_speed.abs() >= 0.02) & (moving.rotation_speed.abs() <= 0.1))
    assert moving.states.shape == (5, 40, 8)
    cos, sin = moving.states[..., :4], moving.states[..., 4:]
    torch.testing.assert_close(cos ** 2 + sin ** 2, torch.ones(5, 40, 4, dtype=torch.float64))


def test_the_images_are_the_documented_formula():
    size = 9
    moving = moving_distractors(2, 3, size, torch.Generator().manual_seed(0))
    for n in range(2):
        for t in range(3):
            alpha, phi = moving.orientation[n, t].item(), moving.phase[n, t].item()
            cx, cy = moving.centre[n, t].tolist()
            period, width = moving.period[n].item(), moving.width[n].item()
            for row in range(size):
                for column in range(size):
                    x, y = column + 0.5, row + 0.5
                    along = (x - size / 2) * math.cos(alpha) + (y - size / 2) * math.sin(alpha)
                    # the nearest copy of the centre on the torus
                    dx = min(abs(x - cx), size - abs(x - cx))
                    dy = min(abs(y - cy), size - abs(y - cy))
                    value = (0.2 * (1 + math.sin(2 * math.pi * along / period + phi))
                             + 0.4 * math.exp(-(dx ** 2 + dy ** 2) / (2 * width ** 2)))
                    assert moving.images[n, t, row, column].item() == pytest.approx(value,
                                                                                  abs=1e-6)
    assert moving.images.min() >= 0.0 and moving.images.max() <= 0.8


def test_moving_frames_keep_the_pendulum_on_top_within_the_unit_interval():
    videos = generate_pendulum(4, 25, noise=0.0, distractors="moving", seed=1)
    frames, clean = videos.frames[:, :, 0], render_pendulum(videos.angle, 28)
    assert frames.min() >= 0.0 and frames.max() <= 1.0
    background = videos.distractor.images
    # x = a + (1 - a) b: the pendulum's own pixels stay at 1, the rest show the background
    assert torch.all(frames[clean == 1.0] == 1.0)
    torch.testing.assert_close(frames[clean == 0.0], background[clean == 0.0])
    # the background moves between frames (not a constant)
    assert (background[:, 1:] - background[:, :-1]).abs().mean() > 0.02


def test_moving_distractors_are_reproducible_from_the_seed_and_leave_the_old_kinds_alone():
    a = generate_pendulum(3, 10, distractors="moving", seed=5)
    b = generate_pendulum(3, 10, distractors="moving", seed=5)
    torch.testing.assert_close(a.frames, b.frames, rtol=0, atol=0)
    assert not torch.equal(a.frames, generate_pendulum(3, 10, distractors="moving",
                                                       seed=6).frames)
    torch.testing.assert_close(generate_pendulum(3, 10, distractors=True, seed=5).frames,
                               generate_pendulum(3, 10, distractors="iid", seed=5).frames)
    torch.testing.assert_close(generate_pendulum(3, 10, distractors=False, seed=5).frames,
                               generate_pendulum(3, 10, distractors="none", seed=5).frames)
    assert generate_pendulum(3, 10, distractors="iid", seed=5).distractor is None


def test_an_unknown_kind_of_distractors_is_named():
    with pytest.raises(ValueError, match="distractors must be one of none, iid, moving"):
        generate_pendulum(2, 5, distractors="waving")
