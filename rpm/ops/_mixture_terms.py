r"""The log-component matrix of a diagonal Gaussian mixture, block by block, shared by the dense
(:func:`~rpm.ops.gaussian_mixture_log_prob`) and streamed
(``rpm.ops._streaming.streaming_gaussian_mixture_log_prob``) kernels.

For points :math:`z_m` and components :math:`(\mu_n, \sigma_n)`,

.. math::

    L_{mn} = \ell_n - \tfrac12 q_{mn}, \qquad
    q_{mn} = \sum_d w_{nd} (z_{md} - \mu_{nd})^2, \qquad
    w_{nd} = \sigma_{nd}^{-2}, \qquad
    \ell_n = -\sum_d \log \sigma_{nd} - \tfrac D2 \log 2\pi,

(the terms of Eq. 11 of Aitchison & Ganev). The quadratic form is expanded around an *anchor*
:math:`c_{a(n)}` of the component, :math:`\tilde z = z - c_{a(n)}`,
:math:`\tilde\mu_n = \mu_n - c_{a(n)}`:

.. math::

    q_{mn} = \underbrace{\textstyle\sum_d \tilde z_{md}^2 w_{nd}}_{p_{mn}}
    - 2 \textstyle\sum_d \tilde z_{md} \tilde\mu_{nd} w_{nd}
    + \underbrace{\textstyle\sum_d \tilde\mu_{nd}^2 w_{nd}}_{r_n},

two matrix products with D columns per group of components sharing an anchor. The expansion
rounds to at most :func:`~rpm.ops._distances.expansion_rounding_bound` of its *magnitude*
:math:`p_{mn} + r_n` (the first product is kept, so the magnitude is known exactly for every
pair), where the direct difference form rounds to the same bound of :math:`q_{mn}` itself.

Anchors. One anchor, the mean location, suffices unless the locations lie far apart in units
of their own scales (tight clusters far from each other: :math:`r_n \gg q_{mn}` for the pairs
that matter, and the expansion cancels catastrophically). Then further anchors are chosen by
farthest-point traversal in the components' own metric (each new anchor is the location of
the component worst served so far; components move to the anchor nearest in their metric), as
long as the worst :math:`r_n` is large and the new anchor takes over enough components. The
components (and the points, when there are as many) are permuted so that each anchor's
components are contiguous.

Refinement. A pair is recomputed in the difference form when it can matter and the expansion
is materially worse than the direct form:

1. it may lie within ``REFINE_MARGIN`` nats of its row maximum, allowing for the rounding
   bound (a pair further down weighs < e^-30 relative to the maximum),
2. the rounding bound (in nats) exceeds ``REFINE_TOLERANCE``, and
3. the magnitude exceeds ``REFINE_GAIN`` times :math:`q_{mn}` (otherwise float32 cannot do
   materially better: the direct form has the same bound of q).

Condition 3 is what keeps overlapping mixtures (most pairs near their row maximum, magnitude
about q) free of per-pair work; anchors keep the rounding bound of far tight clusters small, so
that condition 1 does not admit every pair of a cluster.
"""

from __future__ import annotations

import math

import torch

from rpm.ops._distances import expansion_rounding_bound

# Pairs further than this below the row maximum (in nats) have relative weight < e^-30.
REFINE_MARGIN = 30.0
# A pair whose worst-case expansion rounding (nats) is below this is accurate as it is.
REFINE_TOLERANCE = 1e-5
# ... and so is a pair whose expansion magnitude is at most this many times q.
REFINE_GAIN = 2.0
# Anchors are added while some component's r_n has a worst-case rounding above this (in units
# of the quadratic form),
MAX_ANCHOR_ROUNDING = 1e-2
# at most this many anchors,
MAX_ANCHORS = 32
# each taking over at least this fraction of the components.
MIN_ANCHOR_SHARE = 1.0 / 64
# Candidates are checked one by one (gathered) when at most 1 / this of the block.
_GATHER_FRACTION = 8
# Rows per chunk of the float64 log-determinant (bounds its temporary).
_LOG_DET_CHUNK = 1 << 14


def check_mixture_arguments(
    z: torch.Tensor, loc: torch.Tensor, scale: torch.Tensor, exclude_self: bool = False
) -> None:
    """Validates the shapes and dtypes of a mixture evaluation, raising ``ValueError``.

    :param torch.Tensor z: points, shape (M, D).
    :param torch.Tensor loc: component means, shape (N, D).
    :param torch.Tensor scale: component standard deviations, shape (N, D), positive.
    :param bool exclude_self: whether pair (m, m) is to be left out (needs M == N >= 2).
    """
    if not (isinstance(z, torch.Tensor) and isinstance(loc, torch.Tensor)
            and isinstance(scale, torch.Tensor)):
        raise TypeError("z, loc and scale must be tensors")
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
    if not (z.device == loc.device == scale.device):
        raise ValueError(
            f"z, loc and scale must be on one device, got {z.device}, {loc.device}, "
            f"{scale.device}; move them with .to(device)"
        )
    if not (z.dtype == loc.dtype == scale.dtype):
        raise ValueError(
            f"z, loc and scale must share a dtype, got {z.dtype}, {loc.dtype}, {scale.dtype}"
        )
    if not z.dtype.is_floating_point:
        raise TypeError(f"expected floating-point z, loc and scale, got {z.dtype}")
    if exclude_self and (z.shape[0] != loc.shape[0] or loc.shape[0] < 2):
        raise ValueError(
            "exclude_self=True pairs point m with component m, so it needs as many points as "
            f"components and at least 2 components; got {z.shape[0]} points and "
            f"{loc.shape[0]} components"
        )


def choose_anchors(loc: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Anchors of the expansion by farthest-point traversal (see the module docstring).

    :param loc: component means, shape (N, D).
    :param weight: w = 1 / sigma^2, shape (N, D).
    :return: ``(anchors (A, D), assignment (N,) long)``, anchor 0 the mean location.
    """
    with torch.no_grad():
        num, dim = loc.shape
        anchors = [loc.mean(0)]
        assignment = torch.zeros(num, dtype=torch.long, device=loc.device)
        if loc.dtype == torch.float64:
            return anchors[0][None], assignment
        radius = torch.einsum("nd,nd->n", (loc - anchors[0]).square(), weight)  # (N,): r_n
        largest = MAX_ANCHOR_ROUNDING / expansion_rounding_bound(1.0, dim, loc.dtype)
        min_share = max(2, math.ceil(MIN_ANCHOR_SHARE * num))
        while len(anchors) < MAX_ANCHORS:
            worst = int(radius.argmax())
            if float(radius[worst]) <= largest:
                break
            candidate = loc[worst]
            new_radius = torch.einsum("nd,nd->n", (loc - candidate).square(), weight)
            closer = new_radius < radius
            if int(closer.sum()) < min_share:
                break
            assignment[closer] = len(anchors)
            radius = torch.minimum(radius, new_radius)
            anchors.append(candidate)
        return torch.stack(anchors), assignment


class MixtureTerms:
    r"""The components of a mixture, ready for blocks of :math:`L` (see the module docstring).

    Holds, in the order of ``perm`` (components grouped by anchor): the locations, scales,
    weights :math:`w`, the cross factor :math:`v_n = -2 \tilde\mu_n w_n`, :math:`r_n` and
    :math:`\ell_n` (its sum of logarithms taken in float64). Built with autograd when the
    inputs require it (the dense path differentiates through it).

    :param loc: component means, shape (N, D).
    :param scale: component standard deviations, shape (N, D).
    :param bool permute_points: whether the points are permuted with the components (when
        there are as many points as components, so that pair (m, m) stays on the diagonal).
    """

    # Set-up and the selection of pairs to refine depend on the data (anchors, nonzero): under
    # torch.compile they run eagerly, and only the block algebra is compiled.
    @torch.compiler.disable
    def __init__(self, loc: torch.Tensor, scale: torch.Tensor, permute_points: bool):
        num, dim = loc.shape
        self.dim, self.dtype = dim, loc.dtype
        self.refine = loc.dtype != torch.float64
        with torch.no_grad():
            anchors, assignment = choose_anchors(loc, scale.detach().reciprocal().square())
        self.anchors = anchors  # (A, D), constants
        self.perm: torch.Tensor | None
        if anchors.shape[0] > 1:
            assignment, perm = torch.sort(assignment, stable=True)
            self.perm = perm  # (N,): position -> original component
            loc, scale = loc[perm], scale[perm]
        else:
            self.perm = None
        self.permute_points = permute_points and self.perm is not None
        counts = torch.bincount(assignment, minlength=anchors.shape[0]).tolist()
        self.bounds = [0]
        for count in counts:
            self.bounds.append(self.bounds[-1] + count)  # anchor a owns [bounds[a], bounds[a+1])
        self.loc, self.scale = loc, scale
        self.weight = scale.reciprocal().square()  # (N, D)
        loc_c = loc - anchors[assignment]  # (N, D): mu - c_a(n)
        self.loc_c = loc_c
        self.cross = -2.0 * loc_c * self.weight  # (N, D): v
        self.radius = (loc_c.square() * self.weight).sum(-1)  # (N,): r_n
        log_det = torch.cat([
            scale[s:s + _LOG_DET_CHUNK].double().log().sum(-1)
            for s in range(0, num, _LOG_DET_CHUNK)
        ]).to(loc.dtype)  # (N,)
        self.log_norm = -log_det - 0.5 * dim * math.log(2 * math.pi)  # (N,): l_n
        self.offset = self.log_norm - 0.5 * self.radius  # (N,)
        self.bound_per_unit = expansion_rounding_bound(1.0, dim, loc.dtype)

    def permute_rows(self, z: torch.Tensor) -> torch.Tensor:
        """The points in the order of the kernel's rows."""
        return z[self.perm] if self.permute_points else z

    def unpermute_rows(self, values: torch.Tensor) -> torch.Tensor:
        """Values (or gradients) of the kernel's rows, back in the points' order."""
        if not self.permute_points:
            return values
        out = torch.empty_like(values)
        out[self.perm] = values
        return out

    def unpermute_components(self, values: torch.Tensor) -> torch.Tensor:
        """Gradients of the kernel's components, back in the input order."""
        if self.perm is None:
            return values
        out = torch.empty_like(values)
        out[self.perm] = values
        return out

    def segments(self, c0: int, c1: int) -> list[tuple[int, int, int]]:
        """``(anchor, start, stop)`` of the anchor groups that meet columns [c0, c1)."""
        out = []
        for anchor in range(len(self.bounds) - 1):
            start, stop = max(self.bounds[anchor], c0), min(self.bounds[anchor + 1], c1)
            if start < stop:
                out.append((anchor, start, stop))
        return out

    def block(self, z_rows: torch.Tensor, c0: int, c1: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The block of L for points ``z_rows`` (kernel order) and columns [c0, c1), and the
        first product p (magnitude = p + r), each of shape (rows, c1 - c0)."""
        values, products = [], []
        for anchor, start, stop in self.segments(c0, c1):
            z_c = z_rows - self.anchors[anchor]  # (bm, D)
            product = z_c.square() @ self.weight[start:stop].T  # (bm, bn): p
            value = torch.addmm(self.offset[start:stop], z_c, self.cross[start:stop].T, alpha=-0.5)
            values.append(value - 0.5 * product)
            products.append(product)
        if len(values) == 1:
            return values[0], products[0]
        return torch.cat(values, 1), torch.cat(products, 1)

    @torch.compiler.disable
    def refinement(
        self, values: torch.Tensor, products: torch.Tensor, c0: int, threshold: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Local (row, column) indices of the pairs of a block to recompute exactly (the three
        conditions of the module docstring), or None.

        :param values: the block of L, shape (bm, bn) (exclusions already at -inf).
        :param products: the block of p, shape (bm, bn).
        :param threshold: row maximum lower bound minus the margin, shape (bm,).
        """
        if not self.refine or values.numel() == 0:
            return None
        with torch.no_grad():
            cols = slice(c0, c0 + values.shape[1])
            radius, log_norm = self.radius[cols], self.log_norm[cols]
            half_bound = 0.5 * self.bound_per_unit
            # A superset of condition 1 in one comparison: p <= (sqrt q + sqrt r)^2 <= 2 q + 2 r
            # (triangle inequality in the component's metric) with q = 2 (l - L), so
            # L + hb (p + r) >= t implies L (1 - 4 hb) + hb (4 l + 3 r) >= t; one nat of margin
            # covers the rounding of q itself.
            shrink = 1.0 - 4.0 * half_bound
            offset = half_bound * (4.0 * log_norm + 3.0 * radius) / shrink  # (bn,)
            row_threshold = (threshold - 1.0) / shrink  # (bm,)
            candidates = (values + offset) >= row_threshold[:, None]  # (bm, bn)
            count = int(candidates.sum())
            if count == 0:
                return None
            if count * _GATHER_FRACTION <= candidates.numel():
                # Few candidates (points near few components): the conditions on them only.
                rows, local = torch.nonzero(candidates, as_tuple=True)  # (K,)
                value = values[rows, local]  # (K,)
                slack = (products[rows, local] + radius[local]).mul_(half_bound)  # (K,): nats
                need = (value + slack) >= threshold[rows]  # condition 1
                need &= slack > REFINE_TOLERANCE  # condition 2
                # condition 3: p + r > G q with q = 2 (l - L), i.e. slack > G hb 2 (l - L)
                need &= slack > (log_norm[local] - value).mul_(2.0 * REFINE_GAIN * half_bound)
                rows, local = rows[need], local[need]
            else:
                # Many (overlapping components): the same conditions on the whole block.
                magnitude = products + radius  # (bm, bn): p + r
                need = candidates
                need &= torch.add(values, magnitude, alpha=half_bound) >= threshold[:, None]
                need &= magnitude > REFINE_TOLERANCE / half_bound
                need &= torch.add(magnitude, values, alpha=2.0 * REFINE_GAIN) > (
                    2.0 * REFINE_GAIN * log_norm)
                rows, local = torch.nonzero(need, as_tuple=True)
        if rows.numel() == 0:
            return None
        return rows, local

    def row_bounds(
        self, values: torch.Tensor, products: torch.Tensor, c0: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's largest entry in the block, and a lower bound of its largest exact term
        (the largest entry less its rounding bound), shape (bm,) each."""
        top, index = values.max(1)
        if not self.refine:
            return top, top
        magnitude = products.gather(1, index[:, None]).squeeze(1) + self.radius[c0 + index]
        lower = (top - 0.5 * self.bound_per_unit * magnitude).nan_to_num(nan=-math.inf)
        return top, lower

    def exact(self, z: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """L in the difference form for the listed (row, column) pairs (kernel order), (K,)."""
        diff = (z[rows] - self.loc[cols]) / self.scale[cols]  # (K, D)
        return self.log_norm[cols] - 0.5 * diff.square().sum(-1)
