r"""Soft centre of mass of feature maps: the read-out layer of the bouncing-balls encoder.

For a non-negative map :math:`w_{k,ij}` (channel :math:`k`, row :math:`i`, column :math:`j`)

.. math::

    \bar x_k = \frac{\sum_{ij} w_{k,ij}\, x_j}{\sum_{ij} w_{k,ij} + \epsilon},
    \qquad
    \bar y_k = \frac{\sum_{ij} w_{k,ij}\, y_i}{\sum_{ij} w_{k,ij} + \epsilon},

with pixel-centre coordinates :math:`x_j = j + 1/2`, :math:`y_i = i + 1/2` (pixel units, the
convention of :mod:`rpm.data.bouncing_balls`), or their affine image in :math:`(-1, 1)`,
:math:`x_j = 2 (j + 1/2) / W - 1`, :math:`y_i = 2 (i + 1/2) / H - 1` (``normalized=True``).

References:
    L. Aitchison and S. Ganev, "InfoNCE is variational inference in a recognition
    parameterised model", Appendix D and Fig. 2 (centre of mass of each feature map).
"""

from __future__ import annotations

import torch
from torch import nn

from rpm._validation import check_bool, check_nonnegative

__all__ = ["CenterOfMass"]


class CenterOfMass(nn.Module):
    r"""Map each of ``K`` non-negative feature maps to the ``(x, y)`` of its centre of mass.

    .. math::

        (\bar x_k, \bar y_k) = \frac{\sum_{ij} w_{k,ij}\,(x_j, y_i)}{\sum_{ij} w_{k,ij} + \epsilon}

    The output interleaves the coordinates per map: ``(x_1, y_1, x_2, y_2, ..., x_K, y_K)``,
    ``x`` along the width (columns), ``y`` along the height (rows). With ``eps > 0`` a map of
    all zeros gives ``(0, 0)`` instead of NaN; for maps with positive mass the result lies in
    the convex hull of the pixel centres (shrunk towards 0 by at most a factor
    :math:`m / (m + \epsilon)`, :math:`m` the mass).

    :param bool normalized: if True, coordinates of pixel centres in ``(-1, 1)``; otherwise in
        pixel units, ``j + 1/2`` in ``(0, W)`` and ``i + 1/2`` in ``(0, H)``.
    :param float eps: small non-negative constant added to the total mass.

    Shape: input (N, K, H, W) with non-negative entries; output (N, 2K).
    """

    def __init__(self, normalized: bool = False, eps: float = 1e-6) -> None:
        super().__init__()
        self.normalized = check_bool("normalized", normalized)
        self.eps = check_nonnegative("eps", eps)

    def coordinates(self, size: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """Coordinates of the pixel centres along an axis of ``size`` pixels. Shape: (size,)."""
        grid = torch.arange(size, dtype=dtype, device=device) + 0.5  # (size,)
        return 2.0 * grid / size - 1.0 if self.normalized else grid

    def forward(self, maps: torch.Tensor) -> torch.Tensor:
        """:param torch.Tensor maps: non-negative feature maps. Shape: (N, K, H, W).
        :return: centres ``(x_1, y_1, ..., x_K, y_K)``. Shape: (N, 2K).
        :rtype: torch.Tensor
        """
        if not isinstance(maps, torch.Tensor):
            raise TypeError(f"maps must be a torch.Tensor, got {type(maps).__name__}")
        if maps.dim() != 4:
            raise ValueError(f"maps must have shape (N, K, H, W), got {tuple(maps.shape)}")
        n, k, h, w = maps.shape
        xs = self.coordinates(w, maps.dtype, maps.device)  # (W,)
        ys = self.coordinates(h, maps.dtype, maps.device)  # (H,)
        mass = maps.sum(dim=(-2, -1)) + self.eps  # (N, K)
        x = (maps.sum(dim=-2) * xs).sum(dim=-1) / mass  # (N, K): column marginal . x
        y = (maps.sum(dim=-1) * ys).sum(dim=-1) / mass  # (N, K): row marginal . y
        return torch.stack((x, y), dim=-1).reshape(n, 2 * k)  # (N, 2K) interleaved

    def extra_repr(self) -> str:
        return f"normalized={self.normalized}, eps={self.eps}"
