r"""Square roots of covariance matrices without forming the covariance: the triangularization
(QR) step of square-root Kalman filters (Kaminski, Bryson & Schmidt 1971; Grewal & Andrews,
"Kalman Filtering", ch. 6)."""

from __future__ import annotations

import torch

__all__ = ["triangularize"]


def triangularize(square_root: torch.Tensor) -> torch.Tensor:
    r"""The lower-triangular square root of :math:`M M^\top` for a wide square root M.

    With :math:`M^\top = \mathcal{Q} \mathcal{R}` (QR), :math:`M M^\top = \mathcal{R}^\top
    \mathcal{R}`, so :math:`L = \mathcal{R}^\top` with its columns' signs flipped to make the
    diagonal non-negative: the Cholesky factor of :math:`M M^\top`, computed without forming it.

    :param torch.Tensor square_root: M, shape (..., n, k) with k >= n.
    :return: L, shape (..., n, n), lower triangular, :math:`L L^\top = M M^\top`.
    """
    n, k = square_root.shape[-2:]
    if k < n:
        raise ValueError(f"triangularize needs a wide square root (n <= k), got shape (n, k) = {(n, k)}")
    upper = torch.linalg.qr(square_root.transpose(-1, -2), mode="reduced")[1]  # (..., n, n)
    lower = upper.transpose(-1, -2)
    sign = torch.where(torch.diagonal(lower, dim1=-2, dim2=-1) < 0, -1.0, 1.0).to(lower.dtype)
    return lower * sign.unsqueeze(-2)  # flips columns
