r"""The minibatch-mixture marginal of Gaussian recognition models, through matrix products.

The recognition marginal :math:`Q(z) = \mathbb{E}_{P_\text{true}(x)} Q(z|x)` (Eq. 4 and 11 of
Aitchison & Ganev) is estimated over a batch of N recognition distributions
:math:`Q(z|x_n) = \mathcal{N}(\mu_n, \operatorname{diag}\sigma_n^2)` as the mixture

.. math::

    \log Q(z_m) \approx \operatorname{logsumexp}_n \log \mathcal{N}(z_m; \mu_n, \sigma_n^2) - \log N.

The quadratic form is expanded so that the M x N matrix comes from matrix products instead of
an M x N x D broadcast:

.. math::

    \sum_d \frac{(z_{md} - \mu_{nd})^2}{\sigma_{nd}^2}
    = \sum_d \tilde z_{md}^2 w_{nd} - 2 \sum_d \tilde z_{md} \tilde\mu_{nd} w_{nd}
    + \sum_d \tilde\mu_{nd}^2 w_{nd}, \qquad w_{nd} = \sigma_{nd}^{-2},

centred on anchors (the mean location, plus one per far cluster of components), with the pairs
whose float32 expansion would cancel recomputed in the difference form: the rule of
``rpm.ops._mixture_terms``, shared with the streamed kernel.

On CUDA with Triton, the fused kernel (``fused_gaussian_mixture_log_prob``) computes every
pair in the difference form :math:`\sum_d w_{nd} (z_{md} - \mu_{nd})^2` instead, in registers,
block by block, with an online log-sum-exp and a backward pass that recomputes the blocks
(``rpm.ops._triton_mixture``, imported only when used).
"""

from __future__ import annotations

import math
import os

import torch

from rpm.ops._dispatch import (
    ieee_float32_matmul,
    triton_available,
    use_fused_mixture,
    use_streaming,
)
from rpm.ops._logsumexp import safe_logsumexp
from rpm.ops._mixture_terms import REFINE_MARGIN, MixtureTerms, check_mixture_arguments
from rpm.ops._streaming import streaming_gaussian_mixture_log_prob

__all__ = ["dense_gaussian_mixture_log_prob", "fused_gaussian_mixture_log_prob",
           "gaussian_mixture_log_prob"]


def fused_gaussian_mixture_log_prob(
    z: torch.Tensor, loc: torch.Tensor, scale: torch.Tensor, exclude_self: bool = False
) -> torch.Tensor:
    r""":func:`gaussian_mixture_log_prob` in fused Triton kernels (CUDA): no M x N matrix in
    memory, every pair in the difference form.

    .. math::

        \log Q(z_m) = \operatorname{logsumexp}_{n} \Big[ -\tfrac12 \sum_d
            \frac{(z_{md} - \mu_{nd})^2}{\sigma_{nd}^2} - \sum_d \log \sigma_{nd}
            - \tfrac{D}{2} \log 2\pi \Big] - \log N

    The forward kernel keeps each row's log-sum-exp online over blocks of components and saves
    only those; the backward kernels recompute each block's
    :math:`P_{mn} = e^{L_{mn} - \mathrm{lse}_m}` and reduce over the components (for z) and
    over the points (for loc and scale). The quadratic form is summed as
    :math:`\sum_d ((z_{md} - \mu_{nd}) w_{nd}) (z_{md} - \mu_{nd})`, :math:`w = \sigma^{-2}`,
    which does not cancel however far the points lie from the origin or how small the scales
    are; :math:`\sum_d \log\sigma_{nd}` is summed in float64. Memory O((M + N) D).

    Twice differentiable: a backward pass that builds a graph (``create_graph=True``, as a
    Hessian-vector product or a gradient penalty needs) recomputes the values through
    :func:`dense_gaussian_mixture_log_prob` and differentiates that, so its gradients are the
    dense path's and its memory O(M N); a first-order backward pass stays in the kernels.

    :param torch.Tensor z: points, shape (M, D), on a CUDA device (CPU tensors only under
        Triton's interpreter, ``TRITON_INTERPRET=1``).
    :param torch.Tensor loc: component means, shape (N, D).
    :param torch.Tensor scale: component standard deviations, shape (N, D), positive.
    :param bool exclude_self: drop the diagonal pair (m, m); requires M == N and N >= 2.
    :return: log Q(z_m), shape (M,).
    :rtype: torch.Tensor
    """
    check_mixture_arguments(z, loc, scale, exclude_self)
    if not triton_available():
        raise RuntimeError(
            "fused_gaussian_mixture_log_prob needs Triton (pip install triton, CUDA only); "
            "use gaussian_mixture_log_prob, which falls back to the dense or streamed path")
    if z.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            f"fused_gaussian_mixture_log_prob runs on CUDA tensors, got {z.device.type} "
            "tensors; use gaussian_mixture_log_prob (or set TRITON_INTERPRET=1 to interpret the "
            "kernels on the CPU, slowly)")
    from rpm.ops._triton_mixture import FusedGaussianMixture

    return FusedGaussianMixture.apply(z, loc, scale, bool(exclude_self))


def dense_gaussian_mixture_log_prob(
    z: torch.Tensor, loc: torch.Tensor, scale: torch.Tensor, exclude_self: bool = False
) -> torch.Tensor:
    r""":func:`gaussian_mixture_log_prob` on its dense path: the whole M x N matrix of
    log-components at once, differentiated by autograd (so twice differentiable).

    .. math::

        \log Q(z_m) = \operatorname{logsumexp}_{n} \Big[ -\tfrac12 \sum_d
            \frac{(z_{md} - \mu_{nd})^2}{\sigma_{nd}^2} - \sum_d \log \sigma_{nd}
            - \tfrac{D}{2} \log 2\pi \Big] - \log N

    (Eq. 11 of Aitchison & Ganev). Memory O(M N) (a few M x N temporaries).

    :param torch.Tensor z: points, shape (M, D).
    :param torch.Tensor loc: component means, shape (N, D).
    :param torch.Tensor scale: component standard deviations, shape (N, D), positive.
    :param bool exclude_self: drop the diagonal pair (m, m); requires M == N and N >= 2.
    :return: log Q(z_m), shape (M,).
    """
    check_mixture_arguments(z, loc, scale, exclude_self)
    num_points, num_components = z.shape[0], loc.shape[0]
    with ieee_float32_matmul():
        terms = MixtureTerms(loc, scale, permute_points=num_points == num_components)
        points = terms.permute_rows(z)
        log_components, products = terms.block(points, 0, num_components)  # (M, N) each
    if exclude_self:
        eye = torch.eye(num_points, dtype=torch.bool, device=z.device)
        log_components = log_components.masked_fill(eye, -math.inf)
        num_components -= 1
    with torch.no_grad():
        values = log_components.detach()
        _, lower = terms.row_bounds(values, products.detach(), 0)  # (M,)
        refined = terms.refinement(values, products.detach(), 0, lower - REFINE_MARGIN)
    del products
    if refined is not None:
        rows, cols = refined
        log_components = log_components.index_put((rows, cols), terms.exact(points, rows, cols))
    # safe_logsumexp raises terms more than ~86 nats (float32) below the row maximum to the
    # underflow floor: the sum is unchanged in the dtype and exp() stays out of the subnormal
    # range, which is ~30-60x slower on CPUs. Excluded pairs (-inf) get zero weight and gradient.
    lse = safe_logsumexp(log_components, dim=-1) - math.log(num_components)
    return terms.unpermute_rows(lse)


def gaussian_mixture_log_prob(
    z: torch.Tensor, loc: torch.Tensor, scale: torch.Tensor, exclude_self: bool = False,
    block_size: int | None = None, fused: bool | None = None,
) -> torch.Tensor:
    r"""Log-density of points under the equally weighted mixture of diagonal Gaussians.

    .. math::

        \log Q(z_m) = \operatorname{logsumexp}_{n} \Big[ -\tfrac12 \sum_d
            \frac{(z_{md} - \mu_{nd})^2}{\sigma_{nd}^2} - \sum_d \log \sigma_{nd}
            - \tfrac{D}{2} \log 2\pi \Big] - \log N

    the minibatch-mixture recognition marginal (Eq. 11 of Aitchison & Ganev). With
    ``exclude_self`` the m-th component is left out of the m-th row (a leave-one-out estimate,
    as used when z_m was sampled from component m) and the normaliser is :math:`\log(N - 1)`.

    Computed in the dtype of the inputs; float32 stays within 1e-4 of float64. Float32 CUDA
    inputs of at most ``rpm.ops._dispatch.FUSED_MAX_DIM`` dimensions go to the fused Triton
    kernel (``fused_gaussian_mixture_log_prob``, O((M + N) D) memory; a backward pass with
    ``create_graph=True`` recomputes through the dense path, so it is twice differentiable)
    when Triton is installed, no ``block_size`` is given and neither ``fused=False`` nor an
    enclosing :func:`~rpm.ops.fused_mixture_kernel` block with ``False`` forbids it
    (``rpm.ops._dispatch.use_fused_mixture``). Otherwise the dispatch policy
    ``rpm.ops._dispatch.use_streaming`` chooses between the dense path
    (``dense_gaussian_mixture_log_prob``, twice differentiable, O(M N) memory) and the
    streamed kernel (``rpm.ops._streaming.streaming_gaussian_mixture_log_prob``, O((M + N) D)
    memory); a ``block_size`` always streams.

    :param torch.Tensor z: points, shape (M, D).
    :param torch.Tensor loc: component means, shape (N, D).
    :param torch.Tensor scale: component standard deviations, shape (N, D), positive.
    :param bool exclude_self: drop the diagonal pair (m, m); requires M == N and N >= 2.
    :param block_size: stream in blocks of this many rows and columns; ``None`` lets the
        dispatch policy decide by size and device.
    :param fused: ``None`` (automatic, as above), ``True`` to run the fused kernel (any
        dtype and width; it raises where it cannot run: no Triton, or not CUDA outside
        Triton's interpreter), ``False`` never to; the call's choice takes precedence over
        :func:`~rpm.ops.fused_mixture_kernel`.
    :return: log Q(z_m), shape (M,).
    :rtype: torch.Tensor
    :raises TypeError: if ``fused`` is not None, True or False.
    :raises ValueError: for ``fused=True`` with a ``block_size`` (the fused kernel has no
        blocks to choose).
    """
    check_mixture_arguments(z, loc, scale, exclude_self)
    fused_path = use_fused_mixture(z, fused)  # also checks the type of ``fused``
    if fused and block_size is not None:
        raise ValueError(
            f"fused=True runs the fused kernel, which takes no block_size (got {block_size}); "
            "pass block_size=None for the fused kernel, or fused=None to stream in blocks")
    if block_size is None and fused_path:
        return fused_gaussian_mixture_log_prob(z, loc, scale, exclude_self)
    if use_streaming(z.shape[0], loc.shape[0], z.device, block_size):
        return streaming_gaussian_mixture_log_prob(z, loc, scale, exclude_self, block_size)
    return dense_gaussian_mixture_log_prob(z, loc, scale, exclude_self)
