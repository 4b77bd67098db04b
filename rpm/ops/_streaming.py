r"""The minibatch-mixture marginal streamed in blocks: O((M + N) D) memory, any batch size.

The mixture marginal of Eq. 11 of Aitchison & Ganev over N diagonal Gaussian components,

.. math::

    \log Q(z_m) = \operatorname{logsumexp}_n L_{mn} - \log N, \qquad
    L_{mn} = \ell_n - \tfrac12 \sum_d \frac{(z_{md} - \mu_{nd})^2}{\sigma_{nd}^2}, \qquad
    \ell_n = -\sum_d \log \sigma_{nd} - \tfrac D2 \log 2\pi,

is the only O(MN) part of an RPM step. Here it is computed the way flash attention computes a
softmax normaliser: the M x N matrix L is never stored. Rows and columns are visited in blocks
of ``block_size``; each block of L comes from two matrix products with D columns,

.. math::

    L_{mn} = \ell_n - \tfrac12 r_n - \tfrac12 \tilde z_m^{2\top} w_n
    - \tfrac12 \tilde z_m^\top v_n, \qquad v_n = -2 \tilde\mu_n \odot w_n,

(:math:`w_{nd} = \sigma_{nd}^{-2}`; tildes: centred on the component's anchor, see
``rpm.ops._mixture_terms``), and the row log-sum-exp is accumulated online,
:math:`\mathrm{lse} \leftarrow \log(e^{\mathrm{lse}} + \sum_{n \in \text{block}} e^{L_{mn}})`.
The backward pass recomputes every block from the saved row log-sum-exps,
:math:`P_{mn} = e^{L_{mn} - \mathrm{lse}_m}`, and accumulates :math:`P [w, v]` (for the points)
and :math:`P^\top (g \odot [\tilde z^2, \tilde z, 1])` (for the components): products of the
size of L, four in all with the forward's two; memory O((M + N) D) plus one block.

Float32 accuracy: the pairs whose expansion may be materially worse than the direct form and
that can matter for the log-sum-exp are recomputed in the difference form, block by block
(the rule of ``rpm.ops._mixture_terms``; the row maximum it needs is tracked online, so the
set is a superset of the one the full matrix would give); their gradient is taken in the
difference form too. The normalisers :math:`\ell_n` are summed in float64.

Speed. Each row block visits its diagonal column block first (when the points were drawn from
the components, it holds the row maxima, so the online threshold is tight at once); exponents
are raised to :func:`~rpm.ops._logsumexp.exp_floor` below the block's row maximum (subnormal
``exp`` is ~30-60x slower on CPUs; the sum is unchanged in the dtype, see
``rpm.ops._logsumexp``); TF32 is off for every product
(:func:`~rpm.ops._dispatch.ieee_float32_matmul`).

Compilation. The block computation is plain tensor algebra; the Python loops over blocks, the
choice of anchors and the selection of the pairs to refine (``nonzero``) run eagerly, so
``torch.compile`` compiles the kernel with graph breaks at those points.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from rpm._validation import check_positive_int
from rpm.ops._dispatch import default_block_size, ieee_float32_matmul
from rpm.ops._logsumexp import _block_logsumexp, _block_softmax
from rpm.ops._mixture_terms import REFINE_MARGIN, MixtureTerms, check_mixture_arguments

__all__ = ["check_mixture_arguments", "streaming_gaussian_mixture_log_prob"]


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
            terms = MixtureTerms(loc, scale, permute_points=num_points == num_comps)
            points = terms.permute_rows(z)
            lse = z.new_full((num_points,), -math.inf)  # (M,), kernel order
            row_max = z.new_full((num_points,), -math.inf)  # (M,) lower bound of row maxima
            for r0 in range(0, num_points, block_size):
                r1 = min(r0 + block_size, num_points)
                rows_z, lse_rows, max_rows = points[r0:r1], lse[r0:r1], row_max[r0:r1]
                for index in _column_blocks(r0, num_comps, block_size):
                    c0, c1 = index * block_size, min((index + 1) * block_size, num_comps)
                    log_comp, products = terms.block(rows_z, c0, c1)  # (bm, bn) each
                    if exclude_self:
                        _mask_self(log_comp, r0, c0)
                    top, lower = terms.row_bounds(log_comp, products, c0)
                    torch.maximum(max_rows, lower, out=max_rows)
                    refined = terms.refinement(log_comp, products, c0, max_rows - REFINE_MARGIN)
                    del products
                    if refined is not None:  # exact values may exceed the old maxima
                        rows, cols = refined
                        log_comp[rows, cols] = terms.exact(rows_z, rows, cols + c0)
                        top = log_comp.amax(1)
                    torch.logaddexp(lse_rows, _block_logsumexp(log_comp, top), out=lse_rows)
        ctx.exclude_self, ctx.block_size = exclude_self, block_size
        ctx.save_for_backward(z, loc, scale, lse, row_max)
        log_count = math.log(num_comps - 1 if exclude_self else num_comps)
        return terms.unpermute_rows(lse) - log_count

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        z, loc, scale, lse, row_max = ctx.saved_tensors
        block_size = ctx.block_size
        num_points, dim = z.shape
        num_comps = loc.shape[0]
        with torch.no_grad(), ieee_float32_matmul():
            terms = MixtureTerms(loc, scale, permute_points=num_points == num_comps)
            points = terms.permute_rows(z)
            grad = terms.permute_rows(grad)
            grads = _ComponentGrads(terms)
            factors = torch.cat([terms.weight, terms.cross], 1)  # (N, 2D): [w, v]
            grad_points = torch.zeros_like(points)  # (M, D), kernel order
            for r0 in range(0, num_points, block_size):
                r1 = min(r0 + block_size, num_points)
                rows_z, g, grad_rows = points[r0:r1], grad[r0:r1], grad_points[r0:r1]
                threshold = row_max[r0:r1] - REFINE_MARGIN
                for index in _column_blocks(r0, num_comps, block_size):
                    c0, c1 = index * block_size, min((index + 1) * block_size, num_comps)
                    prob, products = terms.block(rows_z, c0, c1)  # L, then P in place
                    if ctx.exclude_self:
                        _mask_self(prob, r0, c0)
                    refined = terms.refinement(prob, products, c0, threshold)
                    del products
                    if refined is not None:
                        rows, cols = refined
                        prob[rows, cols] = terms.exact(rows_z, rows, cols + c0)
                    _block_softmax(prob, lse[r0:r1])  # P_mn = exp(L_mn - lse_m)
                    if refined is not None:
                        weight = prob[rows, cols] * g[rows]  # (K,): dLoss / dL_mn
                        prob[rows, cols] = 0.0  # their gradient is taken exactly instead
                        grads.add_exact(rows_z, rows, cols + c0, weight, grad_rows)
                    for anchor, start, stop in terms.segments(c0, c1):
                        part = prob[:, start - c0:stop - c0]  # (bm, bs)
                        z_c = rows_z - terms.anchors[anchor]  # (bm, D)
                        acc = part @ factors[start:stop]  # (bm, 2D): sum_n P [w_n, v_n]
                        # dL/dz = -(z_c w + v / 2): grad_z -= g (z_c sum P w + sum P v / 2)
                        acc[:, :dim].mul_(z_c).add_(acc[:, dim:], alpha=0.5)
                        grad_rows.addcmul_(acc[:, :dim], g[:, None], value=-1.0)
                        left = torch.cat([z_c.square(), z_c, torch.ones_like(z_c[:, :1])], 1)
                        grads.acc_right[start:stop].addmm_(part.T, left.mul_(g[:, None]))
            grad_loc, grad_scale = grads.finish()
        return (terms.unpermute_rows(grad_points), terms.unpermute_components(grad_loc),
                terms.unpermute_components(grad_scale), None, None)


class _ComponentGrads:
    """Accumulates the gradients of the components (matrix-product part and exact pairs), in
    the kernel's order of the components."""

    def __init__(self, terms: MixtureTerms):
        self.terms = terms
        dim = terms.dim
        # sum_m g_m P_mn [z_c^2, z_c, 1]: (N, 2D + 1)
        self.acc_right = terms.weight.new_zeros(terms.weight.shape[0], 2 * dim + 1)
        self.grad_loc = torch.zeros_like(terms.weight)  # (N, D)
        self.grad_scale = torch.zeros_like(terms.weight)  # (N, D)
        self.grad_log_norm = torch.zeros_like(terms.log_norm)  # (N,)

    def add_exact(
        self, z_rows: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, weight: torch.Tensor,
        grad_rows: torch.Tensor,
    ) -> None:
        """Gradient of sum_k weight_k L_k for recomputed pairs k = (row, col), difference form.

        With u = (z_r - mu_c) / sigma_c and L = l_c - |u|^2 / 2: dL/dz_r = -u / sigma_c,
        dL/dmu_c = u / sigma_c, dL/dsigma_c = u^2 / sigma_c (plus dl_c/dsigma_c via l_c).
        """
        terms = self.terms
        inv = terms.scale[cols].reciprocal()  # (K, D)
        diff = (z_rows[rows] - terms.loc[cols]) * inv  # (K, D): u
        term = weight[:, None] * diff * inv  # (K, D): weight u / sigma
        # index_put_ with accumulate, not index_add_: the latter is ~1e4 times slower on a
        # busy multi-threaded CPU (its scatter kernel waits on every thread).
        grad_rows.index_put_((rows,), -term, accumulate=True)
        self.grad_loc.index_put_((cols,), term, accumulate=True)
        self.grad_scale.index_put_((cols,), term * diff, accumulate=True)
        self.grad_log_norm.index_put_((cols,), weight, accumulate=True)

    def finish(self) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Chains the accumulated sums to (loc, scale); returns their gradients, (N, D) each.

        With :math:`S_2, S_1, S_0` the columns of ``acc_right`` and
        :math:`L = \ell - \tfrac12 (\sum_d \tilde z^2 w - 2 \sum_d \tilde z \tilde\mu w +
        \sum_d \tilde\mu^2 w)`: :math:`\partial/\partial w = -\tfrac12 (S_2 - 2 \tilde\mu S_1 +
        \tilde\mu^2 S_0)`, :math:`\partial/\partial\mu = w (S_1 - \tilde\mu S_0)`,
        :math:`\partial/\partial\ell = S_0`; then :math:`w = \sigma^{-2}`,
        :math:`\ell = -\sum_d \log\sigma_d + \text{const}`.
        """
        terms, dim = self.terms, self.terms.dim
        s2, s1 = self.acc_right[:, :dim], self.acc_right[:, dim:2 * dim]
        s0 = self.acc_right[:, 2 * dim:]  # (N, 1)
        self.grad_log_norm += s0[:, 0]
        loc_c, weight = terms.loc_c, terms.weight
        temp = torch.mul(loc_c, s0)  # (N, D): mu_c S0
        self.grad_loc.addcmul_(weight, s1 - temp)
        # dLoss/dw = -0.5 (S2 - 2 mu_c S1 + mu_c^2 S0) = -0.5 S2 + mu_c (S1 - mu_c S0 / 2)
        grad_weight = temp.mul_(-0.5).add_(s1).mul_(loc_c).add_(s2, alpha=-0.5)
        # w = sigma^-2: dw/dsigma = -2 w / sigma; l = -sum log sigma: dl/dsigma = -1 / sigma.
        grad_weight.mul_(weight).mul_(-2.0).sub_(self.grad_log_norm[:, None])
        self.grad_scale.add_(grad_weight.div_(terms.scale))
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

    the minibatch-mixture recognition marginal (Eq. 11 of Aitchison & Ganev), equal to
    :func:`~rpm.ops.gaussian_mixture_log_prob` but computed in blocks of ``block_size`` x
    ``block_size`` with an online log-sum-exp and a backward pass that recomputes the blocks
    (see the module docstring). Memory: O((M + N) D) plus one block, for the forward and the
    backward pass. Float32 stays within 1e-4 of float64 (TF32 is switched off; the pairs whose
    expansion cancels are recomputed exactly). Not twice differentiable.

    :param torch.Tensor z: points, shape (M, D).
    :param torch.Tensor loc: component means, shape (N, D).
    :param torch.Tensor scale: component standard deviations, shape (N, D), positive.
    :param bool exclude_self: drop the diagonal pair (m, m); requires M == N and N >= 2.
    :param block_size: rows and columns per block (any positive integer); ``None`` picks
        ``rpm.ops._dispatch.default_block_size`` of the device.
    :return: log Q(z_m), shape (M,).
    :rtype: torch.Tensor
    """
    check_mixture_arguments(z, loc, scale, exclude_self)
    if block_size is None:
        block_size = default_block_size(z.device)
    check_positive_int("block_size", block_size)
    return _StreamingGaussianMixture.apply(z, loc, scale, bool(exclude_self), block_size)
