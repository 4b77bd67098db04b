r"""The minibatch-mixture marginal of Gaussian recognition models, through matrix products.

The recognition marginal :math:`Q(z) = \mathbb{E}_{P_\text{true}(x)} Q(z|x)` (Eq. 4 and 11 of
Aitchison & Ganev) is estimated over a batch of N recognition distributions
:math:`Q(z|x_n) = \mathcal{N}(\mu_n, \operatorname{diag}\sigma_n^2)` as the mixture

.. math::

    \log Q(z_m) \approx \operatorname{logsumexp}_n \log \mathcal{N}(z_m; \mu_n, \sigma_n^2) - \log N.

The quadratic form is expanded so that the N x M matrix comes from three matrix products
instead of an N x M x D broadcast:

.. math::

    \sum_d \frac{(z_{md} - \mu_{nd})^2}{\sigma_{nd}^2}
    = \sum_d z_{md}^2 w_{nd} - 2 \sum_d z_{md} \mu_{nd} w_{nd} + \sum_d \mu_{nd}^2 w_{nd},
    \qquad w_{nd} = \sigma_{nd}^{-2}.

In float32 the expansion loses digits when :math:`|z|/\sigma` is large (the three terms are
large and nearly cancel). Two steps keep the float32 result within 1e-4 of float64:

1. everything is centred on the mean of the component locations, and
2. the pairs that can matter for the logsumexp (those whose value, allowing for the rounding
   bound of the expansion, lies within ``_REFINE_MARGIN`` of the row maximum) and whose
   rounding bound exceeds ``_REFINE_TOLERANCE`` are recomputed exactly in the difference form.
   The others carry a weight below
   :math:`e^{-30}` relative to the maximum, so their rounding cannot move the result.
"""

from __future__ import annotations

import math

import torch

from rpm.ops.streaming import check_mixture_arguments, streaming_gaussian_mixture_log_prob

__all__ = ["gaussian_mixture_log_prob"]

# Pairs further than this below the row maximum (in nats) have relative weight < e^-30.
_REFINE_MARGIN = 30.0
# Log-weights further below the row maximum than this are raised to it (see the end).
_SUBNORMAL_GUARD = 80.0
# Pairs whose rounding bound (in nats) is below this are already accurate enough.
_REFINE_TOLERANCE = 1e-5
# At most this many refined pairs are recomputed at once (bounds the (K, D) temporaries).
_REFINE_CHUNK = 1 << 20
# Above this many (point, component) pairs the streamed kernel is used (rpm.ops.streaming).
_STREAMING_MIN_PAIRS = 1 << 22


def _exact_quadratic(
    z: torch.Tensor, loc: torch.Tensor, inv_scale: torch.Tensor, rows: torch.Tensor,
    cols: torch.Tensor,
) -> torch.Tensor:
    """The Mahalanobis term sum_d ((z_rd - mu_cd) / sigma_cd)^2 for the listed (row, col) pairs."""
    pieces = []
    for start in range(0, rows.numel(), _REFINE_CHUNK):
        r = rows[start:start + _REFINE_CHUNK]
        c = cols[start:start + _REFINE_CHUNK]
        diff = (z[r] - loc[c]) * inv_scale[c]  # (K, D)
        pieces.append(diff.square().sum(-1))
    return torch.cat(pieces) if pieces else z.new_zeros(0)


def gaussian_mixture_log_prob(
    z: torch.Tensor, loc: torch.Tensor, scale: torch.Tensor, exclude_self: bool = False,
    block_size: int | None = None,
) -> torch.Tensor:
    r"""Log-density of points under the equally weighted mixture of diagonal Gaussians.

    .. math::

        \log Q(z_m) = \operatorname{logsumexp}_{n} \Big[ -\tfrac12 \sum_d
            \frac{(z_{md} - \mu_{nd})^2}{\sigma_{nd}^2} - \sum_d \log \sigma_{nd}
            - \tfrac{D}{2} \log 2\pi \Big] - \log N

    the minibatch-mixture recognition marginal (Eq. 11 of Aitchison & Ganev).
    With ``exclude_self`` the m-th component is left out of the m-th row (a leave-one-out
    estimate, as used when z_m was sampled from component m) and the normaliser is
    :math:`\log(N - 1)`.

    Computed through matrix products (see the module docstring) in the dtype of the inputs;
    TF32 is switched off for the products so that float32 stays within 1e-4 of float64.
    Above ``_STREAMING_MIN_PAIRS`` pairs (M N), or whenever ``block_size`` is given, the
    streamed kernel :func:`~rpm.ops.streaming_gaussian_mixture_log_prob` computes the
    same value in blocks with O((M + N) D) memory (forward and backward); this dense path stays
    the reference for small sizes.

    :param torch.Tensor z: points, shape (M, D).
    :param torch.Tensor loc: component means, shape (N, D).
    :param torch.Tensor scale: component standard deviations, shape (N, D), positive.
    :param bool exclude_self: drop the diagonal pair (m, m); requires M == N and N >= 2.
    :param block_size: stream in blocks of this many rows and columns; ``None`` streams (with
        the device's default block) only above ``_STREAMING_MIN_PAIRS`` pairs.
    :return: log Q(z_m), shape (M,).
    :rtype: torch.Tensor
    """
    check_mixture_arguments(z, loc, scale)
    num_points, num_components = z.shape[0], loc.shape[0]
    if exclude_self and (num_points != num_components or num_components < 2):
        raise ValueError(
            "exclude_self=True pairs point m with component m, so it needs as many points as "
            f"components and at least 2 components; got {num_points} points and "
            f"{num_components} components"
        )
    if block_size is not None or num_points * num_components > _STREAMING_MIN_PAIRS:
        return streaming_gaussian_mixture_log_prob(z, loc, scale, exclude_self, block_size)
    dim = z.shape[1]
    centre = loc.mean(0, keepdim=True).detach()
    z_c = z - centre  # (M, D)
    loc_c = loc - centre  # (N, D)
    inv_scale = scale.reciprocal()  # (N, D)
    weight = inv_scale.square()  # (N, D): w_nd = 1 / sigma_nd^2

    allow_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        # einsum letters: m point, n component, d latent dimension.
        zz = z_c.square() @ weight.T  # (M, N): sum_d z_md^2 w_nd
        zl = z_c @ (loc_c * weight).T  # (M, N): sum_d z_md mu_nd w_nd
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    ll = (loc_c.square() * weight).sum(-1)  # (N,)
    quadratic = (zz - 2.0 * zl + ll).clamp_min(0.0)  # (M, N)
    log_norm = -scale.log().sum(-1) - 0.5 * dim * math.log(2 * math.pi)  # (N,)
    log_components = log_norm - 0.5 * quadratic  # (M, N)

    if z.dtype != torch.float64:
        # Rounding bound of the expansion: |2 zl| <= zz + ll, so the error is below
        # c * eps * (zz + ll) for a small constant c (the sums have D terms).
        with torch.no_grad():
            eps = torch.finfo(z.dtype).eps
            slack = (4.0 + dim) * eps * (zz + ll)  # (M, N), in units of the quadratic
            upper = log_components + 0.5 * slack
            lower = log_components - 0.5 * slack
            if exclude_self:
                upper.diagonal().fill_(-math.inf)
                lower.diagonal().fill_(-math.inf)
            threshold = lower.max(-1, keepdim=True).values - _REFINE_MARGIN
            needs_refinement = (upper >= threshold) & (slack > 2.0 * _REFINE_TOLERANCE)
            rows, cols = torch.nonzero(needs_refinement, as_tuple=True)
        exact = _exact_quadratic(z, loc, inv_scale, rows, cols)
        log_components = log_components.index_put(
            (rows, cols), log_norm[cols] - 0.5 * exact
        )
    # Terms far below the row maximum weigh < e^-80 each (relative to it); raising them to that
    # floor changes nothing measurable but keeps exp() out of the subnormal range, which is an
    # order of magnitude slower on CPUs. The excluded diagonal stays at -inf.
    if exclude_self:
        eye = torch.eye(num_points, dtype=torch.bool, device=z.device)
        log_components = log_components.masked_fill(eye, -math.inf)
        num_components -= 1
    row_max = log_components.detach().amax(-1, keepdim=True)  # (M, 1), finite
    floored = torch.maximum(log_components, row_max - _SUBNORMAL_GUARD)
    log_components = torch.where(torch.isneginf(log_components), log_components, floored)
    return torch.logsumexp(log_components, dim=-1) - math.log(num_components)
