r"""The minibatch-mixture marginal streamed in blocks: O((M + N) D) memory, any batch size.

The mixture marginal of Eq. 11 of Aitchison & Ganev over N diagonal Gaussian components,

.. math::

    \log Q(z_m) = \operatorname{logsumexp}_n L_{mn} - \log N, \qquad
    L_{mn} = \ell_n - \tfrac12 \sum_d \frac{(z_{md} - \mu_{nd})^2}{\sigma_{nd}^2}, \qquad
    \ell_n = -\sum_d \log \sigma_{nd} - \tfrac D2 \log 2\pi,

is the only O(MN) part of an RPM step. Here it is computed the way flash attention computes a
softmax normaliser: the M x N matrix L is never stored. Rows and columns are visited in blocks
of ``block_size``; each block of L comes from one matrix product

.. math::

    L_{mn} = \ell_n - \tfrac12 \, a_m^\top b_n, \qquad
    a_m = [\tilde z_m^{2},\ \tilde z_m,\ 1], \qquad
    b_n = [w_n,\ -2\, \tilde\mu_n w_n,\ \textstyle\sum_d \tilde\mu_{nd}^2 w_{nd}],

(:math:`w_{nd} = \sigma_{nd}^{-2}`, tildes: centred on the mean location), and the row
log-sum-exp is accumulated online, :math:`\mathrm{lse} \leftarrow \log(e^{\mathrm{lse}} +
\sum_{n \in \text{block}} e^{L_{mn}})`. The backward pass recomputes every block from the
saved row log-sum-exps, :math:`P_{mn} = e^{L_{mn} - \mathrm{lse}_m}`, and accumulates
:math:`P B` and :math:`P^\top (g \odot A)`: four matrix products of the size of L in all (one
forward, three backward), memory O((M + N) D) plus one block.

Float32 accuracy. The expansion loses digits when :math:`\tilde z_m^\top w_n \tilde z_m +
\tilde\mu_n^\top w_n \tilde\mu_n` is much larger than the quadratic form
:math:`q_{mn}` itself (points far from the centre in units of the component's scale). As in
:func:`~rpm.ops.gaussian_mixture_log_prob`, the pairs that can matter are recomputed in
the exact difference form, block by block. A pair is recomputed when

1. it may lie within ``_REFINE_MARGIN`` nats of its row maximum, allowing for the worst-case
   rounding of the expansion (the row maximum is tracked online, so the set is a superset of
   the one the full matrix would give), and
2. the expansion is materially worse than the direct form: the bound
   :math:`\tilde z^\top w \tilde z + \tilde\mu^\top w \tilde\mu \le q + 2\sqrt{q\, \tilde\mu^\top w
   \tilde\mu} + 2\, \tilde\mu^\top w \tilde\mu` (triangle inequality; needs only q and a
   per-component number) exceeds ``_REFINE_GAIN`` times q, and its typical rounding
   :math:`\tfrac12 \epsilon \sqrt D` times that bound exceeds ``_REFINE_TOLERANCE`` nats.

Condition 2 keeps heavily overlapping mixtures (every pair near the maximum, no cancellation)
from being recomputed pair by pair. The gradient of a recomputed pair is also taken in the
difference form. The normalisers :math:`\ell_n` are summed in float64.

Speed. Each row block visits its diagonal column block first (when the points were drawn
from the components, it holds the row maxima, so the online threshold is tight at once); a
block's rows whose maximum rules out every candidate skip the refinement tests; exponents are
clamped at the smallest normal float (subnormal ``exp`` is ~10x slower on CPUs; the change is
below 1e-37 of a row's sum); TF32 is off for every product.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from rpm.ops.dispatch import default_block_size, ieee_float32_matmul
from rpm.ops.logsumexp import _block_logsumexp, _block_softmax

__all__ = ["check_mixture_arguments", "streaming_gaussian_mixture_log_prob"]

# Pairs further than this below the row maximum (in nats) have relative weight < e^-30.
_REFINE_MARGIN = 30.0
# A pair whose typical expansion rounding (nats) is below this is accurate enough as it is.
_REFINE_TOLERANCE = 5e-5
# ... and so is a pair whose expansion is at most this many times worse than the direct form.
_REFINE_GAIN = 2.0
# Condition 2 with bound = q + 2 sqrt(q ll) + 2 ll holds for q / ll < _GAIN_RATIO only:
# (g - 1) t^2 - 2 t - 2 < 0 with t = sqrt(q / ll).
_GAIN_RATIO = ((1.0 + math.sqrt(2.0 * _REFINE_GAIN - 1.0)) / (_REFINE_GAIN - 1.0)) ** 2
# Rows per chunk of the float64 log-determinant (bounds its temporary).
_LOG_DET_CHUNK = 1 << 14


def check_mixture_arguments(z: torch.Tensor, loc: torch.Tensor, scale: torch.Tensor) -> None:
    """Validates the shapes and dtypes of a mixture evaluation, raising ``ValueError``.

    :param torch.Tensor z: points, shape (M, D).
    :param torch.Tensor loc: component means, shape (N, D).
    :param torch.Tensor scale: component standard deviations, shape (N, D) (or broadcastable
        to it), all positive.
    """
    if z.dim() != 2 or loc.dim() != 2:
        raise ValueError(
            f"expected z of shape (M, D) and loc of shape (N, D), got z {tuple(z.shape)} and "
            f"loc {tuple(loc.shape)}; flatten any extra batch dimensions first"
        )
    if z.shape[1] != loc.shape[1]:
        raise ValueError(
            f"z has dimension {z.shape[1]} but the components have dimension {loc.shape[1]}: "
            "the points and the mixture must live in the same latent space"
        )
    if loc.shape[0] < 1:
        raise ValueError("the mixture needs at least one component, got loc with 0 rows")
    if scale.shape != loc.shape:
        raise ValueError(
            f"scale must have the shape of loc {tuple(loc.shape)}, got {tuple(scale.shape)}; "
            "use scale.expand_as(loc) for a shared scale"
        )
    if not (z.dtype == loc.dtype == scale.dtype):
        raise ValueError(
            f"z, loc and scale must share a dtype, got {z.dtype}, {loc.dtype}, {scale.dtype}"
        )


class _Components:
    """Everything about the N components that the blocks need, O(N D), computed once.

    ``right`` is the (N, 2D + 1) matrix B of the module docstring (its first D columns are
    the weights w); ``log_norm`` is :math:`\\ell_n`; ``sq_norm`` is
    :math:`\\tilde\\mu_n^\\top w_n \\tilde\\mu_n`. Built in place: one (N, 2D + 1) matrix
    and one (N, D) temporary at most.
    """

    def __init__(self, loc: torch.Tensor, scale: torch.Tensor):
        num, dim = loc.shape
        self.loc, self.scale, self.dim = loc, scale, dim
        self.centre = loc.mean(0, keepdim=True)  # (1, D)
        self.right = loc.new_empty(num, 2 * dim + 1)  # (N, 2D + 1)
        weight = self.right[:, :dim]
        weight.copy_(scale).reciprocal_().square_()  # w = 1 / sigma^2
        middle = self.right[:, dim:2 * dim]
        middle.copy_(loc).sub_(self.centre)  # mu - centre, for now
        self.sq_norm = torch.einsum("nd,nd->n", middle * weight, middle)  # (N,)
        middle.mul_(weight).mul_(-2.0)  # -2 (mu - centre) w
        self.right[:, 2 * dim] = self.sq_norm
        # Sum of D logarithms in float64 (in float32 it alone would carry ~1e-4 of rounding),
        # in chunks of rows to bound the float64 temporary.
        log_det = torch.cat([
            scale[s:s + _LOG_DET_CHUNK].double().log().sum(-1)
            for s in range(0, num, _LOG_DET_CHUNK)
        ]).to(loc.dtype)  # (N,)
        self.log_norm = -log_det - 0.5 * dim * math.log(2 * math.pi)  # (N,)

    @property
    def weight(self) -> torch.Tensor:
        """w = 1 / sigma^2, a view of ``right``, shape (N, D)."""
        return self.right[:, :self.dim]

    def left(self, z: torch.Tensor) -> torch.Tensor:
        """The (M, 2D + 1) matrix A for points z (M, D)."""
        left = z.new_empty(z.shape[0], 2 * self.dim + 1)
        z_c = left[:, self.dim:2 * self.dim]
        torch.sub(z, self.centre, out=z_c)
        torch.square(z_c, out=left[:, :self.dim])
        left[:, 2 * self.dim] = 1.0
        return left


class _Refiner:
    """Finds and recomputes, block by block, the pairs whose float32 expansion is inaccurate.

    Condition 2 of the module docstring depends on a pair only through q and the component's
    ll = mu^T w mu, and holds exactly on a window q_min(ll) < q < _GAIN_RATIO ll, that is
    ``low_n <= L_mn <= high_n``: a per-component window of L, computed once.
    """

    def __init__(self, z: torch.Tensor, comps: _Components, block_size: int):
        dtype = z.dtype
        dim = z.shape[1]
        self.z, self.comps = z, comps
        self.active = dtype != torch.float64
        if not self.active:
            return
        eps = torch.finfo(dtype).eps
        # Worst-case rounding of the expansion, per unit of z^T w z + mu^T w mu (as in the
        # dense path), and the smallest bound whose typical rounding exceeds the tolerance.
        self.half_slack = 0.5 * (4.0 + dim) * eps
        min_bound = 2.0 * _REFINE_TOLERANCE / (eps * math.sqrt(dim))
        sq_norm, log_norm = comps.sq_norm, comps.log_norm
        # bound(q) = (sqrt q + sqrt ll)^2 + ll > min_bound  <=>  sqrt q > sqrt(min_bound - ll)
        # - sqrt ll (any q when min_bound < 2 ll).
        root = (min_bound - sq_norm).clamp_min(0.0).sqrt() - sq_norm.sqrt()
        quad_min = root.clamp_min(0.0).square()  # (N,)
        quad_max = _GAIN_RATIO * sq_norm  # (N,)
        possible = quad_min < quad_max
        self.low = torch.where(possible, log_norm - 0.5 * quad_max, math.inf)  # (N,)
        self.high = torch.where(
            quad_min > 0, log_norm - 0.5 * quad_min, math.inf
        )  # (N,): no upper limit when any q qualifies (L may exceed l by rounding)
        num = sq_norm.shape[0]
        self.block_active = torch.stack(
            [possible[s:s + block_size].any() for s in range(0, num, block_size)]
        ).tolist()

    def refine(
        self, log_comp: torch.Tensor, top: torch.Tensor, r0: int, c0: int, block_index: int,
        row_max: torch.Tensor, update: bool,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Overwrites the inaccurate entries of a block of L with exact values, in place.

        The row maxima give a lower bound of each row's largest term (when ``update``) and
        rule out the rows that cannot hold a candidate; for the remaining rows,
        broadcast comparisons with the per-component window of condition 2 and a superset of
        the near pairs, and ``nonzero``; the exact near condition is then evaluated on the K
        candidates only. Away from the diagonal block of well-separated mixtures, no row
        remains after the first pass.

        :param log_comp: the block of L, rows r0.., columns c0.., shape (bm, bn).
        :param top: the row maxima of the block, shape (bm,).
        :param int block_index: index of the column block (c0 // block_size).
        :param row_max: running lower bound of each row's largest exact term, shape (bm,);
            raised in place when ``update``.
        :return: the local (row, column) indices of the recomputed pairs, or None.
        """
        if not (self.active and self.block_active[block_index]):
            return None
        comps, hs = self.comps, self.half_slack
        cols = slice(c0, c0 + log_comp.shape[1])
        sq_norm, log_norm = comps.sq_norm[cols], comps.log_norm[cols]  # (bn,)
        low, high = self.low[cols], self.high[cols]  # (bn,)
        if update:
            # The exact term of the block's largest entry is at least that entry minus its
            # slack, hs * bound <= hs (2 q + 3 ll) <= hs (4 (max l - top) + 3 max ll).
            slack = hs * (4.0 * (log_norm.max() - top).clamp_min(0.0) + 3.0 * sq_norm.max())
            lower = (top - slack).nan_to_num_(nan=-math.inf)
            torch.maximum(row_max, lower, out=row_max)
        threshold = row_max - _REFINE_MARGIN  # (bm,)
        # A pair is near when L + hs * bound >= threshold; bound <= 2 q + 3 ll with
        # q = 2 (l - L), so L (1 - 4 hs) >= threshold - hs (4 l + 3 ll) keeps every near pair.
        offset = hs * (4.0 * log_norm + 3.0 * sq_norm) / (1.0 - 4.0 * hs)  # (bn,)
        row_threshold = threshold / (1.0 - 4.0 * hs)  # (bm,)
        possible = (top + offset.max() >= row_threshold) & (top >= low.min())  # (bm,)
        selected = torch.nonzero(possible).squeeze(1)  # (k,)
        if selected.numel() == 0:
            return None
        whole = selected.numel() == log_comp.shape[0]
        sub = log_comp if whole else log_comp[selected]  # (k, bn)
        candidates = (sub + offset) >= row_threshold[selected, None]
        candidates &= sub >= low
        candidates &= sub <= high
        rows, cols_local = torch.nonzero(candidates, as_tuple=True)  # (K,)
        del candidates, sub
        if rows.numel() == 0:
            return None
        rows = selected[rows]
        values = log_comp[rows, cols_local]  # (K,)
        bound = _bound(log_norm[cols_local], values, sq_norm[cols_local])  # (K,)
        keep = values + hs * bound >= threshold[rows]
        rows, cols_local = rows[keep], cols_local[keep]
        if rows.numel() == 0:
            return None
        exact = _exact_quadratic(self.z, comps, rows + r0, cols_local + c0)
        log_comp[rows, cols_local] = comps.log_norm[cols_local + c0] - 0.5 * exact
        return rows, cols_local


def _bound(log_norm: torch.Tensor, values: torch.Tensor, sq_norm: torch.Tensor) -> torch.Tensor:
    """Upper bound of z^T w z + mu^T w mu from q = 2 (l - L) and ll = mu^T w mu (centred).

    With u = sqrt(w) z and v = sqrt(w) mu, |u| <= |u - v| + |v| = sqrt(q) + sqrt(ll), so
    z^T w z + ll <= q + 2 sqrt(q ll) + 2 ll.
    """
    quad = (2.0 * (log_norm - values)).clamp_min(0.0)
    return quad + 2.0 * (quad * sq_norm).sqrt() + 2.0 * sq_norm


def _exact_quadratic(
    z: torch.Tensor, comps: _Components, rows: torch.Tensor, cols: torch.Tensor
) -> torch.Tensor:
    """sum_d ((z_rd - mu_cd) / sigma_cd)^2 for the listed (row, column) pairs, shape (K,)."""
    diff = (z[rows] - comps.loc[cols]) / comps.scale[cols]  # (K, D)
    return diff.square().sum(-1)


def _column_blocks(r0: int, num_comps: int, block_size: int) -> list[int]:
    """Column-block indices for the row block starting at r0, its diagonal block first.

    When the points were drawn from the components (z_m ~ component m), the diagonal block
    holds each row's largest term, so the online row maximum, and with it the set of pairs to
    refine, is tight from the first block on.
    """
    num_blocks = -(-num_comps // block_size)
    first = min(r0 // block_size, num_blocks - 1)
    return [(first + k) % num_blocks for k in range(num_blocks)]


def _mask_self(log_comp: torch.Tensor, r0: int, c0: int) -> None:
    """Sets L[m, m] = -inf for the global diagonal inside the block at (r0, c0)."""
    log_comp.diagonal(c0 - r0).fill_(-math.inf)


class _StreamingGaussianMixture(torch.autograd.Function):
    """Block-wise log-sum-exp of L with a recomputing backward (see the module docstring)."""

    @staticmethod
    def forward(ctx, z, loc, scale, exclude_self: bool, block_size: int):
        num_points, num_comps = z.shape[0], loc.shape[0]
        with torch.no_grad(), ieee_float32_matmul():
            comps = _Components(loc, scale)
            refiner = _Refiner(z, comps, block_size)
            lse = z.new_full((num_points,), -math.inf)  # (M,)
            row_max = z.new_full((num_points,), -math.inf)  # (M,) lower bound of row maxima
            for r0 in range(0, num_points, block_size):
                r1 = min(r0 + block_size, num_points)
                left = comps.left(z[r0:r1])  # (bm, 2D + 1)
                lse_rows = lse[r0:r1]
                for index in _column_blocks(r0, num_comps, block_size):
                    c0, c1 = index * block_size, min((index + 1) * block_size, num_comps)
                    log_comp = torch.addmm(
                        comps.log_norm[c0:c1], left, comps.right[c0:c1].T, alpha=-0.5
                    )  # (bm, bn)
                    if exclude_self:
                        _mask_self(log_comp, r0, c0)
                    top = log_comp.amax(1)  # (bm,)
                    refined = refiner.refine(
                        log_comp, top, r0, c0, index, row_max[r0:r1], update=True
                    )
                    if refined is not None:  # exact values may exceed the old maxima
                        top = log_comp.amax(1)
                    torch.logaddexp(lse_rows, _block_logsumexp(log_comp, top), out=lse_rows)
        ctx.exclude_self, ctx.block_size = exclude_self, block_size
        ctx.save_for_backward(z, loc, scale, lse, row_max)
        return lse - math.log(num_comps - 1 if exclude_self else num_comps)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        z, loc, scale, lse, row_max = ctx.saved_tensors
        block_size = ctx.block_size
        num_points, dim = z.shape
        num_comps = loc.shape[0]
        with torch.no_grad(), ieee_float32_matmul():
            comps = _Components(loc, scale)
            refiner = _Refiner(z, comps, block_size)
            grads = _ComponentGrads(comps)
            grad_z = torch.empty_like(z)  # (M, D)
            for r0 in range(0, num_points, block_size):
                r1 = min(r0 + block_size, num_points)
                left = comps.left(z[r0:r1])  # (bm, 2D + 1)
                g = grad[r0:r1]  # (bm,)
                scaled_left = left * g[:, None]  # (bm, 2D + 1)
                acc_left = torch.zeros_like(left)  # (bm, 2D + 1): sum_n P_mn b_n
                grad_z_exact = torch.zeros_like(z[r0:r1])  # (bm, D)
                for index in _column_blocks(r0, num_comps, block_size):
                    c0, c1 = index * block_size, min((index + 1) * block_size, num_comps)
                    prob = torch.addmm(
                        comps.log_norm[c0:c1], left, comps.right[c0:c1].T, alpha=-0.5
                    )  # (bm, bn): L, then P in place
                    if ctx.exclude_self:
                        _mask_self(prob, r0, c0)
                    refined = None
                    if refiner.active and refiner.block_active[index]:
                        refined = refiner.refine(
                            prob, prob.amax(1), r0, c0, index, row_max[r0:r1], update=False
                        )
                    _block_softmax(prob, lse[r0:r1])  # P_mn = exp(L_mn - lse_m)
                    if refined is not None:
                        rows, cols = refined
                        weight = prob[rows, cols] * g[rows]  # (K,): dLoss / dL_mn
                        prob[rows, cols] = 0.0  # their gradient is taken exactly instead
                        grads.add_exact(z, rows + r0, cols + c0, weight, grad_z_exact, rows)
                    acc_left.addmm_(prob, comps.right[c0:c1])
                    grads.acc_right[c0:c1].addmm_(prob.T, scaled_left)
                # a = [z_c^2, z_c, 1] and dLoss/da = -0.5 g (P B): dLoss/dz = 2 z_c da_1 + da_2.
                d_left = acc_left.mul_(-0.5 * g[:, None])
                z_c = z[r0:r1] - comps.centre
                grad_z[r0:r1] = (
                    2.0 * z_c * d_left[:, :dim] + d_left[:, dim:2 * dim] + grad_z_exact
                )
            grad_loc, grad_scale = grads.finish()
        return grad_z, grad_loc, grad_scale, None, None


class _ComponentGrads:
    """Accumulates the gradients of the components (matrix-product part and exact pairs)."""

    def __init__(self, comps: _Components):
        self.comps = comps
        self.acc_right = torch.zeros_like(comps.right)  # (N, 2D + 1): sum_m P_mn g_m a_m
        self.grad_loc = torch.zeros_like(comps.weight)  # (N, D)
        self.grad_scale = torch.zeros_like(comps.weight)  # (N, D)
        self.grad_log_norm = torch.zeros_like(comps.log_norm)  # (N,)

    def add_exact(
        self, z: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, weight: torch.Tensor,
        grad_z_rows: torch.Tensor, local_rows: torch.Tensor,
    ) -> None:
        """Gradient of sum_k weight_k L_k for recomputed pairs k = (row, col), difference form.

        With u = (z_r - mu_c) / sigma_c and L = l_c - |u|^2 / 2: dL/dz_r = -u / sigma_c,
        dL/dmu_c = u / sigma_c, dL/dsigma_c = u^2 / sigma_c (plus dl_c/dsigma_c via l_c).
        """
        comps = self.comps
        inv = comps.scale[cols].reciprocal()  # (K, D)
        diff = (z[rows] - comps.loc[cols]) * inv  # (K, D): u
        term = weight[:, None] * diff * inv  # (K, D): weight u / sigma
        # index_put_ with accumulate, not index_add_: the latter is ~1e4 times slower on a
        # busy multi-threaded CPU (its scatter kernel waits on every thread).
        grad_z_rows.index_put_((local_rows,), -term, accumulate=True)
        self.grad_loc.index_put_((cols,), term, accumulate=True)
        self.grad_scale.index_put_((cols,), term * diff, accumulate=True)
        self.grad_log_norm.index_put_((cols,), weight, accumulate=True)

    def finish(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Chains the accumulated d/db_n to (loc, scale); returns their gradients, (N, D) each.

        b = [w, -2 mu w, mu^T w mu] (centred mu) and dLoss/db = -0.5 sum_m P_mn g_m a_m; the
        last column of a is 1, so that column of the sum is also dLoss/dl_n. In place, with
        two (N, D) temporaries.
        """
        comps, dim = self.comps, self.comps.dim
        self.grad_log_norm += self.acc_right[:, 2 * dim]
        d_right = self.acc_right.mul_(-0.5)
        d_w, d_wmu, d_ll = d_right[:, :dim], d_right[:, dim:2 * dim], d_right[:, 2 * dim:]
        weight = comps.weight
        loc_c = comps.loc - comps.centre  # (N, D)
        # dLoss/dmu = 2 w (mu d_ll - d_wmu); dLoss/dw = d_w - 2 mu d_wmu + mu^2 d_ll.
        temp = torch.mul(loc_c, d_ll)  # (N, D)
        self.grad_loc.addcmul_(weight, temp.sub(d_wmu), value=2.0)
        temp.sub_(d_wmu, alpha=2.0).mul_(loc_c)
        del loc_c
        grad_weight = d_w.add_(temp)  # (N, D), in the storage of acc_right
        # w = sigma^-2: dw/dsigma = -2 w / sigma; l = -sum log sigma: dl/dsigma = -1 / sigma.
        torch.mul(grad_weight, weight, out=temp).mul_(-2.0).sub_(self.grad_log_norm[:, None])
        self.grad_scale.add_(temp.div_(comps.scale))
        return self.grad_loc, self.grad_scale


def streaming_gaussian_mixture_log_prob(
    z: torch.Tensor, loc: torch.Tensor, scale: torch.Tensor, exclude_self: bool = False,
    block_size: int | None = None,
) -> torch.Tensor:
    r"""Log-density of points under an equally weighted diagonal Gaussian mixture, in blocks.

    .. math::

        \log Q(z_m) = \operatorname{logsumexp}_n \Big[ -\tfrac12 \sum_d
            \frac{(z_{md} - \mu_{nd})^2}{\sigma_{nd}^2} - \sum_d \log \sigma_{nd}
            - \tfrac{D}{2} \log 2\pi \Big] - \log N

    the minibatch-mixture recognition marginal (Eq. 11 of Aitchison & Ganev),
    equal to :func:`~rpm.ops.gaussian_mixture_log_prob` but computed in blocks of
    ``block_size`` x ``block_size`` with an online log-sum-exp and a backward pass that
    recomputes the blocks (see the module docstring). Memory: O((M + N) D) plus one block,
    for the forward and the backward pass. Float32 stays within 1e-4 of float64 (TF32 is
    switched off; near pairs are recomputed exactly). Not twice differentiable.

    :param torch.Tensor z: points, shape (M, D).
    :param torch.Tensor loc: component means, shape (N, D).
    :param torch.Tensor scale: component standard deviations, shape (N, D), positive.
    :param bool exclude_self: drop the diagonal pair (m, m); requires M == N and N >= 2.
    :param block_size: rows and columns per block (any positive integer); ``None`` picks
        :func:`default_block_size` of the device.
    :return: log Q(z_m), shape (M,).
    :rtype: torch.Tensor
    """
    check_mixture_arguments(z, loc, scale)
    if exclude_self and (z.shape[0] != loc.shape[0] or loc.shape[0] < 2):
        raise ValueError(
            "exclude_self=True pairs point m with component m, so it needs as many points as "
            f"components and at least 2 components; got {z.shape[0]} points and "
            f"{loc.shape[0]} components"
        )
    if block_size is None:
        block_size = default_block_size(z.device)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer or None, got {block_size!r}")
    if not z.dtype.is_floating_point:
        raise TypeError(f"expected floating-point z, loc and scale, got {z.dtype}")
    return _StreamingGaussianMixture.apply(z, loc, scale, bool(exclude_self), block_size)
