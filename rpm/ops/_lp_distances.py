r"""Pairwise p-th powers of Lp distances, in row blocks with an analytic gradient.

The Lp energy of the implicit prior (:class:`~rpm.priors.LpEnergy`; the generalized normal
conditionals of Zimmermann et al., Table 2) needs, for every pair of a batch,

.. math::

    S_{ij} = \sum_d |z_{id} - z'_{jd}|^p .

``torch.cdist`` computes :math:`\lVert \cdot \rVert_p = S^{1/p}` instead; for p other than 1
and 2 its backward pass is slower than a broadcast (``benchmarks/energies.py``) and, for large
p, not finite (it divides :math:`|d|^{p-1}` by :math:`\lVert d \rVert_p^{p-1}`, both of which
underflow or overflow). Here S is computed in blocks of rows, each a (D, rows, M) broadcast of
a size that stays in cache, and the backward pass recomputes each block and applies the
derivative

.. math::

    \frac{\partial S_{ij}}{\partial z_{id}} = -\frac{\partial S_{ij}}{\partial z'_{jd}}
    = p\, \operatorname{sign}(d)\, |d|^{p-1}, \qquad d = z_{id} - z'_{jd},

so autograd never stores the (N, M, D) tensors. Memory O((N + M) D) plus one block.

At d = 0 the derivative is 0 for every p: the derivative itself for p > 1, the zero
subgradient (``sign(0) = 0``, as torch's ``abs``) for p = 1, and for p < 1, where
:math:`|d|^p` has an infinite slope at 0, also 0: the two one-sided slopes are
:math:`\pm\infty`, and 0 is the choice that keeps the gradient finite and symmetric in the
two latents (a pair with identical coordinates neither attracts nor repels along that
coordinate). For p < 1 and :math:`0 < |d| < \text{tiny}` (subnormal differences) the slope is
taken at tiny, which keeps it finite (at most :math:`p\, \text{tiny}^{p-1}`, 1e19 in float32
for p = 0.5).

Range. :math:`|d|^p` overflows the dtype once :math:`|d|` exceeds
:math:`\text{max}^{1/p}` (float32, p = 100: 2.4); such entries are ``inf``. A caller that
divides by a temperature passes ``scale`` :math:`= \tau^{-1/p}` (as
:class:`~rpm.priors.LpEnergy` does): each difference is scaled before the power, so that only
energies beyond the range of the dtype overflow, and the difference of two nearby points far
from the origin is taken before the scaling (it keeps its precision). Entries of S whose
upstream gradient is exactly zero contribute zero to the gradient even when their slope
overflows.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from rpm._validation import check_positive_int

__all__ = ["lp_distances", "lp_paired_distances"]

# Elements of one (D, rows, M) block: on the CPU 2^17 float32 values (512 KiB) stay in a core's
# L2 cache; on an accelerator a block is one launch of each kernel, so it is as large as memory
# comfortably allows (2^26 values, 256 MiB in float32): a batch of 4096 x 4096 pairs in 10
# dimensions is three blocks instead of over a thousand launch-bound ones.
_BLOCK_ELEMENTS = 1 << 17
_ACCELERATOR_BLOCK_ELEMENTS = 1 << 26


def _abs_power(magnitude: torch.Tensor, q: float) -> torch.Tensor:
    """magnitude^q for magnitude >= 0, overwriting magnitude.

    Integer and half-integer q up to 16 by multiplications and a square root (a generic ``pow``
    costs several times as much per element; the products round to a few ulp), others by pow.
    """
    twice = 2.0 * q
    if q == 1.0:
        return magnitude
    if q == -0.5:
        return magnitude.rsqrt_()
    if twice != round(twice) or not 0.0 <= q <= 16.0:
        return magnitude.pow_(q)
    whole = int(q)
    if whole == 0:  # q = 0 or 1/2
        return magnitude.sqrt_() if q else magnitude.fill_(1.0)
    root = magnitude.sqrt() if twice % 2 == 1 else None
    result: torch.Tensor | None = None
    base = magnitude
    while whole:  # binary exponentiation: base^whole
        if whole & 1:
            result = base.clone() if result is None else result.mul_(base)
        whole >>= 1
        if whole:
            base = base.square() if base is magnitude else base.square_()
    assert result is not None  # whole >= 1 has a set bit
    return result if root is None else result.mul_(root)


def _power(diff: torch.Tensor, p: float) -> torch.Tensor:
    """|diff|^p, elementwise, overwriting diff."""
    return _abs_power(diff.abs_(), p)


def _slope(diff: torch.Tensor, p: float) -> torch.Tensor:
    """sign(diff) |diff|^(p - 1) (the derivative over p), elementwise, with 0 at diff = 0."""
    if p == 1.0:
        return diff.sign()
    if p == 2.0:
        return diff
    if p == 3.0:
        return diff.abs().mul_(diff)
    magnitude = diff.abs()
    if p < 1.0:
        magnitude.clamp_min_(torch.finfo(diff.dtype).tiny)  # finite slope; sign(0) = 0 below
    return _abs_power(magnitude, p - 1.0).mul_(diff.sign())


def _rows_per_block(num_cols: int, dim: int, block_size: int | None,
                    device: torch.device | str = "cpu") -> int:
    """Rows of one block: ``block_size`` if given, else as many as fit the device's block
    (2^17 elements on the CPU, 2^26 on an accelerator), at least one."""
    if block_size is not None:
        return block_size
    elements = _BLOCK_ELEMENTS if torch.device(device).type == "cpu" else _ACCELERATOR_BLOCK_ELEMENTS
    return max(1, elements // max(1, num_cols * dim))


class _LpDistances(torch.autograd.Function):
    """S_ij = sum_d |c (z_id - z2_jd)|^p in row blocks, with a recomputing analytic backward.

    Blocks are laid out (D, rows, M), so that the sum over d adds D contiguous slabs and the
    sums of the backward pass run along contiguous rows (an innermost reduction over a short D
    is several times slower on CPUs).
    """

    @staticmethod
    def forward(ctx, z, z2, scale, p: float, rows: int):
        num = z.shape[0]
        z_t, z2_t = z.detach().T.contiguous(), z2.detach().T.contiguous()  # (D, N), (D, M)
        out = z.new_empty(num, z2.shape[0])  # (N, M)
        with torch.no_grad():
            for r0 in range(0, num, rows):
                diff = z_t[:, r0:r0 + rows, None] - z2_t[:, None, :]  # (D, b, M)
                torch.sum(_power(diff.mul_(scale), p), 0, out=out[r0:r0 + rows])
        ctx.p, ctx.rows = p, rows
        ctx.save_for_backward(z_t, z2_t, scale, out)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        z_t, z2_t, scale, out = ctx.saved_tensors
        p, rows = ctx.p, ctx.rows
        grad_z = torch.empty_like(z_t)  # (D, N)
        grad_z2 = torch.zeros_like(z2_t)  # (D, M)
        for r0 in range(0, z_t.shape[1], rows):
            g = grad[r0:r0 + rows] * (p * scale)  # (b, M)
            diff = z_t[:, r0:r0 + rows, None] - z2_t[:, None, :]  # (D, b, M)
            weighted = _slope(diff.mul_(scale), p).mul_(g)  # (D, b, M): g_ij dS_ij/dz_id
            if p > 3.0:  # an overflowed slope times a zero upstream gradient contributes 0
                weighted.masked_fill_(g == 0, 0.0)
            torch.sum(weighted, 2, out=grad_z[:, r0:r0 + rows])
            grad_z2.sub_(weighted.sum(1))
        return grad_z.T, grad_z2.T, _scale_grad(ctx, grad, out, scale, 2), None, None


def _scale_grad(ctx, grad: torch.Tensor, out: torch.Tensor, scale: torch.Tensor, index: int):
    """dLoss/dc = sum g S p / c (S is homogeneous of degree p in c); None if not needed."""
    if not ctx.needs_input_grad[index]:
        return None
    # nansum: an overflowed entry (inf) with a zero upstream gradient contributes 0, not NaN
    return torch.mul(grad, out).nansum() * (ctx.p / scale)


class _LpPaired(torch.autograd.Function):
    """s_i = sum_d |c (z_id - z2_id)|^p with the same derivative (and subgradient at 0)."""

    @staticmethod
    def forward(ctx, z, z2, scale, p: float):
        ctx.p = p
        with torch.no_grad():
            out = _power((z - z2).mul_(scale), p).sum(-1)
        ctx.save_for_backward(z, z2, scale, out)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        z, z2, scale, out = ctx.saved_tensors
        weighted = _slope((z - z2).mul_(scale), ctx.p).mul_(grad[:, None] * (ctx.p * scale))
        if ctx.p > 3.0:
            weighted.masked_fill_((grad == 0)[:, None], 0.0)
        return weighted, -weighted, _scale_grad(ctx, grad, out, scale, 2), None


def _as_scale(scale, z: torch.Tensor) -> torch.Tensor:
    if scale is None:
        return torch.ones((), dtype=z.dtype, device=z.device)
    if not isinstance(scale, torch.Tensor):
        scale = torch.tensor(float(scale), dtype=z.dtype, device=z.device)
    if scale.dim() != 0 or scale.dtype != z.dtype:
        raise ValueError(f"scale must be a number or a 0-dimensional tensor of the latents' dtype "
                         f"{z.dtype}, got shape {tuple(scale.shape)} and {scale.dtype}")
    return scale


def _check(z: torch.Tensor, z2: torch.Tensor, p: float) -> float:
    if not (isinstance(z, torch.Tensor) and isinstance(z2, torch.Tensor)):
        raise TypeError("z and z2 must be tensors")
    if z.dim() != 2 or z2.dim() != 2 or z.shape[1] != z2.shape[1]:
        raise ValueError(
            f"expected z of shape (N, D) and z2 of shape (M, D) with the same D, got "
            f"{tuple(z.shape)} and {tuple(z2.shape)}"
        )
    if z.dtype != z2.dtype or not z.dtype.is_floating_point:
        raise TypeError(f"z and z2 must share a floating-point dtype, got {z.dtype} and {z2.dtype}")
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not p > 0 or p == float("inf"):
        raise ValueError(f"p must be a positive finite number, got {p!r}")
    return float(p)


def lp_distances(
    z: torch.Tensor, z2: torch.Tensor, p: float, scale: torch.Tensor | float | None = None,
    block_size: int | None = None,
) -> torch.Tensor:
    r"""The matrix of p-th powers of scaled Lp distances,
    :math:`S_{ij} = \sum_d |c\,(z_{id} - z'_{jd})|^p`.

    The energy matrix of the Lp energy (:math:`f = -S / \tau`) without ``torch.cdist``: row
    blocks of a (D, rows, M) broadcast, and an analytic backward pass that recomputes each
    block (see the module docstring for the derivative, the subgradient at d = 0 and the range).
    Memory O((N + M) D) plus one block. Not twice differentiable.

    :param torch.Tensor z: shape (N, D).
    :param torch.Tensor z2: shape (M, D).
    :param float p: the exponent, p > 0.
    :param scale: the factor c > 0 (a number, or a 0-dimensional tensor that may require a
        gradient: :math:`\partial S / \partial c = p S / c`), applied to each difference
        before the power, so that :math:`c^p` itself never has to be representable and the
        differences of nearby points keep their precision; default 1.
    :param block_size: rows per block; ``None`` sizes blocks to about 2^17 elements on the
        CPU (cache-sized) and 2^26 on an accelerator (one launch per kernel for most batches).
    :return: S, shape (N, M).
    :rtype: torch.Tensor
    """
    p = _check(z, z2, p)
    if block_size is not None:
        check_positive_int("block_size", block_size)
    rows = _rows_per_block(z2.shape[0], z.shape[1], block_size, z.device)
    return _LpDistances.apply(z, z2, _as_scale(scale, z), p, rows)


def lp_paired_distances(
    z: torch.Tensor, z2: torch.Tensor, p: float, scale: torch.Tensor | float | None = None
) -> torch.Tensor:
    r"""The p-th powers of the scaled Lp distances of paired rows,
    :math:`s_i = \sum_d |c\,(z_{id} - z'_{id})|^p`.

    The diagonal of :func:`lp_distances` in O(N D), with the same derivative and subgradient.

    :param torch.Tensor z: shape (N, D).
    :param torch.Tensor z2: shape (N, D).
    :param float p: the exponent, p > 0.
    :param scale: the factor c, as for :func:`lp_distances`; default 1.
    :return: s, shape (N,).
    :rtype: torch.Tensor
    """
    p = _check(z, z2, p)
    if z.shape != z2.shape:
        raise ValueError(f"paired rows need z and z2 of one shape, got {tuple(z.shape)} and "
                         f"{tuple(z2.shape)}")
    return _LpPaired.apply(z, z2, _as_scale(scale, z), p)
