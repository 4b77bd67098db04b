r"""Bouncing-balls video: the data set of Section 5 and Appendix D of Aitchison & Ganev.

One continuous video of ``num_frames`` frames shows ``num_balls`` balls of diameter :math:`d`
in a square box :math:`[0, S]^2` (pixel units, :math:`S` = ``image_size``). Between consecutive
frames every ball moves by exactly one diameter,

.. math::

    c_{t+1} = c_t + d\,(\cos\theta_{t+1}, \sin\theta_{t+1}),
    \qquad \theta_{t+1} = \theta_t + \epsilon,\quad \epsilon \sim \mathcal{U}[-a, a].

A move is a *collision* when the ball would leave the box (its centre outside
:math:`[d/2, S - d/2]^2`) or overlap another ball (centres closer than :math:`d`). On a
collision the move is resampled with the noise range doubled, :math:`a \to 2a \to 4a \dots`;
once the range reaches :math:`\pi` the direction is drawn uniformly on the circle (at most
``max_tries`` draws). Within a frame the balls move one after another in a random order, each
checked against the walls and the *new* centres of the balls already moved, so no two balls
overlap in any frame. If some ball has no valid move (it is boxed in), the whole frame is
drawn again from the previous frame, at most ``max_tries`` times, after which a
``RuntimeError`` names the frame and the seed. (The paper states only the doubling rule; the
move order and the frame restart are this implementation's choices, and both keep every
invariant above exact.)

Frames are rendered with anti-aliased edges: the intensity of a pixel with centre :math:`p` is
a clipped linear ramp of the signed distance to the ball's edge,

.. math::

    I(p) = \operatorname{clip}\big(d/2 + 1/2 - \lVert p - c \rVert,\ 0,\ 1\big),

which is a one-pixel-wide approximation of the fraction of the pixel covered by the ball.

**One colour channel per ball.** By default ball :math:`k` is drawn in channel :math:`k`
(``C = num_balls``). The evaluation of Section 5 fits a *linear* decoder from the encoder's
outputs to the true positions. With identical balls in one grey channel nothing in a frame
says which ball is ball :math:`k`: the labels live in the hidden trajectories, so the labelled
positions are not a function of the frame (two frames that differ only by swapping two balls
look the same), no decoder, linear or not, can recover them, and :math:`R^2` would be capped
below 1 for every encoder. Distinct colours make the target a function of the frame.
``per_ball_channels=False`` gives the single grey channel (sum of the balls,
clipped to 1) for experiments that do not need that evaluation.

Coordinates are in pixel units: pixel ``[i, j]`` (row ``i``, column ``j``) has centre
:math:`(x, y) = (j + 1/2, i + 1/2)`, and a centre ``(x, y)`` lies in the box
:math:`[0, S]^2`. This matches :class:`rpm.experiments.center_of_mass.CenterOfMass` with
``normalized=False``.

References:
    L. Aitchison and S. Ganev, "InfoNCE is variational inference in a recognition
    parameterised model", Section 5 and Appendix D.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from rpm._validation import check_int, check_positive

__all__ = ["BouncingBalls", "generate_bouncing_balls", "render_balls"]


class BouncingBalls(NamedTuple):
    """A generated video and its ground truth (unpacks as ``frames, centres``).

    :ivar torch.Tensor frames: intensities in ``[0, 1]``. Shape: (T, C, H, W), ``H = W =
        image_size``, ``C = num_balls`` (or 1 with ``per_ball_channels=False``).
    :ivar torch.Tensor centres: true ball centres ``(x, y)`` in pixel units, ball ``k`` drawn
        in channel ``k``. Shape: (T, num_balls, 2).
    """

    frames: torch.Tensor
    centres: torch.Tensor


def render_balls(
    centres: torch.Tensor,
    image_size: int,
    ball_diameter: float,
    per_ball_channels: bool = True,
) -> torch.Tensor:
    r"""Render balls with anti-aliased edges, vectorised over frames, balls and pixels.

    .. math::

        I_{t,k}(p) = \operatorname{clip}\big(d/2 + 1/2 - \lVert p - c_{t,k} \rVert, 0, 1\big),
        \qquad p = (j + 1/2,\ i + 1/2) \text{ for pixel } [i, j].

    :param torch.Tensor centres: ball centres ``(x, y)`` in pixel units. Shape: (T, K, 2).
    :param int image_size: side ``S`` of the square image in pixels.
    :param float ball_diameter: ball diameter ``d`` in pixels.
    :param bool per_ball_channels: draw ball ``k`` in channel ``k`` (``C = K``); if False,
        one grey channel holding the sum of the balls clipped to 1 (``C = 1``).
    :return: frames in ``[0, 1]`` with the dtype of ``centres``. Shape: (T, C, S, S).
    :rtype: torch.Tensor
    """
    if not isinstance(centres, torch.Tensor):
        raise TypeError(f"centres must be a torch.Tensor, got {type(centres).__name__}")
    if centres.dim() != 3 or centres.shape[-1] != 2:
        raise ValueError(
            f"centres must have shape (T, num_balls, 2), got {tuple(centres.shape)}"
        )
    image_size = check_int("image_size", image_size, minimum=1)
    ball_diameter = check_positive("ball_diameter", ball_diameter)
    grid = torch.arange(image_size, dtype=centres.dtype, device=centres.device) + 0.5  # (S,)
    dx = grid.view(1, 1, 1, -1) - centres[..., 0, None, None]  # (T, K, 1, S)
    dy = grid.view(1, 1, -1, 1) - centres[..., 1, None, None]  # (T, K, S, 1)
    distance = torch.sqrt(dx * dx + dy * dy)  # (T, K, S, S)
    frames = (0.5 * ball_diameter + 0.5 - distance).clamp(0.0, 1.0)  # (T, K, S, S)
    if not per_ball_channels:
        frames = frames.sum(dim=1, keepdim=True).clamp(max=1.0)  # (T, 1, S, S)
    return frames


def _is_valid(x: float, y: float, others: list[tuple[float, float]], low: float, high: float,
              diameter: float) -> bool:
    """True when ``(x, y)`` lies in ``[low, high]^2`` and is at least ``diameter`` away from
    every centre in ``others``."""
    if not (low <= x <= high and low <= y <= high):
        return False
    min_sq = diameter * diameter
    return all((x - ox) ** 2 + (y - oy) ** 2 >= min_sq for ox, oy in others)


def _initial_positions(rng: np.random.Generator, num_balls: int, low: float, high: float,
                       diameter: float, max_tries: int) -> list[tuple[float, float]]:
    """Uniform, non-overlapping initial centres by sequential rejection sampling."""
    positions: list[tuple[float, float]] = []
    for k in range(num_balls):
        for _ in range(max_tries):
            x, y = rng.uniform(low, high, size=2).tolist()
            if _is_valid(x, y, positions, low, high, diameter):
                positions.append((x, y))
                break
        else:
            raise RuntimeError(
                f"could not place ball {k} without overlap after {max_tries} tries "
                f"({num_balls} balls of diameter {diameter} in a box of side {high + low}); "
                "use fewer balls, a smaller ball_diameter or a larger image_size"
            )
    return positions


def _move_ball(rng: np.random.Generator, x: float, y: float, direction: float,
               others: list[tuple[float, float]], angle_noise: float, low: float, high: float,
               diameter: float, max_tries: int) -> tuple[float, float, float] | None:
    """One move of one ball by the doubling rule; ``(x, y, direction)`` or None on failure."""
    half_range = angle_noise
    for _ in range(max_tries):
        if half_range >= math.pi:
            theta = rng.uniform(-math.pi, math.pi)
        else:
            theta = direction + rng.uniform(-half_range, half_range)
        new_x, new_y = x + diameter * math.cos(theta), y + diameter * math.sin(theta)
        if _is_valid(new_x, new_y, others, low, high, diameter):
            return new_x, new_y, math.remainder(theta, math.tau)
        half_range *= 2.0
    return None


def generate_bouncing_balls(
    num_frames: int = 900,
    image_size: int = 32,
    ball_diameter: float = 5.0,
    num_balls: int = 3,
    angle_noise: float = math.pi / 4,
    seed: int = 0,
    per_ball_channels: bool = True,
    max_tries: int = 100,
    dtype: torch.dtype = torch.float32,
) -> BouncingBalls:
    r"""Generate one continuous bouncing-balls video (Appendix D of Aitchison & Ganev).

    Every ball moves exactly ``ball_diameter`` pixels per frame in direction
    :math:`\theta_{t+1} = \theta_t + \mathcal{U}[-a, a]`; a move that leaves the box or
    overlaps another ball is resampled with the range doubled (:math:`a, 2a, 4a, \dots`, then
    uniform on the circle once the range reaches :math:`\pi`). Initial centres are uniform and
    non-overlapping, initial directions uniform on the circle. See the module docstring for the
    rendering and for why each ball has its own channel.

    :param int num_frames: number of frames ``T`` (>= 1).
    :param int image_size: side ``S`` of the square box and image in pixels.
    :param float ball_diameter: ball diameter ``d`` in pixels, also the step per frame.
    :param int num_balls: number of balls ``K``.
    :param float angle_noise: half-width ``a`` in radians of the uniform direction noise,
        in ``(0, pi]``.
    :param int seed: seed of the NumPy generator; the same seed gives the same video.
    :param bool per_ball_channels: one channel per ball (default) or one grey channel.
    :param int max_tries: bound on every rejection loop: initial placements per ball, directions
        tried per ball move, and attempts at one frame (see the module docstring).
    :param torch.dtype dtype: floating dtype of ``frames`` and ``centres``.
    :return: ``frames`` of shape (T, C, S, S) in ``[0, 1]`` and ``centres`` of shape
        (T, K, 2) in pixel units (``(x, y)``, pixel ``[i, j]`` centred at ``(j+1/2, i+1/2)``).
    :rtype: BouncingBalls
    :raises RuntimeError: when no valid frame is found in ``max_tries`` attempts (the balls
        are boxed in by the walls and each other); try another seed or fewer/smaller balls.
    """
    num_frames = check_int("num_frames", num_frames, minimum=1)
    image_size = check_int("image_size", image_size, minimum=1)
    num_balls = check_int("num_balls", num_balls, minimum=1)
    max_tries = check_int("max_tries", max_tries, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    ball_diameter = check_positive("ball_diameter", ball_diameter)
    angle_noise = check_positive("angle_noise", angle_noise)
    if angle_noise > math.pi:
        raise ValueError(f"angle_noise must be in (0, pi], got {angle_noise}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    if ball_diameter >= image_size:
        raise ValueError(
            f"ball_diameter must be smaller than image_size, got {ball_diameter} >= {image_size}"
        )

    rng = np.random.default_rng(seed)
    diameter = float(ball_diameter)
    low, high = 0.5 * diameter, image_size - 0.5 * diameter
    positions = _initial_positions(rng, num_balls, low, high, diameter, max_tries)
    directions = rng.uniform(-math.pi, math.pi, size=num_balls).tolist()
    centres = np.empty((num_frames, num_balls, 2))
    centres[0] = positions
    for t in range(1, num_frames):
        for _ in range(max_tries):  # attempts at the whole frame
            new_positions: dict[int, tuple[float, float]] = {}
            new_directions: dict[int, float] = {}
            for k in rng.permutation(num_balls).tolist():
                moved = _move_ball(rng, *positions[k], directions[k],
                                   list(new_positions.values()), angle_noise, low, high,
                                   diameter, max_tries)
                if moved is None:
                    break
                new_positions[k], new_directions[k] = moved[:2], moved[2]
            else:
                positions = [new_positions[k] for k in range(num_balls)]
                directions = [new_directions[k] for k in range(num_balls)]
                break
        else:
            raise RuntimeError(
                f"no valid move of all {num_balls} balls at frame {t} in {max_tries} attempts "
                f"(seed={seed}); the balls are boxed in: use another seed, fewer balls, a "
                "smaller ball_diameter or a larger image_size"
            )
        centres[t] = positions
    centres_tensor = torch.as_tensor(centres, dtype=dtype)
    frames = render_balls(centres_tensor, image_size, diameter, per_ball_channels)
    return BouncingBalls(frames=frames, centres=centres_tensor)
