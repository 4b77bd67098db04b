r"""Moving distractors: a background that is a second, predictable dynamical system behind the
pendulum of :mod:`rpm.data.pendulum` (``distractors="moving"``).

Each video gets one sinusoidal grating and one Gaussian blob, whose parameters are drawn once
per video and whose state advances by a per-video speed at every frame:

* the grating (spatial period :math:`p \sim \mathcal{U}(4, 12)` pixels) **drifts** across its
  stripes, its phase :math:`\varphi_t = \varphi_0 + u\,t \bmod 2\pi` with
  :math:`|u| \sim \mathcal{U}(0.2, 0.8)` rad per frame, and **rotates** about the frame's
  centre, its orientation :math:`\alpha_t = \alpha_0 + r\,t \bmod \pi` with
  :math:`|r| \sim \mathcal{U}(0.02, 0.1)` rad per frame (random signs);
* the blob (standard deviation :math:`w \sim \mathcal{U}(2, 4)` pixels) **drifts** on the torus,
  its centre :math:`c_t = c_0 + v\,t \bmod S` with :math:`|v| \sim \mathcal{U}(0.5, 1.5)`
  pixels per frame in a uniformly random direction.

With :math:`(x, y)` a pixel centre's (column, row) and :math:`(x', y')` the same measured from
the frame's centre, the background is

.. math::

    b_t(x, y) = 0.2\,\bigl(1 + \sin(2\pi (x' \cos\alpha_t + y' \sin\alpha_t) / p
    + \varphi_t)\bigr) + 0.4\,\exp\bigl(-\lVert (x, y) - c_t \rVert_S^2 / 2 w^2\bigr),

in [0, 0.8], with :math:`\lVert\cdot\rVert_S` the distance on the torus of side S (the blob
wraps around the frame's edges). The composite with the pendulum is
:mod:`rpm.data.pendulum`'s: :math:`x = a + (1 - a)\,b`.

The distractor's state, read out by ``rpm pendulum`` to see what the latents encode, is the
embedding of these angles on circles (:attr:`MovingDistractors.states`), since every
coordinate wraps.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

__all__ = ["MovingDistractors", "moving_distractors", "render_moving_distractors"]


class MovingDistractors(NamedTuple):
    r"""The moving distractors of N videos of T frames (module docstring).

    :ivar torch.Tensor images: :math:`b_t`, (N, T, S, S), float32, in [0, 0.8].
    :ivar torch.Tensor centre: :math:`c_t` in (column, row) pixels, (N, T, 2), float64, in [0, S).
    :ivar torch.Tensor phase: :math:`\varphi_t`, (N, T), float64, in [0, 2 pi).
    :ivar torch.Tensor orientation: :math:`\alpha_t`, (N, T), float64, in [0, pi).
    :ivar torch.Tensor velocity: :math:`v`, pixels per frame, (N, 2), float64.
    :ivar torch.Tensor phase_speed: :math:`u`, rad per frame, (N,), float64.
    :ivar torch.Tensor rotation_speed: :math:`r`, rad per frame, (N,), float64.
    :ivar torch.Tensor period: :math:`p`, pixels, (N,), float64.
    :ivar torch.Tensor width: :math:`w`, pixels, (N,), float64.
    """

    images: torch.Tensor
    centre: torch.Tensor
    phase: torch.Tensor
    orientation: torch.Tensor
    velocity: torch.Tensor
    phase_speed: torch.Tensor
    rotation_speed: torch.Tensor
    period: torch.Tensor
    width: torch.Tensor

    @property
    def states(self) -> torch.Tensor:
        r"""The state on circles: :math:`\cos, \sin` of :math:`2\pi c_t / S` (column, row),
        of :math:`\varphi_t` and of :math:`2\alpha_t`; (N, T, 8), float64."""
        size = self.images.shape[-1]
        angles = torch.stack([2 * math.pi * self.centre[..., 0] / size,
                              2 * math.pi * self.centre[..., 1] / size,
                              self.phase, 2 * self.orientation], dim=-1)  # (N, T, 4)
        return torch.cat([angles.cos(), angles.sin()], dim=-1)


def render_moving_distractors(centre: torch.Tensor, phase: torch.Tensor,
                              orientation: torch.Tensor, period: torch.Tensor,
                              width: torch.Tensor, image_size: int) -> torch.Tensor:
    r""":math:`b_t` of the module docstring for the given states.

    :param torch.Tensor centre: ``(*B, 2)``, (column, row) pixels.
    :param torch.Tensor phase: ``(*B,)``.
    :param torch.Tensor orientation: ``(*B,)``.
    :param torch.Tensor period: ``(*B,)``, pixels.
    :param torch.Tensor width: ``(*B,)``, pixels.
    :param int image_size: S.
    :return: ``(*B, S, S)``, float32, in [0, 0.8].
    """
    centres = torch.arange(image_size, dtype=torch.float64) + 0.5
    x, y = centres[None, :], centres[:, None]  # column (1, S), row (S, 1)
    half = image_size / 2

    def pixel(value):  # (*B,) -> (*B, 1, 1)
        return value.to(torch.float64)[..., None, None]

    along = (x - half) * pixel(orientation).cos() + (y - half) * pixel(orientation).sin()
    grating = 0.2 * (1 + torch.sin(2 * math.pi * along / pixel(period) + pixel(phase)))
    gap_x = (x - pixel(centre[..., 0]) + half) % image_size - half  # on the torus
    gap_y = (y - pixel(centre[..., 1]) + half) % image_size - half
    blob = 0.4 * torch.exp(-(gap_x ** 2 + gap_y ** 2) / (2 * pixel(width) ** 2))
    return (grating + blob).to(torch.float32)


def moving_distractors(num_sequences: int, num_steps: int, image_size: int,
                       generator: torch.Generator) -> MovingDistractors:
    """Draws each video's distractor and moves it for ``num_steps`` frames (module docstring).

    :param int num_sequences: N.
    :param int num_steps: T.
    :param int image_size: S.
    :param torch.Generator generator: the source of every random draw.
    """

    def uniform(low, high, *shape):
        return low + (high - low) * torch.rand(num_sequences, *shape, generator=generator,
                                               dtype=torch.float64)

    def sign():
        return 2.0 * (torch.rand(num_sequences, generator=generator) < 0.5).to(torch.float64) - 1

    period, width = uniform(4.0, 12.0), uniform(2.0, 4.0)
    centre0, phase0, orientation0 = (uniform(0, image_size, 2), uniform(0, 2 * math.pi),
                                     uniform(0, math.pi))
    direction = uniform(0, 2 * math.pi)
    velocity = uniform(0.5, 1.5)[:, None] * torch.stack([direction.cos(), direction.sin()], -1)
    phase_speed = sign() * uniform(0.2, 0.8)
    rotation_speed = sign() * uniform(0.02, 0.1)
    t = torch.arange(num_steps, dtype=torch.float64)  # (T,)
    centre = (centre0[:, None] + velocity[:, None] * t[:, None]) % image_size  # (N, T, 2)
    phase = (phase0[:, None] + phase_speed[:, None] * t) % (2 * math.pi)  # (N, T)
    orientation = (orientation0[:, None] + rotation_speed[:, None] * t) % math.pi  # (N, T)
    images = render_moving_distractors(centre, phase, orientation, period[:, None].expand_as(phase),
                                       width[:, None].expand_as(phase), image_size)
    return MovingDistractors(images, centre, phase, orientation, velocity, phase_speed,
                             rotation_speed, period, width)
