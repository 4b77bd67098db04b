r"""Videos of a swinging pendulum, optionally over moving textured backgrounds (``rpm pendulum``;
the pendulum tasks of RP-GSSM, Hromadka et al. 2025, generated here instead of loaded).

**Dynamics.** The angle :math:`\theta` from the downward vertical and the angular velocity
:math:`\omega` follow the frictionless pendulum

.. math::

    \dot\theta = \omega, \qquad \dot\omega = -\frac{g}{l} \sin\theta,

integrated by the classical fourth-order Runge-Kutta method with ``substeps`` steps per frame
interval ``dt`` (float64). With :math:`g/l = 9.81\,\mathrm{s}^{-2}` and ``dt`` = 0.1 s a small
swing takes about 20 frames. Each sequence starts at :math:`\theta_0 \sim \mathcal{U}(-\pi,
\pi)` and :math:`\omega_0 \sim \mathcal{U}(-2, 2)`: most swing, the most energetic go over the
top. The state read out by the experiment is :math:`(\sin\theta, \cos\theta, \omega)`.

**Frames** (S x S pixels, one channel, S = ``image_size``): a rod from the pivot at the centre
to a bob at distance :math:`l_\mathrm{px}` = 0.36 S, direction :math:`(\sin\theta, \cos\theta)`
in (column, row) coordinates (the row axis points down), drawn with anti-aliased edges: a pixel
at distance d from the bob's centre (radius 0.11 S) or from the rod (half-width 0.04 S) has
intensity :math:`\operatorname{clip}(r + 1/2 - d, 0, 1)`, the larger of the two. Every pixel
then gets independent Gaussian noise of standard deviation ``noise`` (0.05), not clipped.

**Distractors** (``distractors="iid"``, or ``True``): a procedurally generated textured background behind
the pendulum that changes at every frame. Each frame gets ``num_gratings`` sinusoidal gratings
(random orientation, spatial period between 4 and 12 pixels, random phase) and ``num_blobs``
Gaussian blobs (random width and position, wrapping around the frame), drawn afresh; their sum
is scaled to [0, 0.8]. The pendulum is composited over it, :math:`x = a + (1 - a)\, b` with a
the pendulum's intensity and b the background: the pendulum stays the brightest thing where it
is, but edges, stripes and blobs as strong as its own are everywhere else, and they move
between frames. They are drawn independently at every frame on purpose: a background that
moved predictably (a drifting grating is a rotation of its phase, a constant texture a
constant) would be a second dynamical system in the video, which a temporal objective (the
RPM's as RP-GSSM's) is entitled to model; these distractors are clutter that says nothing
about the next frame. ``distractors="moving"`` draws that second dynamical system instead: a
grating that drifts and rotates and a blob that drifts, with per-video speeds
(:mod:`rpm.data.distractors`), composited by the same rule.

References:
    M. Hromadka et al., "Recognition-parametrised Gaussian state-space models" (RP-GSSM), 2025.
    P. Becker, H. Pandya, G. Gebhardt et al., "Recurrent Kalman networks", ICML 2019 (the
    pendulum image task).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from rpm._validation import check_int, check_positive, check_positive_int
from rpm.data.distractors import MovingDistractors, moving_distractors

__all__ = ["DISTRACTORS", "PendulumVideos", "pendulum_background", "render_pendulum", "simulate_pendulum",
           "generate_pendulum"]

#: The kinds of ``distractors``: none, clutter redrawn at every frame, a moving texture.
DISTRACTORS = ("none", "iid", "moving")
#: :math:`g / l` in s^-2.
GRAVITY_OVER_LENGTH = 9.81


class PendulumVideos(NamedTuple):
    r"""Pendulum videos and their states.

    :ivar torch.Tensor frames: (N, T, 1, S, S).
    :ivar torch.Tensor angle: :math:`\theta_t`, (N, T), float64.
    :ivar torch.Tensor velocity: :math:`\omega_t`, (N, T), float64.
    :ivar distractor: the moving distractors and their states (``distractors="moving"``), else
        None.
    """

    frames: torch.Tensor
    angle: torch.Tensor
    velocity: torch.Tensor
    distractor: MovingDistractors | None = None

    @property
    def states(self) -> torch.Tensor:
        r""":math:`(\sin\theta_t, \cos\theta_t, \omega_t)`, (N, T, 3), float64."""
        return torch.stack([self.angle.sin(), self.angle.cos(), self.velocity], dim=-1)


def simulate_pendulum(angle: torch.Tensor, velocity: torch.Tensor, num_steps: int,
                      dt: float = 0.1, substeps: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Integrates :math:`\dot\theta = \omega`, :math:`\dot\omega = -(g/l) \sin\theta` by RK4.

    :param torch.Tensor angle: :math:`\theta_0`, (N,).
    :param torch.Tensor velocity: :math:`\omega_0`, (N,).
    :param int num_steps: T, frames including the first.
    :param float dt: seconds between frames.
    :param int substeps: RK4 steps per frame interval.
    :return: :math:`\theta`, :math:`\omega`, each (N, T), float64.
    """
    check_positive_int("num_steps", num_steps)
    check_positive("dt", dt)
    check_positive_int("substeps", substeps)
    h = dt / substeps

    def rate(theta, omega):
        return omega, -GRAVITY_OVER_LENGTH * torch.sin(theta)

    theta, omega = angle.to(torch.float64), velocity.to(torch.float64)
    angles, velocities = [theta], [omega]
    for _ in range(num_steps - 1):
        for _ in range(substeps):
            k1 = rate(theta, omega)
            k2 = rate(theta + h / 2 * k1[0], omega + h / 2 * k1[1])
            k3 = rate(theta + h / 2 * k2[0], omega + h / 2 * k2[1])
            k4 = rate(theta + h * k3[0], omega + h * k3[1])
            theta = theta + h / 6 * (k1[0] + 2 * k2[0] + 2 * k3[0] + k4[0])
            omega = omega + h / 6 * (k1[1] + 2 * k2[1] + 2 * k3[1] + k4[1])
        angles.append(theta)
        velocities.append(omega)
    return torch.stack(angles, -1), torch.stack(velocities, -1)


def _pixel_centres(image_size: int, dtype: torch.dtype = torch.float64
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    centres = torch.arange(image_size, dtype=dtype) + 0.5
    return centres[None, :], centres[:, None]  # column (1, S), row (S, 1)


def render_pendulum(angle: torch.Tensor, image_size: int = 28) -> torch.Tensor:
    r"""The pendulum's intensity :math:`a \in [0, 1]` at every pixel (module docstring).

    :param torch.Tensor angle: :math:`\theta`, any shape B.
    :param int image_size: S.
    :return: ``(*B, S, S)``, float32 (sub-pixel geometry needs no more).
    """
    check_positive_int("image_size", image_size)
    column, row = _pixel_centres(image_size, torch.float32)
    pivot = image_size / 2
    length, bob, half_width = 0.36 * image_size, 0.11 * image_size, 0.04 * image_size
    theta = angle.to(torch.float32)[..., None, None]
    ux, uy = theta.sin(), theta.cos()  # rod direction in (column, row)
    dx, dy = column - pivot, row - pivot
    along = (dx * ux + dy * uy).clamp(0.0, length)  # projection onto the rod, clipped
    rod = torch.hypot(dx - along * ux, dy - along * uy)
    ball = torch.hypot(dx - length * ux, dy - length * uy)
    intensity = torch.maximum((half_width + 0.5 - rod).clamp(0, 1), (bob + 0.5 - ball).clamp(0, 1))
    return intensity


def pendulum_background(num_sequences: int, num_steps: int, image_size: int,
                        generator: torch.Generator, num_gratings: int = 3,
                        num_blobs: int = 3) -> torch.Tensor:
    """Procedural textures drawn afresh at every frame (module docstring), in [0, 0.8].

    :return: (N, T, S, S), float32.
    """
    column, row = _pixel_centres(image_size, torch.float32)
    shape = (num_sequences, num_steps, 1, 1)

    def uniform(low, high):
        return low + (high - low) * torch.rand(*shape, generator=generator, dtype=torch.float64
                                               ).to(torch.float32)

    image = torch.zeros(num_sequences, num_steps, image_size, image_size)
    for _ in range(num_gratings):
        direction = uniform(0, math.pi)
        frequency = 2 * math.pi / uniform(4.0, 12.0)
        image += uniform(0.3, 1.0) * torch.sin(
            frequency * (column * direction.cos() + row * direction.sin()) + uniform(0, 2 * math.pi))
    half = image_size / 2
    for _ in range(num_blobs):
        x, y, width = uniform(0, image_size), uniform(0, image_size), uniform(1.5, 4.0)
        gap_x = (column - x + half) % image_size - half
        gap_y = (row - y + half) % image_size - half
        image += 2.0 * torch.exp(-(gap_x ** 2 + gap_y ** 2) / (2 * width ** 2))
    low = image.amin(dim=(-1, -2), keepdim=True)
    high = image.amax(dim=(-1, -2), keepdim=True)
    return 0.8 * (image - low) / (high - low)


def generate_pendulum(num_sequences: int, num_steps: int = 100, image_size: int = 28,
                      noise: float = 0.05, distractors: bool | str = False, dt: float = 0.1,
                      seed: int = 0, dtype: torch.dtype = torch.float32) -> PendulumVideos:
    """``num_sequences`` pendulum videos (module docstring), reproducible from ``seed``.

    :param int num_sequences: N.
    :param int num_steps: T, frames per video.
    :param int image_size: S.
    :param float noise: standard deviation of the pixel noise, >= 0.
    :param distractors: the background (module docstring): ``"none"`` (or False), ``"iid"``
        (or True: redrawn at every frame) or ``"moving"`` (:mod:`rpm.data.distractors`).
    :param float dt: seconds between frames.
    :param int seed: the seed of the initial states, backgrounds and noise.
    :param torch.dtype dtype: of the frames (computed in float32).
    """
    check_positive_int("num_sequences", num_sequences)
    check_int("image_size", image_size, minimum=8)
    kind = {False: "none", True: "iid"}.get(distractors, distractors)
    if kind not in DISTRACTORS:
        raise ValueError(f"distractors must be one of {', '.join(DISTRACTORS)} (or a bool), "
                         f"got {distractors!r}")
    if not 0.0 <= noise < float("inf"):
        raise ValueError(f"noise must be a finite standard deviation >= 0, got {noise!r}")
    generator = torch.Generator().manual_seed(seed)
    angle0 = (2 * torch.rand(num_sequences, generator=generator, dtype=torch.float64) - 1) * math.pi
    velocity0 = (2 * torch.rand(num_sequences, generator=generator, dtype=torch.float64) - 1) * 2.0
    angle, velocity = simulate_pendulum(angle0, velocity0, num_steps, dt)
    frames = render_pendulum(angle, image_size)  # (N, T, S, S)
    moving = None
    if kind == "iid":
        background = pendulum_background(num_sequences, num_steps, image_size, generator)
        frames = frames + (1 - frames) * background
    elif kind == "moving":
        moving = moving_distractors(num_sequences, num_steps, image_size, generator)
        frames = frames + (1 - frames) * moving.images
    frames = frames + noise * torch.randn(frames.shape, generator=generator)
    return PendulumVideos(frames.unsqueeze(2).to(dtype), angle, velocity, moving)
