r"""The minibatch-mixture log-density of any batch of recognition distributions, in row blocks.

For N recognition distributions :math:`Q(z|x_1), \dots, Q(z|x_N)` of any family (a Student-t,
a distribution on the sphere such as Pyro's ``ProjectedNormal``, a mixture), with batch_shape
(N,) and event_shape (D,), the minibatch estimate of the recognition marginal (Eq. 11 of
Aitchison & Ganev) at a point :math:`z_m` is

.. math::

    \log Q(z_m) \approx \operatorname{logsumexp}_{n=1}^{N} \log Q(z_m | x_n) - \log N .

The only thing asked of the family is its ``log_prob``: a block of B rows, shaped (B, 1, D),
broadcasts against the batch (N,) of the distribution and gives the (B, N) matrix of
:math:`\log Q(z_m | x_n)` in one call. The family's own temporaries are then at most
O(B N D) (e.g. the standardised differences of a location-scale family), so the rows are taken
in blocks of :math:`B \approx 2^{22} / (N D)` (or ``block_size``), never the whole M x N x D
broadcast. Under autograd each block is checkpointed (``torch.utils.checkpoint``, recomputed in
the backward pass), so the backward pass also holds one block at a time: memory beyond a block
is O((M + N) D) for the inputs and O(M) for the result.

The diagonal Gaussian and Delta families have faster kernels that never form the D axis
(:func:`~rpm.ops.gaussian_mixture_log_prob`, the empirical counts of
:func:`~rpm.marginals.delta_mixture_log_prob`); :class:`~rpm.marginals.MixtureMarginal` keeps
them for those families and uses this function for every other.
"""

from __future__ import annotations

import math

import torch
from torch.distributions import Distribution
from torch.utils.checkpoint import checkpoint

from rpm._validation import check_positive_int_or_none
from rpm.ops._logsumexp import safe_logsumexp

__all__ = ["distribution_mixture_block_rows", "distribution_mixture_log_prob"]

# Elements of the largest temporary a block may create: B x N x D <= 2^22 (32 MiB in float64).
_BLOCK_ELEMENTS = 1 << 22


def distribution_mixture_block_rows(num_components: int, dim: int) -> int:
    """The default number of rows per block: the largest B with B N D <= 2^22 (at least 1).

    :param int num_components: N.
    :param int dim: D.
    :return: B.
    """
    return max(1, _BLOCK_ELEMENTS // max(1, num_components * dim))


def distribution_mixture_log_prob(
    q: Distribution, z: torch.Tensor, exclude_self: bool = False, block_size: int | None = None
) -> torch.Tensor:
    r"""Log-density of points under the equally weighted mixture of a batch of distributions.

    .. math::

        \log Q(z_m) = \operatorname{logsumexp}_{n} \log Q(z_m | x_n) - \log N

    (Eq. 11 of Aitchison & Ganev). With ``exclude_self`` the m-th component is left out of the
    m-th row (a leave-one-out estimate) and the normaliser is :math:`\log(N - 1)`.

    :param q: the components, any ``torch.distributions.Distribution`` with batch_shape (N,)
        and event_shape (D,) whose ``log_prob`` broadcasts a value of shape (B, 1, D) against
        its batch to (B, N), as every torch and Pyro distribution does.
    :param torch.Tensor z: points, shape (M, D).
    :param bool exclude_self: drop the diagonal pair (m, m); requires M == N and N >= 2.
    :param block_size: rows per block; ``None`` takes the largest B with B N D <= 2^22
        (``distribution_mixture_block_rows``).
    :return: log Q(z_m), shape (M,).
    :rtype: torch.Tensor
    """
    block_size = check_positive_int_or_none("block_size", block_size)
    if len(q.batch_shape) != 1 or len(q.event_shape) != 1:
        raise ValueError(
            "the mixture components must have batch_shape (N,) and event_shape (D,), got "
            f"batch_shape {tuple(q.batch_shape)} and event_shape {tuple(q.event_shape)}; "
            "declare the latent dimension an event with .to_event(1)"
        )
    num_components, dim = q.batch_shape[0], q.event_shape[0]
    if z.dim() != 2 or z.shape[1] != dim:
        raise ValueError(f"expected points of shape (M, {dim}), got {tuple(z.shape)}")
    if exclude_self and (z.shape[0] != num_components or num_components < 2):
        raise ValueError(
            "exclude_self=True needs as many points as components and at least 2 components, "
            f"got {z.shape[0]} points and {num_components} components"
        )
    rows = block_size or distribution_mixture_block_rows(num_components, dim)
    num_blocks = -(-z.shape[0] // rows)
    # One block needs nothing kept for later; several are recomputed in the backward pass so
    # that it too holds one block's temporaries at a time.
    recompute = num_blocks > 1 and torch.is_grad_enabled()
    blocks = []
    for start in range(0, z.shape[0], rows):
        block = z[start:start + rows]  # (B, D)
        if recompute:
            lse = checkpoint(_block_logsumexp, q, block, start, exclude_self, use_reentrant=False)
        else:
            lse = _block_logsumexp(q, block, start, exclude_self)
        blocks.append(lse)  # (B,)
    log_count = math.log(num_components - 1 if exclude_self else num_components)
    return torch.cat(blocks) - log_count


def _block_logsumexp(q: Distribution, block: torch.Tensor, start: int,
                     exclude_self: bool) -> torch.Tensor:
    """:math:`\\operatorname{logsumexp}_n \\log Q(z_m | x_n)` of the rows ``block`` (B, D), the
    rows being z_start ... z_{start+B-1}; shape (B,)."""
    log_components = q.log_prob(block.unsqueeze(-2))  # (B, 1, D) against (N,) -> (B, N)
    if exclude_self:
        row = torch.arange(block.shape[0], device=block.device) + start  # (B,)
        column = torch.arange(log_components.shape[-1], device=block.device)  # (N,)
        log_components = log_components.masked_fill(row[:, None] == column, -math.inf)
    return safe_logsumexp(log_components, dim=-1)  # no exp below the underflow threshold
