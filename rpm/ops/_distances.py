r"""Weighted squared distances between two sets of points, as a matrix and as matrix-product
factors.

Both expand the square,

.. math::

    \sum_d w_d (a_{id} - b_{jd})^2 = \sum_d w_d a_{id}^2 + \sum_d w_d b_{jd}^2
    - 2 \sum_d w_d a_{id} b_{jd},

after centring both sets on their common mean, so that an (N, M) matrix costs one matrix
product with D columns. The RBF, anisotropic and Gaussian (Lp, p = 2) energies of the implicit
prior (Eq. 21-22 and 27 of Aitchison & Ganev) are built from them.
"""

from __future__ import annotations

import torch

__all__ = ["expansion_rounding_bound", "squared_distance_factors", "squared_distances"]

# Largest rounding error (nats) accepted from an expanded squared-distance factorisation.
_FACTOR_TOLERANCE = 1e-3


def expansion_rounding_bound(magnitude, dim: int, dtype: torch.dtype):
    r"""Worst-case rounding of an expanded weighted squared distance, the one rule of the
    package's kernels.

    Computed as :math:`\sum_d w_d a_d^2 - 2 \sum_d w_d a_d b_d + \sum_d w_d b_d^2` (sums of D
    products, then two additions) in a floating-point type of unit roundoff
    :math:`\epsilon`, the result is off by at most

    .. math::

        (4 + D)\, \epsilon \, \Big(\sum_d w_d a_d^2 + \sum_d w_d b_d^2\Big),

    since :math:`|2 \sum_d w_d a_d b_d|` is at most the *magnitude*
    :math:`\sum_d w_d a_d^2 + \sum_d w_d b_d^2`, and each sum of D terms rounds to at most
    :math:`D \epsilon` of its absolute terms (plus the products and the two final
    additions). The direct difference form :math:`\sum_d w_d (a_d - b_d)^2` has the same
    bound with the squared distance itself in place of the magnitude: the expansion is worse
    exactly when the points are close together far from the centre of the expansion.

    :param magnitude: :math:`\sum_d w_d a_d^2 + \sum_d w_d b_d^2` (a number or a tensor).
    :param int dim: D.
    :param torch.dtype dtype: the floating-point type of the computation.
    :return: the bound, in the units of the squared distance.
    """
    return (4.0 + dim) * torch.finfo(dtype).eps * magnitude


def squared_distances(
    z: torch.Tensor, z2: torch.Tensor, weight: torch.Tensor | None = None
) -> torch.Tensor:
    r"""Pairwise weighted squared distances :math:`\sum_d w_d (z_{id} - z'_{jd})^2`.

    Expanded into matrix products, :math:`\sum_d w_d a_{id}^2 + \sum_d w_d b_{jd}^2
    - 2 \sum_d w_d a_{id} b_{jd}`, after centring both sets on a common mean (which keeps the
    cancellation error proportional to the spread of the points, not their offset); clamped at
    zero. The expansion cancels when two points are close compared with their distance from
    the centre (e.g. two tight clusters 2e3 apart): in float32 a squared distance of 1e-6
    would carry an error of order 1e-1. Lower precisions are therefore centred and expanded in
    float64 and the result is cast back, which leaves a relative error of order 1e-16 times
    (spread / distance)^2 before the final rounding. The matrix product has only D columns, so
    the cost is that of writing the (N, M) result.

    :param torch.Tensor z: shape (N, D).
    :param torch.Tensor z2: shape (M, D).
    :param weight: optional per-dimension weights :math:`w_d \ge 0`, shape (D,).
    :return: shape (N, M), in the dtype of z.
    """
    dtype = z.dtype
    if dtype != torch.float64:
        z, z2 = z.double(), z2.double()
        weight = None if weight is None else weight.double()
    centre = torch.cat([z, z2]).mean(0, keepdim=True).detach()
    a, b = z - centre, z2 - centre  # (N, D), (M, D)
    a_weighted = a if weight is None else a * weight
    b_weighted = b if weight is None else b * weight
    aa = (a * a_weighted).sum(-1)  # (N,)
    bb = (b * b_weighted).sum(-1)  # (M,)
    return (aa[:, None] + bb[None, :] - 2.0 * a_weighted @ b.T).to(dtype).clamp_min(0.0)


def squared_distance_factors(
    a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    r"""Matrix-product factors of a negative half squared distance, when they are accurate.

    .. math::

        -\tfrac12 \sum_d w_d (a_{id} - b_{jd})^2 = \tilde a_i^\top \tilde b_j + c_i, \qquad
        \tilde a_i = [w \odot a_i,\ 1], \quad
        \tilde b_j = [b_j,\ -\tfrac12 \textstyle\sum_d w_d b_{jd}^2], \quad
        c_i = -\tfrac12 \textstyle\sum_d w_d a_{id}^2,

    with a and b centred on the mean of both sets: the form in which the InfoNCE normaliser of
    the RBF, anisotropic and Gaussian energies is streamed
    (:func:`~rpm.ops.streaming_matmul_logsumexp`). In float32 the expansion rounds to about
    :math:`(4 + D)\, \epsilon\, (\sum_d w_d a_{id}^2 + \sum_d w_d b_{jd}^2)` nats; when that
    bound exceeds ``_FACTOR_TOLERANCE`` (1e-3 nats) for some pair (points close together far
    from the common centre, compared with the weights) the factors are refused and None is
    returned, so that the caller uses :func:`squared_distances`, which expands in float64.

    :param torch.Tensor a: shape (N, D).
    :param torch.Tensor b: shape (M, D).
    :param torch.Tensor weight: per-dimension weights :math:`w_d \ge 0`, shape (D,).
    :return: ``(left (N, D + 1), right (M, D + 1), row_offset (N,))`` or None.
    """
    centre = torch.cat([a, b]).mean(0, keepdim=True).detach()
    a, b = a - centre, b - centre
    if a.dtype != torch.float64:
        with torch.no_grad():
            magnitude = torch.cat([a, b]).square().mul(weight).sum(-1).max()  # max_i sum_d w a^2
            # The bound of a squared distance of magnitude <= 2 max_i sum_d w_d a_id^2; the
            # logit is half of it, so this keeps a margin of 2.
            bound = expansion_rounding_bound(2.0 * magnitude, a.shape[1], a.dtype)
        if bound.item() > _FACTOR_TOLERANCE:
            return None
    left = torch.cat([a * weight, torch.ones_like(a[:, :1])], dim=1)  # (N, D + 1)
    right = torch.cat([b, -0.5 * (b.square() * weight).sum(-1, keepdim=True)], dim=1)  # (M, D + 1)
    return left, right, -0.5 * (a.square() * weight).sum(-1)
