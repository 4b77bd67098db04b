"""Tests of the pendulum videos (rpm.data.pendulum): the integrator against conserved energy and
the small-angle solution, the rendering's geometry, the noise, the distractors."""

import math

import pytest
import torch

from rpm.data.pendulum import (
    GRAVITY_OVER_LENGTH,
    generate_pendulum,
    pendulum_background,
    render_pendulum,
    simulate_pendulum,
)


def test_integrator_conserves_energy_and_matches_the_small_angle_solution():
    angle = torch.tensor([0.01, 1.0, 3.0, 0.5], dtype=torch.float64)
    velocity = torch.tensor([0.0, 0.0, 0.5, 4.0], dtype=torch.float64)
    theta, omega = simulate_pendulum(angle, velocity, 200, dt=0.1, substeps=10)
    assert theta.shape == omega.shape == (4, 200)
    energy = 0.5 * omega ** 2 - GRAVITY_OVER_LENGTH * torch.cos(theta)
    torch.testing.assert_close(energy, energy[:, :1].expand_as(energy), rtol=0, atol=1e-6)
    times = 0.1 * torch.arange(200, dtype=torch.float64)
    # small swings: theta_0 cos(w t), w = sqrt(g/l) (1 - theta_0^2 / 16) to second order in
    # the amplitude (the first correction of the pendulum's period); the next terms are O(1e-8)
    frequency = math.sqrt(GRAVITY_OVER_LENGTH) * (1 - 0.01 ** 2 / 16)
    torch.testing.assert_close(theta[0], 0.01 * torch.cos(frequency * times), rtol=0, atol=1e-7)
    assert (theta[3, 1:] - theta[3, :-1]).abs().max() < 1.0  # a frame is a small move


def test_rendering_draws_the_bob_in_the_direction_of_the_angle():
    size = 28
    for angle in (0.0, math.pi / 2, 2.0, -2.5):
        image = render_pendulum(torch.tensor(angle), size)
        assert image.shape == (size, size) and image.min() == 0.0 and image.max() == 1.0
        rows, columns = torch.meshgrid(torch.arange(size) + 0.5, torch.arange(size) + 0.5,
                                       indexing="ij")
        # the bob's centre, at 0.36 S from the pivot along (sin, cos) in (column, row)
        x = size / 2 + 0.36 * size * math.sin(angle)
        y = size / 2 + 0.36 * size * math.cos(angle)
        near = (columns - x) ** 2 + (rows - y) ** 2 < (0.11 * size - 1) ** 2
        assert torch.all(image[near] == 1.0)
        # the intensity-weighted centre lies on the rod's ray from the pivot
        mass = image.sum()
        cx = (image * columns).sum() / mass - size / 2
        cy = (image * rows).sum() / mass - size / 2
        assert math.atan2(cx, cy) == pytest.approx(angle, abs=0.05)


def test_pixel_noise_has_the_stated_standard_deviation_and_the_seed_reproduces():
    videos = generate_pendulum(6, 30, noise=0.05, seed=1)
    assert videos.frames.shape == (6, 30, 1, 28, 28) and videos.frames.dtype == torch.float32
    clean = render_pendulum(videos.angle, 28)
    residual = videos.frames[:, :, 0].double() - clean.double()
    assert residual.std().item() == pytest.approx(0.05, rel=0.02)
    assert residual.mean().abs().item() < 0.001
    assert torch.equal(generate_pendulum(6, 30, seed=1).frames, videos.frames)
    states = videos.states
    assert states.shape == (6, 30, 3)
    torch.testing.assert_close(states[..., 0] ** 2 + states[..., 1] ** 2,
                               torch.ones(6, 30, dtype=torch.float64))
    assert videos.angle[:, 0].abs().max() <= math.pi and videos.velocity[:, 0].abs().max() <= 2


def test_distractors_change_every_frame_unpredictably_and_leave_the_pendulum_on_top():
    generator = torch.Generator().manual_seed(0)
    background = pendulum_background(40, 30, 28, generator)
    assert background.shape == (40, 30, 28, 28)
    assert background.min() >= 0.0 and background.max() <= 0.8 + 1e-6
    assert torch.all(background.amax((-1, -2)) > 0.79)  # every frame spans the range
    # drawn afresh at every frame: a pixel's lag-1 correlation over time is about 0
    # (1200 pairs per pixel: standard error about 0.03, averaged over 784 pixels)
    centred = background - background.mean((0, 1))
    lag1 = (centred[:, 1:] * centred[:, :-1]).mean((0, 1)) / centred.var((0, 1))
    assert lag1.mean().abs() < 0.02
    assert centred.var((0, 1)).mean() > 0.01
    videos = generate_pendulum(3, 20, noise=0.0, distractors=True, seed=2)
    clean = render_pendulum(videos.angle, 28)
    frames = videos.frames[:, :, 0]
    assert torch.all(frames[clean == 1.0] == 1.0)  # the pendulum is drawn over the background
    assert frames[clean == 0.0].std() > 0.05  # and the background is everywhere else


@pytest.mark.parametrize("kwargs, message", [
    ({"noise": -1.0}, "noise"),
    ({"image_size": 4}, "image_size"),
    ({"num_sequences": 0}, "num_sequences"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate_pendulum(**{"num_sequences": 2, "num_steps": 5, **kwargs})
