r"""A procedural mask video: binary masks of one to three objects whose factors follow sparse
transitions (a stand-in for KITTI Masks, Klindt et al. 2021; Zimmermann et al. 2021, Table 3).

**Factors.** Each object k has four factors in :math:`[-1, 1]`: horizontal and vertical
position, area and aspect ratio, :math:`u_k = (x_k, y_k, a_k, e_k)`; the video's factors are
:math:`u = (u_1, \dots, u_K) \in [-1, 1]^{4K}`. They start uniform on the box and move by
a random walk with independent generalized-normal steps truncated to the box,

.. math::

    p(u_{t+1} | u_t) \propto \prod_d \exp\Big(-\Big|\frac{u_{t+1,d} - u_{t,d}}{\alpha}\Big|^\beta\Big)
        \, \mathbb{1}[u_{t+1} \in [-1, 1]^{4K}],

shape :math:`\beta` (default 0.5: sparser than a Laplace, as the masks of KITTI fit
:math:`\beta \approx 0.5`-0.7) and scale :math:`\alpha`, sampled exactly per coordinate by
rejection (:class:`~rpm.data.synthetic.Conditional`, the "box" space). Frames ``delta_t``
apart are ``delta_t`` steps of this walk: for ``delta_t > 1`` their difference is a sum of
steps, less sparse.

**Rendering.** Object k is the set of pixels :math:`(p_x, p_y)` (pixel centres, units of the
frame's side S) with :math:`|(p_x - c_x)/r_x|^{q_k} + |(p_y - c_y)/r_y|^{q_k} \le 1`:
an ellipse (:math:`q = 2`), a diamond (:math:`q = 1`) or a rounded rectangle (:math:`q = 6`),
one shape per object so that objects can be told apart. Centre :math:`c = 0.5 + 0.3\,(x, y)`,
area fraction :math:`A = 0.06 + 0.04\, a` of the frame (so :math:`r = \sqrt{A/\pi}`), and
semi-axes :math:`r_x = r e^{-0.4 e}`, :math:`r_y = r e^{0.4 e}`. A frame is the union of the
objects' masks, one binary channel, shape (1, S, S).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rpm._validation import check_positive, check_positive_int
from rpm.data.synthetic import Conditional

__all__ = ["FACTORS_PER_OBJECT", "MaskVideo", "render_masks"]

#: Factors of one object: x, y, area, aspect ratio.
FACTORS_PER_OBJECT = 4
#: Exponent q of each object's outline |dx/r_x|^q + |dy/r_y|^q <= 1: ellipse, diamond, box.
_OUTLINES = (2.0, 1.0, 6.0)
_MAX_OBJECTS = len(_OUTLINES)


def render_masks(factors: torch.Tensor, image_size: int) -> torch.Tensor:
    r"""The binary frames of factors (module docstring).

    :param torch.Tensor factors: :math:`u \in [-1, 1]^{4K}`, K = 1..3 objects.
        Shape: ``(..., 4K)``.
    :param int image_size: side S of the square frames, in pixels.
    :returns: the masks, 0.0 or 1.0 in the factors' dtype. Shape: ``(..., 1, S, S)``.
    """
    size = check_positive_int("image_size", image_size)
    if factors.shape[-1] % FACTORS_PER_OBJECT or not 0 < factors.shape[-1] <= 4 * _MAX_OBJECTS:
        raise ValueError(f"factors must have 4 K entries (K = 1..{_MAX_OBJECTS} objects) on the "
                         f"last axis, got shape {tuple(factors.shape)}")
    lead = factors.shape[:-1]
    flat = factors.reshape(-1, factors.shape[-1], 1, 1)                           # (B, 4K, 1, 1)
    pixels = (torch.arange(size, dtype=factors.dtype, device=factors.device) + 0.5) / size
    py, px = pixels.view(size, 1), pixels.view(1, size)                            # rows, columns
    frame = torch.zeros(flat.shape[0], size, size, dtype=torch.bool, device=factors.device)
    for k in range(factors.shape[-1] // FACTORS_PER_OBJECT):
        x, y, area, aspect = flat[:, 4 * k:4 * k + 4].unbind(1)                  # (B, 1, 1) each
        radius = torch.sqrt((0.06 + 0.04 * area) / math.pi)
        rx, ry = radius * torch.exp(-0.4 * aspect), radius * torch.exp(0.4 * aspect)
        q = _OUTLINES[k]
        inside = ((px - 0.5 - 0.3 * x) / rx).abs().pow(q) + ((py - 0.5 - 0.3 * y) / ry).abs().pow(q)
        frame |= inside <= 1.0
    return frame.to(factors.dtype).reshape(*lead, 1, size, size)


@dataclass
class MaskVideo:
    r"""Videos of moving masks (module docstring): factors and frames of ``num_videos``
    independent videos of ``num_frames`` frames each.

    :param int num_videos: independent videos V.
    :param int num_frames: frames T per video.
    :param int num_objects: objects K per frame, 1-3.
    :param float shape: shape :math:`\beta > 0` of the steps.
    :param float scale: scale :math:`\alpha > 0` of the steps, in units of the box [-1, 1].
    :param int image_size: side S of the frames, in pixels.
    :param int seed: seed of the video's generator.
    """

    num_videos: int = 100                # V independent videos
    num_frames: int = 100                # T frames each
    num_objects: int = 1                 # K objects per frame
    shape: float = 0.5                   # beta of the generalized-normal steps
    scale: float = 0.02                  # alpha of the steps (the box is [-1, 1])
    image_size: int = 32                 # S, pixels per side
    seed: int = 0

    def __post_init__(self) -> None:
        check_positive_int("num_videos", self.num_videos)
        if check_positive_int("num_frames", self.num_frames) < 2:
            raise ValueError(f"num_frames must be >= 2 (a video has pairs), got {self.num_frames}")
        if not 1 <= check_positive_int("num_objects", self.num_objects) <= _MAX_OBJECTS:
            raise ValueError(f"num_objects must be 1 to {_MAX_OBJECTS}, got {self.num_objects}")
        check_positive("shape", self.shape)
        check_positive("scale", self.scale)
        check_positive_int("image_size", self.image_size)
        generator = torch.Generator().manual_seed(self.seed)
        dim = FACTORS_PER_OBJECT * self.num_objects
        step = Conditional("box", "gennorm", self.scale, dim, beta=self.shape,
                           dtype=torch.float64)
        state = torch.rand(self.num_videos, dim, generator=generator, dtype=torch.float64) * 2 - 1
        path = [state]
        for _ in range(self.num_frames - 1):
            state = step.sample(state, generator)
            path.append(state)
        #: The factors, shape (V, T, 4K), float64 in [-1, 1].
        self.factors = torch.stack(path, dim=1)
        #: The frames, shape (V, T, 1, S, S), bool.
        self.frames = render_masks(self.factors, self.image_size).bool()

    @property
    def dim(self) -> int:
        """Number of factors, 4K."""
        return self.factors.shape[-1]

    def pairs(self, delta_t: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Indices of every pair of frames ``delta_t`` apart in the same video.

        :param int delta_t: frames between the two views, 1 <= delta_t < T.
        :returns: (video, frame) indices of the first views, each shape (V (T - delta_t),);
            the second views are (video, frame + delta_t).
        """
        if not 1 <= check_positive_int("delta_t", delta_t) < self.num_frames:
            raise ValueError(f"delta_t must be 1 to {self.num_frames - 1} (frames per video "
                             f"minus one), got {delta_t}")
        video, frame = torch.meshgrid(torch.arange(self.num_videos),
                                      torch.arange(self.num_frames - delta_t), indexing="ij")
        return video.reshape(-1), frame.reshape(-1)

    def windows(self, length: int, delta_t: int = 1) -> torch.Tensor:
        r"""Frame indices of every window of ``length`` frames ``delta_t`` apart.

        :param int length: frames per window, >= 2.
        :param int delta_t: frames between consecutive views of a window.
        :returns: indices into the (V T) flattened frames. Shape: ``(M, length)``.
        """
        span = (check_positive_int("length", length) - 1) * check_positive_int("delta_t", delta_t)
        if length < 2 or span >= self.num_frames:
            raise ValueError(f"a window of {length} frames {delta_t} apart spans {span + 1} "
                             f"frames; it needs length >= 2 and a span <= {self.num_frames}")
        starts = torch.arange(self.num_frames - span)
        offsets = torch.arange(length) * delta_t
        per_video = starts[:, None] + offsets                                      # (W, length)
        videos = torch.arange(self.num_videos)[:, None, None] * self.num_frames
        return (videos + per_video).reshape(-1, length)
