r"""The log-normaliser of a matrix of logits that is a matrix product, streamed in blocks.

The InfoNCE normaliser of the implicit prior (Eq. 23-25 of Aitchison & Ganev),

.. math::

    \log \sum_j e^{f(z_i, z'_j)}, \qquad f(z_i, z'_j) = a_i^\top b_j,

is, for every energy built from a matrix product (bilinear, cosine, RBF, anisotropic; see
:func:`rpm.priors._implicit.energy_logit_factors`), the row log-sum-exp of :math:`A B^\top`. This module
computes it without storing the N x M matrix: blocks of ``block_size`` rows and columns, an
online log-sum-exp in the forward pass, and a backward pass that recomputes each block,

.. math::

    P_{ij} = e^{a_i^\top b_j - \mathrm{lse}_i}, \qquad
    \frac{\partial}{\partial a_i} = g_i \sum_j P_{ij} b_j, \qquad
    \frac{\partial}{\partial b_j} = \sum_i g_i P_{ij} a_i,

the normaliser of flash attention (Dao et al., 2022) without the values. Memory
O((N + M) K) plus one block; three matrix products of the size of the logits in all.

The dense InfoNCE terms of a small batch, :math:`F_{ii} - \log \sum_j e^{F_{ij}}`, are
:func:`diagonal_log_softmax` (torch's fused ``log_softmax``, whose own vectorised exponential
does not slow down on subnormal results).

Underflow. Every other log-sum-exp of the package (this kernel, :func:`safe_logsumexp` for the
dense normalisers, the mixture marginal) raises the shifted logits :math:`x_j - \max_k x_k` to
``exp_floor`` of their dtype, :math:`\log(\text{tiny}) + 1` (float32: -86.3, float64:
-707.4), before exponentiating. ``exp`` of an input whose result is subnormal is much slower on
x86 CPUs (flush-to-zero does not help; measured in ``benchmarks/README.md``), and with a sharp
energy most logits of a row lie that far below its maximum. The sum is
unchanged in that dtype: the row's maximum contributes :math:`e^0 = 1`, every raised term at
most :math:`e \cdot \text{tiny}` (float32: 3.2e-38), so fewer than :math:`10^{30}` of them move
the sum by less than half a unit in the last place of 1; a raised term's gradient (its
softmax probability, below :math:`e \cdot \text{tiny}` too) is set to zero, where the exact
value is not representable as a normal number either.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from rpm._validation import check_positive_int
from rpm.ops._dispatch import default_block_size, ieee_float32_matmul

__all__ = ["diagonal_log_softmax", "exp_floor", "safe_logsumexp", "streaming_matmul_logsumexp"]


def exp_floor(dtype: torch.dtype) -> float:
    r"""The lowest exponent the package's log-sum-exps pass to ``exp``:
    :math:`\log(\text{tiny}) + 1` of the dtype (float32: -86.34, float64: -707.40).

    Below :math:`\log(\text{tiny})` the result is subnormal and ``exp`` is ~30-60x slower on x86
    CPUs; the extra nat keeps the rounding of the clamp itself clear of that range. Raising a
    shifted logit to it leaves a row's sum unchanged in the dtype (see the module docstring).

    :param torch.dtype dtype: a floating-point dtype.
    :return: the floor, a Python float.
    """
    return math.log(torch.finfo(dtype).tiny) + 1.0


def safe_logsumexp(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    r"""``torch.logsumexp`` that never exponentiates below the underflow threshold.

    .. math::

        \operatorname{lse}(x) = m + \log \sum_j \exp\big(\max(x_j - m,\ \lambda)\big),
        \qquad m = \max_j x_j, \quad \lambda = \log(\text{tiny}) + 1,

    the log-normaliser of the InfoNCE classifier (Eq. 23-25 of Aitchison & Ganev) and of the
    minibatch mixture (Eq. 11). Equal to ``torch.logsumexp`` in the dtype of x (the clamp
    changes the sum by less than half an ulp, see the module docstring; ``exp_floor``), but
    with a sharp energy (logits spread over hundreds of nats) it and its backward pass are
    several times faster on CPUs: torch's backward recomputes :math:`e^{x_j - \mathrm{lse}}` for
    every entry, this one multiplies by the saved (normal) exponentials. Entries clamped at the
    floor get zero gradient (their softmax weight is below :math:`e \cdot \text{tiny}`); rows
    whose maximum is :math:`-\infty` give :math:`-\infty`, rows with :math:`+\infty` or NaN give
    their maximum, as ``torch.logsumexp`` does. Twice differentiable (plain autograd). Memory:
    two temporaries of the size of x are kept for the backward pass.

    :param torch.Tensor x: floating-point logits.
    :param int dim: the dimension summed over.
    :return: x with ``dim`` removed.
    :rtype: torch.Tensor
    """
    if not x.dtype.is_floating_point:
        raise TypeError(f"safe_logsumexp needs floating-point logits, got {x.dtype}")
    with torch.no_grad():
        top = x.amax(dim, keepdim=True)
        shift = top.nan_to_num(0.0, 0.0, 0.0)                  # the row maxima, 0 where not finite
        finite = shift == top
    shifted = (x - shift).clamp_min(exp_floor(x.dtype))
    total = shifted.exp().sum(dim, keepdim=True).log() + shift
    return torch.where(finite, total, top).squeeze(dim)


def diagonal_log_softmax(logits: torch.Tensor, offset: float = 0.0) -> torch.Tensor:
    r"""The log-softmax of each row at its diagonal entry, plus a constant:

    .. math::

        r_i = F_{ii} - \log \sum_j e^{F_{ij}} + c, \qquad i = 1 \dots N,

    the per-pair InfoNCE term of the implicit prior (Eq. 23-25 of Aitchison & Ganev, with
    :math:`c = \log M`): ``torch.log_softmax(logits, -1).diagonal() + offset``, which equals
    ``logits.diagonal() - safe_logsumexp(logits, -1) + offset`` to rounding (float64: 1e-15)
    in value and gradient. ``log_softmax`` is one fused kernel forward and one backward, where
    the log-sum-exp and its subtraction are a graph of about a dozen autograd nodes, which is
    what a step of a small batch spends its time on; and its kernels do not slow down on
    exponentials in the subnormal range (measured against :func:`safe_logsumexp` in
    ``benchmarks/README.md``), so no floor is needed. Rows whose maximum is not finite give NaN
    (or :math:`-\infty` for a diagonal entry of :math:`-\infty` in a finite row). Twice
    differentiable.

    :param torch.Tensor logits: F, shape (..., N, M) with M >= N (the positives on the
        diagonal of the first N columns; leading dimensions are a batch of such matrices),
        floating point.
    :param float offset: c.
    :return: shape (..., N).
    :rtype: torch.Tensor
    """
    if not logits.dtype.is_floating_point:
        raise TypeError(f"diagonal_log_softmax needs floating-point logits, got {logits.dtype}")
    if logits.dim() < 2 or logits.shape[-1] < logits.shape[-2]:
        raise ValueError(f"diagonal_log_softmax takes logits of shape (..., N, M) with M >= N, "
                         f"got {tuple(logits.shape)}")
    terms = torch.log_softmax(logits, dim=-1).diagonal(dim1=-2, dim2=-1)      # (..., N)
    return terms + offset if offset != 0.0 else terms


def _block_logsumexp(block: torch.Tensor, top: torch.Tensor | None = None) -> torch.Tensor:
    """Row log-sum-exp of a block, overwriting the block; rows of -inf give -inf.

    :param top: the row maxima of the block if known, shape (bm,).
    """
    if top is None:
        top = block.amax(1)  # (bm,)
    finite = torch.isfinite(top)
    shift = torch.where(finite, top, 0.0)
    exponent = block.sub_(shift[:, None])
    exponent.clamp_min_(exp_floor(block.dtype))
    total = exponent.exp_().sum(1).log_().add_(shift)
    return torch.where(finite, total, top)


def _block_softmax(block: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """P = exp(block - lse[:, None]), in place (exponents clamped as in _block_logsumexp)."""
    exponent = block.sub_(lse[:, None])
    exponent.clamp_min_(exp_floor(block.dtype))
    return exponent.exp_()


class _StreamingMatmulLogsumexp(torch.autograd.Function):
    """Row log-sum-exp of left @ right.T in blocks, with a recomputing backward."""

    @staticmethod
    def forward(ctx, left, right, block_size: int):
        num_rows, num_cols = left.shape[0], right.shape[0]
        with torch.no_grad(), ieee_float32_matmul():
            lse = left.new_full((num_rows,), -math.inf)  # (N,)
            for r0 in range(0, num_rows, block_size):
                rows = slice(r0, min(r0 + block_size, num_rows))
                lse_rows = lse[rows]
                for c0 in range(0, num_cols, block_size):
                    logits = left[rows] @ right[c0:c0 + block_size].T  # (rows, cols) of the block
                    torch.logaddexp(lse_rows, _block_logsumexp(logits), out=lse_rows)
        ctx.block_size = block_size
        ctx.save_for_backward(left, right, lse)
        return lse

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        left, right, lse = ctx.saved_tensors
        block_size = ctx.block_size
        num_rows, num_cols = left.shape[0], right.shape[0]
        with torch.no_grad(), ieee_float32_matmul():
            grad_left = torch.empty_like(left)  # (N, K)
            grad_right = torch.zeros_like(right)  # (M, K)
            for r0 in range(0, num_rows, block_size):
                rows = slice(r0, min(r0 + block_size, num_rows))
                g = grad[rows]  # (rows,)
                scaled_left = left[rows] * g[:, None]  # (rows, K)
                acc = torch.zeros_like(scaled_left)  # (rows, K): sum_j P_ij b_j
                for c0 in range(0, num_cols, block_size):
                    cols = slice(c0, c0 + block_size)
                    prob = left[rows] @ right[cols].T  # (rows, cols): logits, then P in place
                    _block_softmax(prob, lse[rows])
                    acc.addmm_(prob, right[cols])
                    grad_right[cols].addmm_(prob.T, scaled_left)
                grad_left[rows] = acc * g[:, None]
        return grad_left, grad_right, None


def streaming_matmul_logsumexp(
    left: torch.Tensor, right: torch.Tensor, block_size: int | None = None
) -> torch.Tensor:
    r"""Row log-sum-exp of a product, :math:`\mathrm{lse}_i = \log \sum_j e^{a_i^\top b_j}`,
    without storing the product.

    Equal to ``torch.logsumexp(left @ right.T, dim=1)`` (TF32 switched off), computed in
    blocks with an online log-sum-exp; the backward pass recomputes the blocks. Memory
    O((N + M) K) plus one ``block_size`` x ``block_size`` block. Not twice differentiable.

    :param torch.Tensor left: the row factors :math:`a_i`, shape (N, K).
    :param torch.Tensor right: the column factors :math:`b_j`, shape (M, K).
    :param block_size: rows and columns per block; ``None`` picks
        ``rpm.ops._dispatch.default_block_size`` of the device.
    :return: shape (N,).
    :rtype: torch.Tensor
    """
    if left.dim() != 2 or right.dim() != 2 or left.shape[1] != right.shape[1]:
        raise ValueError(
            "expected left of shape (N, K) and right of shape (M, K) with the same K, got "
            f"{tuple(left.shape)} and {tuple(right.shape)}"
        )
    if right.shape[0] < 1:
        raise ValueError("the log-sum-exp needs at least one column, got right with 0 rows")
    if left.dtype != right.dtype or not left.dtype.is_floating_point:
        raise TypeError(
            f"left and right must share a floating-point dtype, got {left.dtype} and {right.dtype}"
        )
    if block_size is None:
        block_size = default_block_size(left.device)
    check_positive_int("block_size", block_size)
    return _StreamingMatmulLogsumexp.apply(left, right, block_size)
