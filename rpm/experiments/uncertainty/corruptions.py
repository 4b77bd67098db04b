r"""Corruptions of known strength for the digits part of ``rpm uncertainty``: a crop that shows
only a square window of the image, and a Gaussian blur.

* **Crop** of side s (a fraction of the image's side, in (0, 1]): the pixels whose centres lie
  in a square of side :math:`8s` pixels placed inside the 8 x 8 image are kept, the others set
  to 0, the digits' background. The window shows the fraction :math:`s^2` of the image's area,
  so a smaller s hides more of the digit; nothing is resampled (a resampled crop of an 8 x 8
  image would blur it as well). The window's corner is :math:`u\,(8 - 8s)` for a corner
  parameter :math:`u \in [0, 1]^2`: windows of two sides :math:`s_1 > s_2` with the same u are
  nested, the smaller inside the larger (its corner moves by :math:`8u(s_1 - s_2) \ge 0`, its
  far edge by :math:`-8(1 - u)(s_1 - s_2) \le 0`).
* **Blur** of standard deviation :math:`\sigma \ge 0` pixels: kornia's separable Gaussian filter
  (a 7 x 7 kernel, zero padding: the background continues outside the image);
  :math:`\sigma = 0` leaves the image as it is.

Every parameter is per image, so a batch can mix strengths.
"""

from __future__ import annotations

import torch

__all__ = ["BLUR_KERNEL", "blur", "crop", "random_views"]

#: The side of the blur's kernel, in pixels (covers 3 sigma for sigma up to 1).
BLUR_KERNEL = 7


def crop(images: torch.Tensor, side: torch.Tensor, corner: torch.Tensor) -> torch.Tensor:
    """Keep a square window of each image (module docstring), zero elsewhere.

    :param images: Shape: (N, C, H, W), H = W.
    :param side: the window's side as a fraction of the image's, in (0, 1]. Shape: (N,).
    :param corner: u in [0, 1]^2, where the window sits (x, y). Shape: (N, 2).
    :returns: the cropped images. Shape: as ``images``.
    """
    size = images.shape[-1]
    span = size * side  # (N,)
    low = corner * (size - span)[:, None]  # (N, 2), the window's corner in pixels
    centres = torch.arange(size, dtype=images.dtype, device=images.device) + 0.5  # (S,)
    inside_x = (centres >= low[:, :1]) & (centres <= low[:, :1] + span[:, None])  # (N, S)
    inside_y = (centres >= low[:, 1:]) & (centres <= low[:, 1:] + span[:, None])
    window = inside_y[:, :, None] & inside_x[:, None, :]  # (N, H, W)
    return images * window[:, None].to(images.dtype)


def blur(images: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """Gaussian blur of standard deviation ``sigma`` pixels per image (module docstring).

    :param images: Shape: (N, C, H, W).
    :param sigma: >= 0. Shape: (N,).
    :returns: the blurred images. Shape: as ``images``.
    """
    from kornia.filters import gaussian_blur2d

    blurred = gaussian_blur2d(images, (BLUR_KERNEL, BLUR_KERNEL),
                              sigma.clamp_min(1e-3)[:, None].expand(-1, 2).to(images.dtype),
                              border_type="constant")
    return torch.where((sigma > 0)[:, None, None, None], blurred, images)


def random_views(images: torch.Tensor, min_side: float, max_blur: float,
                 generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""One corrupted view of each image: a crop of side :math:`s \sim \mathcal U[s_\min, 1]`
    at a uniform corner, then a blur of :math:`\sigma \sim \mathcal U[0, \sigma_\max]`.

    :param images: Shape: (N, 1, 8, 8).
    :param float min_side: :math:`s_\min` in (0, 1].
    :param float max_blur: :math:`\sigma_\max \ge 0`.
    :param generator: the CPU generator the strengths are drawn from.
    :returns: ``(views, side, sigma)``, shapes (N, 1, 8, 8), (N,), (N,).
    """
    n = len(images)
    side = min_side + (1 - min_side) * torch.rand(n, generator=generator)
    corner = torch.rand(n, 2, generator=generator)
    sigma = max_blur * torch.rand(n, generator=generator)
    return blur(crop(images, side, corner), sigma), side, sigma
