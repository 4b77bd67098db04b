r"""Which code computes an energy on the fast paths: the rule that keeps a user's ``forward``
the definition of the energy.

The InfoNCE normaliser of the implicit priors (Eq. 23-25 of Aitchison & Ganev),
:math:`\log \sum_j e^{f(z_i, z'_j)}`, and the positives :math:`f(z_i, z'_i)` can be computed
three ways: from the full (N, M) matrix of :meth:`~rpm.priors._base.Energy.forward` (dense), from
the energy's factorisation hooks (:meth:`~rpm.priors._base.Energy.logit_factors`, streamed in
O((N + M) D) memory; :meth:`~rpm.priors._base.Energy.paired`, O(N D)), or from ``forward``
evaluated on tiles of ``block_size`` rows and columns (generic blocked; for large matrices
O(N M / block) memory plus one tile, each tile recomputed in the backward pass). The hooks
are shortcuts for what ``forward`` computes, so a hook is used only where it describes *this*
class's ``forward``:

* a hook defined in the same class as ``forward`` is trusted (the built-in energies, a user's
  energy written with its factorisation);
* a hook defined in a subclass of the class that defines ``forward`` (a subclass that overrides
  the factorisation only) is checked once per class against ``forward`` on a few rows and
  columns of the first batch it meets, and a disagreement raises ValueError;
* a hook inherited from above the class that defines ``forward`` (a subclass that overrides
  ``forward`` only) is ignored: ``forward`` runs on the generic blocked path.

The decision is made once per class (by walking its MRO) and cached. A subclass that overrides
``forward`` gets the fast path back by overriding the hooks in the same class.
"""

from __future__ import annotations

import math
import weakref

import torch
from torch.utils.checkpoint import checkpoint

from rpm.ops._dispatch import RECOMPUTE_MIN_PAIRS, default_block_size, use_streaming
from rpm.ops._logsumexp import safe_logsumexp
from rpm.priors._base import Energy

__all__ = [
    "blocked_energy_logsumexp",
    "energy_hook_policy",
    "energy_logit_factors",
    "energy_paired",
]

_HOOKS = ("paired", "logit_factors")
#: class -> {hook: "trusted" | "checked" | "generic"}
_POLICIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: class -> set of hooks whose check against forward has passed
_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Rows and columns of the first batch on which a subclass's hooks are checked against forward.
_CHECK_SIZE = 8


def _owner(cls: type, name: str) -> type:
    """The class of ``cls``'s MRO whose body defines ``name``."""
    return next(klass for klass in cls.__mro__ if name in vars(klass))


def energy_hook_policy(energy_type: type, hook: str) -> str:
    r"""How the fast paths use the factorisation hook ``hook`` of an energy class (module
    docstring): ``"trusted"`` (defined with ``forward``), ``"checked"`` (defined in a subclass
    of the class defining ``forward``: compared with ``forward`` once per class), or
    ``"generic"`` (the hook is :class:`~rpm.priors._base.Energy`'s default, is inherited from
    above the class defining ``forward``, or the module is not an
    :class:`~rpm.priors._base.Energy`: the blocked ``forward`` is used). Cached per class.

    :param type energy_type: the class of the energy.
    :param str hook: ``"paired"`` or ``"logit_factors"``.
    :rtype: str
    """
    if hook not in _HOOKS:
        raise ValueError(f"hook must be one of {_HOOKS}, got {hook!r}")
    policies = _POLICIES.get(energy_type)
    if policies is None:
        policies = {}
        if issubclass(energy_type, Energy):
            forward_owner = _owner(energy_type, "forward")
            for name in _HOOKS:
                owner = _owner(energy_type, name)
                if owner is Energy or not issubclass(owner, forward_owner):
                    policies[name] = "generic"
                elif owner is forward_owner:
                    policies[name] = "trusted"
                else:
                    policies[name] = "checked"
        else:
            policies = dict.fromkeys(_HOOKS, "generic")
        _POLICIES[energy_type] = policies
    return policies[hook]


def _tolerance(reference: torch.Tensor) -> torch.Tensor:
    """Agreement asked of a hook with ``forward``: 8 sqrt(eps) (1 + |F|) (float32: 2.8e-3)."""
    return 8.0 * math.sqrt(torch.finfo(reference.dtype).eps) * (1.0 + reference.abs())


def _check_once(energy: Energy, hook: str, got: torch.Tensor, want: torch.Tensor) -> None:
    """Raises ValueError if a subclass's hook disagrees with its forward; remembers a pass."""
    error = (got - want).abs()
    bad = ~(error <= _tolerance(want))
    if bool(bad.any()):
        cls = type(energy)
        raise ValueError(
            f"{cls.__name__}.{hook} disagrees with {cls.__name__}.forward (inherited from "
            f"{_owner(cls, 'forward').__name__}) by up to {float(error[bad].max()):.3g} on the "
            f"first {got.shape[0]} latents: forward defines the energy, so fix {hook} to compute "
            f"what forward computes, or delete {hook} (the generic path then uses forward)"
        )
    _CHECKED.setdefault(type(energy), set()).add(hook)


def _needs_check(energy, hook: str) -> bool:
    return (energy_hook_policy(type(energy), hook) == "checked"
            and hook not in _CHECKED.get(type(energy), ()))


def energy_logit_factors(
    energy, z: torch.Tensor, z2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
    r"""The matrix-product factors of an energy, :math:`f(z_i, z'_j) = a_i^\top b_j + c_i`, or
    None, under the rule of the module docstring.

    The energy's own :meth:`~rpm.priors._base.Energy.logit_factors` when that hook describes its
    ``forward`` (defined with it, or checked against it), else None (the normaliser then uses
    ``forward``: dense, or :func:`blocked_energy_logsumexp`).

    :param energy: the energy f.
    :param torch.Tensor z: first-view latents, shape (N, D).
    :param torch.Tensor z2: second-view latents, shape (M, D).
    :return: ``(a (N, K), b (M, K), c (N,) or None)``, or None.
    """
    if energy_hook_policy(type(energy), "logit_factors") == "generic":
        return None
    factors = energy.logit_factors(z, z2)
    if factors is not None and _needs_check(energy, "logit_factors"):
        left, right, offset = factors
        rows, cols = min(_CHECK_SIZE, z.shape[0]), min(_CHECK_SIZE, z2.shape[0])
        with torch.no_grad():
            got = left[:rows] @ right[:cols].T                                # (rows, cols)
            if offset is not None:
                got = got + offset[:rows, None]
            _check_once(energy, "logit_factors", got, energy(z[:rows], z2[:cols]))
    return factors


def _blocked_diagonal(energy, z: torch.Tensor, z2: torch.Tensor, block_size: int | None):
    """The diagonal of ``energy(z, z2)`` from aligned (b, b) blocks of it: O(N b) work."""
    if not use_streaming(z.shape[0], z2.shape[0], z.device, block_size):
        return torch.diagonal(energy(z, z2))
    size = default_block_size(z.device) if block_size is None else block_size
    return torch.cat([torch.diagonal(energy(z[r0:r0 + size], z2[r0:r0 + size]))
                      for r0 in range(0, z.shape[0], size)])


def energy_paired(energy, z: torch.Tensor, z2: torch.Tensor,
                  block_size: int | None = None) -> torch.Tensor:
    r"""The positives :math:`f(z_i, z'_i)`, shape (N,), under the rule of the module docstring:
    the energy's own :meth:`~rpm.priors._base.Energy.paired` when it describes its ``forward``,
    else the diagonal of ``forward``, built from aligned blocks of ``block_size`` rows and
    columns when the (N, N) matrix would be streamed (``rpm.ops._dispatch.use_streaming``).

    :param energy: the energy f.
    :param torch.Tensor z: shape (N, D).
    :param torch.Tensor z2: shape (N, D), paired with z.
    :param block_size: the block edge of the generic path; ``None`` decides by size.
    :return: shape (N,).
    """
    if z.shape != z2.shape:
        raise ValueError(
            f"paired energies need z and z2 of equal shapes, got {tuple(z.shape)} and "
            f"{tuple(z2.shape)}"
        )
    if energy_hook_policy(type(energy), "paired") == "generic":
        return _blocked_diagonal(energy, z, z2, block_size)
    paired = energy.paired(z, z2)
    if _needs_check(energy, "paired"):
        rows = min(_CHECK_SIZE, z.shape[0])
        with torch.no_grad():
            _check_once(energy, "paired", paired[:rows],
                        torch.diagonal(energy(z[:rows], z2[:rows])))
    return paired


def _tile_terms(energy, rows: torch.Tensor, cols: torch.Tensor, row_start: int,
                col_start: int, mask_shift: int | None, positive_shift: int | None):
    """One tile of the generic path: the row log-sum-exp of ``energy(rows, cols)`` with the
    entries (i, j) of j = i + mask_shift masked, and the entries of j = i + positive_shift
    (0 where the tile holds none): each of shape (rows,)."""
    logits = energy(rows, cols)                                                 # (b, c)
    row_index = torch.arange(row_start, row_start + rows.shape[0], device=rows.device)[:, None]
    col_index = torch.arange(col_start, col_start + cols.shape[0], device=rows.device)[None, :]
    if positive_shift is None:
        positive = logits.new_zeros(rows.shape[0])
    else:
        positive = torch.where(col_index == row_index + positive_shift, logits,
                               torch.zeros_like(logits)).sum(-1)
    if mask_shift is not None:
        logits = logits.masked_fill(col_index == row_index + mask_shift, -math.inf)
    return safe_logsumexp(logits, dim=-1), positive


def _covers_whole_tile(rows: range, cols: range, mask_shift: int | None) -> bool:
    """Whether the mask j = i + mask_shift covers every entry of a tile (a 1 x 1 tile)."""
    return (mask_shift is not None and len(rows) == 1 and len(cols) == 1
            and cols[0] == rows[0] + mask_shift)


def blocked_energy_logsumexp(
    energy, z: torch.Tensor, z2: torch.Tensor, block_size: int | None = None,
    mask_shift: int | None = None, positive_shift: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    r"""The row log-normaliser :math:`\log \sum_{j} e^{f(z_i, z'_j)}` of any energy, from its
    ``forward`` on tiles of ``block_size`` rows and columns (the generic streamed path).

    .. math::

        \mathrm{lse}_i = \log \sum_{t} \exp\Big(\log \sum_{j \in t,\ j \ne i + s}
        e^{f(z_i, z'_j)}\Big),

    over the column tiles t, with the entries :math:`j = i + s` left out when a mask shift s is
    given (the anchor itself in NT-Xent's normaliser). Above
    :data:`~rpm.ops._dispatch.RECOMPUTE_MIN_PAIRS` (4M) pairs each tile is evaluated under
    :func:`torch.utils.checkpoint.checkpoint` when gradients are needed, so the memory is
    O(N M / b) plus one (b, b) tile of ``forward`` (and its intermediates) however large N and
    M are, and the backward pass recomputes each tile once (``benchmarks/energy_paths.py``);
    below, the tiles keep their intermediates as the dense matrix would. ``forward`` must be pairwise (entry
    (i, j) depends on :math:`z_i` and :math:`z'_j` only), as the
    :class:`~rpm.priors._base.Energy` contract says.

    :param energy: the energy f.
    :param torch.Tensor z: the anchors, shape (N, D).
    :param torch.Tensor z2: the candidates, shape (M, D).
    :param block_size: the tile edge; ``None``: ``rpm.ops._dispatch.default_block_size``.
    :param mask_shift: leave out the entries :math:`j = i + s` (None: none).
    :param positive_shift: also return :math:`f(z_i, z'_{i + s})` from the same tiles
        (None: do not).
    :return: ``(lse (N,), positives (N,) or None)``.
    """
    size = default_block_size(z.device) if block_size is None else block_size
    num_rows, num_cols = z.shape[0], z2.shape[0]
    use_checkpoint = torch.is_grad_enabled() and num_rows * num_cols > RECOMPUTE_MIN_PAIRS
    lse_blocks, positive_blocks = [], []
    for r0 in range(0, num_rows, size):
        rows = range(r0, min(r0 + size, num_rows))
        tile_lse, tile_positive = [], []
        for c0 in range(0, num_cols, size):
            cols = range(c0, min(c0 + size, num_cols))
            if _covers_whole_tile(rows, cols, mask_shift):
                continue
            args = (energy, z[rows.start:rows.stop], z2[cols.start:cols.stop], r0, c0,
                    mask_shift, positive_shift)
            if use_checkpoint:
                lse, positive = checkpoint(_tile_terms, *args, use_reentrant=False)
            else:
                lse, positive = _tile_terms(*args)
            tile_lse.append(lse)
            tile_positive.append(positive)
        lse_blocks.append(safe_logsumexp(torch.stack(tile_lse), dim=0))
        positive_blocks.append(torch.stack(tile_positive).sum(0))
    positives = None if positive_shift is None else torch.cat(positive_blocks)
    return torch.cat(lse_blocks), positives
