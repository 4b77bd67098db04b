r"""The minibatch-mixture marginal as fused Triton kernels (CUDA; Triton's interpreter on CPU).

.. math::

    \log Q(z_m) = \operatorname{logsumexp}_n L_{mn} - \log N, \qquad
    L_{mn} = \ell_n - \tfrac12 q_{mn}, \qquad
    q_{mn} = \sum_d w_{nd} (z_{md} - \mu_{nd})^2, \qquad w_{nd} = \sigma_{nd}^{-2},

with :math:`\ell_n = -\sum_d \log\sigma_{nd} - \tfrac D2 \log 2\pi` (summed in float64 once per
call). Each program owns a block of rows (or columns) and visits the blocks of the other axis,
flash-attention style: the M x N matrix L never leaves the registers.

* Forward: every block of :math:`q` is accumulated over d in the *difference* form
  :math:`\sum_d ((z_{md} - \mu_{nd}) w_{nd}) (z_{md} - \mu_{nd})`, which rounds to a few ulps
  of :math:`q` itself (no cancellation, whatever the distances and scales; nothing to refine),
  and the row log-sum-exp is kept online, :math:`(m, s) \leftarrow (\max(m, \max_n L),
  s\, e^{m - m'} + \sum_n e^{L - m'})`. Only the row log-sum-exps are saved.
* Backward: with :math:`G_{mn} = g_m e^{L_{mn} - \mathrm{lse}_m}` (g the incoming gradient),
  one kernel reduces over n for the points,
  :math:`\partial/\partial z_{md} = -\sum_n G_{mn} w_{nd} (z_{md} - \mu_{nd})`, and one over m
  for the components, with :math:`S_{0n} = \sum_m G_{mn}`,
  :math:`S_{1nd} = \sum_m G_{mn} (z_{md} - \mu_{nd})`,
  :math:`S_{2nd} = \sum_m G_{mn} (z_{md} - \mu_{nd})^2`:
  :math:`\partial/\partial\mu_{nd} = w_{nd} S_{1nd}` and
  :math:`\partial/\partial\sigma_{nd} = (w_{nd} S_{2nd} - S_{0n}) / \sigma_{nd}`; each block of
  L is recomputed from the saved log-sum-exps, in the difference form again.

Each kernel may split its reduced axis over several programs (strided over the blocks), so
that small batches still fill the device; the partial results (log-sum-exps, sums) are
combined afterwards, so no two programs write the same memory. Memory: O((M + N) D) and the
partial sums, whatever M and N.

This module imports Triton; ``rpm.ops._gaussian_mixture`` imports it only when it is used.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

# Rows and columns of a block of L held by one program (powers of two, >= 16 for Triton).
BLOCK_M = 64
BLOCK_N = 64
NUM_WARPS = 4
# No software pipelining: the loops load small vectors (no tl.dot to feed), and the backward
# kernels' read-modify-write of their sums stays in program order.
NUM_STAGES = 1
# Dimensions summed per partial sum of the quadratic form.
CHUNK_D: tl.constexpr = tl.constexpr(16)
# Programs per streaming multiprocessor that the splits of the reduced axis aim for.
_PROGRAMS_PER_SM = 4


@triton.jit
def _log_component_block(
    zt_ptr, loct_ptr, weightt_ptr, log_norm_ptr, offs_m, offs_n, mask_m, mask_n,
    num_points, num_comps, dim, EXCLUDE_SELF: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The (BLOCK_M, BLOCK_N) block of L in the difference form; -inf outside the matrix and,
    with EXCLUDE_SELF, on the diagonal. The inputs are transposed, (D, M) and (D, N)."""
    log_norm = tl.load(log_norm_ptr + offs_n, mask=mask_n, other=0.0)
    quad = tl.zeros((BLOCK_M, BLOCK_N), dtype=log_norm.dtype)
    for start in range(0, dim, CHUNK_D):  # chunked sum: rounding ~ (CHUNK_D + D / CHUNK_D) ulp
        part = tl.zeros((BLOCK_M, BLOCK_N), dtype=log_norm.dtype)
        for d in range(start, tl.minimum(start + CHUNK_D, dim)):
            z_d = tl.load(zt_ptr + d * num_points + offs_m, mask=mask_m, other=0.0)
            loc_d = tl.load(loct_ptr + d * num_comps + offs_n, mask=mask_n, other=0.0)
            weight_d = tl.load(weightt_ptr + d * num_comps + offs_n, mask=mask_n, other=0.0)
            diff = z_d[:, None] - loc_d[None, :]
            part += (diff * weight_d[None, :]) * diff
        quad += part
    valid = mask_m[:, None] & mask_n[None, :]
    if EXCLUDE_SELF:
        valid = valid & (offs_m[:, None] != offs_n[None, :])
    return tl.where(valid, log_norm[None, :] - 0.5 * quad, -float("inf"))


@triton.jit
def _forward_kernel(
    zt_ptr, loct_ptr, weightt_ptr, log_norm_ptr, partial_lse_ptr, num_points, num_comps, dim,
    num_steps, num_splits, EXCLUDE_SELF: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Row log-sum-exps of L over the column blocks split, split + splits, ... (online)."""
    pid_m = tl.program_id(0)
    split = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < num_points
    dtype = partial_lse_ptr.dtype.element_ty
    run_max = tl.full((BLOCK_M,), -float("inf"), dtype=dtype)
    run_sum = tl.zeros((BLOCK_M,), dtype=dtype)
    for step in range(0, num_steps):
        block = split + step * num_splits  # past the end: all masked
        offs_n = block * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = offs_n < num_comps
        values = _log_component_block(
            zt_ptr, loct_ptr, weightt_ptr, log_norm_ptr, offs_m, offs_n, mask_m, mask_n,
            num_points, num_comps, dim, EXCLUDE_SELF, BLOCK_M, BLOCK_N)
        new_max = tl.maximum(run_max, tl.max(values, 1))
        shift = tl.where(new_max == -float("inf"), 0.0, new_max)  # rows with no term yet
        run_sum = run_sum * tl.exp(run_max - shift) + tl.sum(tl.exp(values - shift[:, None]), 1)
        run_max = new_max
    # A split may hold no term of a row (all its columns excluded or past the end): -inf.
    found = run_sum > 0
    lse = tl.where(found, run_max + tl.log(tl.where(found, run_sum, 1.0)), -float("inf"))
    tl.store(partial_lse_ptr + split * num_points + offs_m, lse, mask=mask_m)


@triton.jit
def _grad_points_kernel(
    zt_ptr, loct_ptr, weightt_ptr, log_norm_ptr, lse_ptr, grad_ptr, partial_ptr, num_points,
    num_comps, dim, num_steps, num_splits, EXCLUDE_SELF: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """partial[split, d, m] = sum_n G_mn w_nd (z_md - mu_nd) over this split's column blocks
    (the buffer starts at zero; each entry is owned by one program)."""
    pid_m = tl.program_id(0)
    split = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < num_points
    lse = tl.load(lse_ptr + offs_m, mask=mask_m, other=0.0)
    grad = tl.load(grad_ptr + offs_m, mask=mask_m, other=0.0)
    out_ptr = partial_ptr + split * dim * num_points + offs_m
    for step in range(0, num_steps):
        block = split + step * num_splits  # past the end: all masked
        offs_n = block * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = offs_n < num_comps
        values = _log_component_block(
            zt_ptr, loct_ptr, weightt_ptr, log_norm_ptr, offs_m, offs_n, mask_m, mask_n,
            num_points, num_comps, dim, EXCLUDE_SELF, BLOCK_M, BLOCK_N)
        weight_pair = grad[:, None] * tl.exp(values - lse[:, None])  # (BM, BN): G
        for d in range(dim):
            z_d = tl.load(zt_ptr + d * num_points + offs_m, mask=mask_m, other=0.0)
            loc_d = tl.load(loct_ptr + d * num_comps + offs_n, mask=mask_n, other=0.0)
            weight_d = tl.load(weightt_ptr + d * num_comps + offs_n, mask=mask_n, other=0.0)
            diff = z_d[:, None] - loc_d[None, :]
            column = tl.sum((weight_pair * weight_d[None, :]) * diff, 1)  # (BM,)
            acc = tl.load(out_ptr + d * num_points, mask=mask_m, other=0.0)
            tl.store(out_ptr + d * num_points, acc + column, mask=mask_m)
        # The next block reads what this one wrote (possibly from other threads of the program).
        tl.debug_barrier()


@triton.jit
def _grad_components_kernel(
    zt_ptr, loct_ptr, weightt_ptr, log_norm_ptr, lse_ptr, grad_ptr, partial0_ptr,
    partial1_ptr, partial2_ptr, num_points, num_comps, dim, num_steps, num_splits,
    EXCLUDE_SELF: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """partial0[split, n] = sum_m G_mn, partial1[split, d, n] = sum_m G_mn (z_md - mu_nd) and
    partial2[split, d, n] = sum_m G_mn (z_md - mu_nd)^2 over this split's row blocks (the
    buffers start at zero; each entry is owned by one program)."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < num_comps
    total = tl.zeros((BLOCK_N,), dtype=partial0_ptr.dtype.element_ty)
    out1_ptr = partial1_ptr + split * dim * num_comps + offs_n
    out2_ptr = partial2_ptr + split * dim * num_comps + offs_n
    for step in range(0, num_steps):
        block = split + step * num_splits  # past the end: all masked
        offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_m = offs_m < num_points
        lse = tl.load(lse_ptr + offs_m, mask=mask_m, other=0.0)
        grad = tl.load(grad_ptr + offs_m, mask=mask_m, other=0.0)
        values = _log_component_block(
            zt_ptr, loct_ptr, weightt_ptr, log_norm_ptr, offs_m, offs_n, mask_m, mask_n,
            num_points, num_comps, dim, EXCLUDE_SELF, BLOCK_M, BLOCK_N)
        weight_pair = grad[:, None] * tl.exp(values - lse[:, None])  # (BM, BN): G
        total += tl.sum(weight_pair, 0)
        for d in range(dim):
            z_d = tl.load(zt_ptr + d * num_points + offs_m, mask=mask_m, other=0.0)
            loc_d = tl.load(loct_ptr + d * num_comps + offs_n, mask=mask_n, other=0.0)
            diff = z_d[:, None] - loc_d[None, :]
            first = weight_pair * diff
            acc1 = tl.load(out1_ptr + d * num_comps, mask=mask_n, other=0.0)
            acc2 = tl.load(out2_ptr + d * num_comps, mask=mask_n, other=0.0)
            tl.store(out1_ptr + d * num_comps, acc1 + tl.sum(first, 0), mask=mask_n)
            tl.store(out2_ptr + d * num_comps, acc2 + tl.sum(first * diff, 0), mask=mask_n)
        tl.debug_barrier()
    tl.store(partial0_ptr + split * num_comps + offs_n, total, mask=mask_n)


def _num_splits(parallel_blocks: int, reduced_blocks: int, device: torch.device) -> int:
    """How many programs share the reduced axis: enough to give each streaming multiprocessor
    a few programs (CUDA), two on the CPU (the interpreter: exercises the combination)."""
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        wanted = -(-_PROGRAMS_PER_SM * sms // parallel_blocks)
    else:
        wanted = 2
    return max(1, min(wanted, reduced_blocks))


def _combine(partial: torch.Tensor) -> torch.Tensor:
    """The sum over the splits (the first axis); no copy for one split."""
    return partial[0] if partial.shape[0] == 1 else partial.sum(0)


def kernel_operands(
    z: torch.Tensor, loc: torch.Tensor, scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernels' inputs: z^T (D, M), mu^T (D, N), w^T = sigma^-2 (D, N), contiguous, and
    l_n (N,) (its sum of logarithms in float64)."""
    dim = z.shape[1]
    log_det = scale.double().log().sum(-1)
    log_norm = (-log_det - 0.5 * dim * math.log(2 * math.pi)).to(z.dtype)
    return (z.t().contiguous(), loc.t().contiguous(),
            scale.t().reciprocal().square().contiguous(), log_norm)


def _launch_options() -> dict:
    return {"num_warps": NUM_WARPS, "num_stages": NUM_STAGES}


def row_log_sum_exp(operands: tuple[torch.Tensor, ...], exclude_self: bool) -> torch.Tensor:
    """logsumexp_n L_mn for every row, shape (M,) (the forward kernel and the combination of
    its splits), from :func:`kernel_operands`."""
    dim, num_points = operands[0].shape
    num_comps = operands[1].shape[1]
    row_blocks = triton.cdiv(num_points, BLOCK_M)
    col_blocks = triton.cdiv(num_comps, BLOCK_N)
    splits = _num_splits(row_blocks, col_blocks, operands[0].device)
    partial = operands[0].new_empty(splits, num_points)
    _forward_kernel[(row_blocks, splits)](
        *operands, partial, num_points, num_comps, dim, triton.cdiv(col_blocks, splits),
        splits,
        EXCLUDE_SELF=exclude_self, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, **_launch_options())
    return partial[0] if splits == 1 else torch.logsumexp(partial, 0)


def mixture_gradients(
    operands: tuple[torch.Tensor, ...], scale: torch.Tensor, exclude_self: bool,
    lse: torch.Tensor, grad: torch.Tensor, needs: tuple[bool, bool, bool],
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Gradients of sum_m grad_m logsumexp_n L_mn with respect to (z, loc, scale), each None
    where ``needs`` says it is not wanted (the two backward kernels, see the module docstring),
    from :func:`kernel_operands` and the scales.
    """
    dim, num_points = operands[0].shape
    num_comps = operands[1].shape[1]
    z = operands[0]  # for its device and dtype
    grad = grad.contiguous()
    row_blocks, col_blocks = triton.cdiv(num_points, BLOCK_M), triton.cdiv(num_comps, BLOCK_N)
    flags = {"EXCLUDE_SELF": exclude_self, "BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N}
    grad_z = grad_loc = grad_scale = None
    if needs[0]:
        splits = _num_splits(row_blocks, col_blocks, z.device)
        partial = z.new_zeros(splits, dim, num_points)
        _grad_points_kernel[(row_blocks, splits)](
            *operands, lse, grad, partial, num_points, num_comps, dim,
            triton.cdiv(col_blocks, splits), splits, **flags, **_launch_options())
        grad_z = _combine(partial).t().neg_()  # (M, D)
    if needs[1] or needs[2]:
        splits = _num_splits(col_blocks, row_blocks, z.device)
        buffer = z.new_zeros((2 * dim + 1) * splits * num_comps)  # one allocation, one fill
        partial1, partial2, partial0 = buffer.split(
            [dim * splits * num_comps, dim * splits * num_comps, splits * num_comps])
        partial0 = partial0.view(splits, num_comps)
        partial1 = partial1.view(splits, dim, num_comps)
        partial2 = partial2.view(splits, dim, num_comps)
        _grad_components_kernel[(col_blocks, splits)](
            *operands, lse, grad, partial0, partial1, partial2, num_points, num_comps,
            dim, triton.cdiv(row_blocks, splits), splits, **flags, **_launch_options())
        weight = operands[2].t()  # (N, D)
        if needs[1]:
            grad_loc = _combine(partial1).t() * weight
        if needs[2]:
            second = _combine(partial2).t() * weight
            grad_scale = second.sub_(_combine(partial0)[:, None]).div_(scale)
    return grad_z, grad_loc, grad_scale


class FusedGaussianMixture(torch.autograd.Function):
    """log Q(z_m) through the fused kernels: saves the row log-sum-exps (and the kernels'
    O((M + N) D) operands), never a block of L.

    The backward kernels compute the gradient outside autograd. A backward pass that builds a
    graph (grad mode on inside it: ``create_graph=True``) differentiates the dense path
    (``rpm.ops._gaussian_mixture.dense_gaussian_mixture_log_prob``, recomputed from the saved
    inputs, O(M N) memory) instead, so the gradient it returns is itself differentiable with
    respect to the inputs and the incoming gradient (Hessian-vector products, gradient
    penalties)."""

    @staticmethod
    def forward(ctx, z, loc, scale, exclude_self: bool):
        num_points, num_comps = z.shape[0], loc.shape[0]
        with torch.no_grad():
            operands = kernel_operands(z, loc, scale)
            if num_points == 0:
                lse = z.new_empty(0)
            else:
                lse = row_log_sum_exp(operands, exclude_self)
        ctx.exclude_self = exclude_self
        ctx.save_for_backward(z, loc, scale, lse, *operands)
        return lse - math.log(num_comps - 1 if exclude_self else num_comps)

    @staticmethod
    def backward(ctx, grad):
        z, loc, scale, lse, *operands = ctx.saved_tensors
        needs = tuple(ctx.needs_input_grad[:3])
        if z.shape[0] == 0:
            zeros = (torch.zeros_like(z), torch.zeros_like(loc), torch.zeros_like(scale))
            return (*(t if need else None for t, need in zip(zeros, needs, strict=True)),
                    None)
        if torch.is_grad_enabled():
            return (*_differentiable_gradients(z, loc, scale, ctx.exclude_self, grad, needs),
                    None)
        with torch.no_grad():
            grads = mixture_gradients(operands, scale, ctx.exclude_self, lse, grad, needs)
        return (*grads, None)



def _differentiable_gradients(
    z: torch.Tensor, loc: torch.Tensor, scale: torch.Tensor, exclude_self: bool,
    grad: torch.Tensor, needs: tuple[bool, bool, bool],
) -> tuple[torch.Tensor | None, ...]:
    """The gradients of sum_m grad_m log Q(z_m) for (z, loc, scale) (None where not needed)
    as a differentiable graph of the inputs and ``grad``: autograd through the dense path."""
    from rpm.ops._gaussian_mixture import dense_gaussian_mixture_log_prob

    wanted = [t for t, need in zip((z, loc, scale), needs, strict=True) if need]
    values = dense_gaussian_mixture_log_prob(z, loc, scale, exclude_self)
    found = iter(torch.autograd.grad(values, wanted, grad, create_graph=True))
    return tuple(next(found) if need else None for need in needs)
