r"""Whether the implicit priors' loss and its gradients fit the latents' floating-point type.

The InfoNCE terms of a batch of N pairs (Eq. 23-25 of Aitchison & Ganev),
:math:`\sum_i f(z_i, z'_i) - \log \sum_j e^{f(z_i, z'_j)}`, and their gradients are sums of N
terms of the size of the energy, so with an energy bounded by :math:`B(R)` for latents of norm
at most R (:meth:`~rpm.priors._base.Energy.logit_bound`) they stay finite when

.. math::

    16\, N\, B(R) \le \text{the largest number of the dtype}

(float32: 3.4e38; the factor leaves room for the intermediate sums). A float32 energy that is
quadratic in the latents (bilinear, RBF, unnormalised anisotropic) therefore has a valid range
of latent norms of about 1e18 for small batches; past it the loss is not representable
(its exact value exceeds 3.4e38), so the only fixes are float64 or smaller latents.

:func:`check_implicit_log_ratio` runs under Pyro's validation (``pyro.enable_validation``, on by
default), outside tracing and compilation: one O(N D) reduction of the latents and one
synchronisation per step, nothing on the (N, M) matrices (the energy's bound is evaluated only
for latents far from norm 1). It raises a ValueError naming the
valid range and the fix when the bound is exceeded, and diagnoses a non-finite result (the
latents themselves not finite, or an energy without a bound that overflowed).
"""

from __future__ import annotations

import contextvars
import functools
import math
from collections.abc import Sequence

import torch
from pyro.infer.util import is_validation_enabled

from rpm.ops._finite import all_finite
from rpm.priors._base import Energy

__all__ = ["DeferredValuesError", "check_implicit_log_ratio", "defer_values",
           "deferred_value_checks", "valid_norms"]

# The loss and the gradients of N pairs stay below MARGIN * N * B(R).
_MARGIN = 16.0
# Latent norms scanned for the valid range named in the error: 1e-45 ... 1e45.
_SCAN = torch.logspace(-45, 45, 901, dtype=torch.float64)
# The value checks left to the next range check (deferred_value_checks), or None outside one.
_DEFERRED: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "rpm_deferred_value_checks", default=None)


class DeferredValuesError(ValueError):
    """Raised by :func:`check_implicit_log_ratio` when a value check deferred to it
    (:func:`defer_values`) fails, or a latent is not finite while such checks are pending:
    the caller evaluates the batch again with every check, whose error names the input rows
    or the encoder."""


class deferred_value_checks:  # noqa: N801 (a context manager, named as one)
    r"""Inside this context the value checks of a batch (tensors that must be finite, scales
    that must be positive) are recorded by :func:`defer_values` instead of run, and the next
    :func:`check_implicit_log_ratio` makes them in its own reduction (one synchronisation for
    the latents' range and the batch's values: a tensor :math:`x` is finite when
    :math:`\sum_k x_k` is, or, when that sum overflows, when :math:`\max_k |x_k|` is).
    ``pending`` holds the checks no range check took (a prior without one): the caller makes
    them itself. (A class rather than a generator: it runs on every step.)"""

    __slots__ = ("_token", "pending")

    def __enter__(self) -> deferred_value_checks:
        self.pending: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []
        self._token = _DEFERRED.set(self.pending)
        return self

    def __exit__(self, *exc) -> None:
        _DEFERRED.reset(self._token)


def defer_values(finite: list[torch.Tensor], positive: list[torch.Tensor]) -> bool:
    """Inside :func:`deferred_value_checks`, records that every entry of ``finite`` must be
    finite and every entry of ``positive`` above zero, and returns True; outside, returns False
    (the caller checks them itself)."""
    pending = _DEFERRED.get()
    if pending is None:
        return False
    pending.append((finite, positive))
    return True


def valid_norms(energy: Energy, num_pairs: int, dtype: torch.dtype) -> tuple[float, float] | None:
    r"""The range of latent norms R, between 1e-45 and 1e45, where
    :math:`16 N B(R)` fits ``dtype`` (module docstring), or None when the energy has no bound
    or no norm fits.

    :param Energy energy: the energy f.
    :param int num_pairs: N, the terms summed by the loss.
    :param torch.dtype dtype: the latents' floating-point type.
    :return: ``(smallest, largest)`` norm.
    """
    bound = energy.logit_bound(_SCAN)
    if bound is None:
        return None
    fits = _MARGIN * num_pairs * bound <= torch.finfo(dtype).max
    if not bool(fits.any()):
        return None
    norms = _SCAN[fits]
    return float(norms.min()), float(norms.max())


def _describe(norms: tuple[float, float]) -> str:
    """'up to 1e+18', 'from 1e-30' or 'from 1e-30 to 1e+18' (the scan's ends are open)."""
    low, high = norms
    lowest, highest = float(_SCAN[0]), float(_SCAN[-1])
    if low <= lowest:
        return f"up to {high:.1g}"
    if high >= highest:
        return f"from {low:.1g}"
    return f"from {low:.1g} to {high:.1g}"


@functools.lru_cache(maxsize=8)
def _window(dtype: torch.dtype) -> tuple[float, float]:
    """Latent norms :math:`[m^{-1/6}, m^{1/6}]`, m the dtype's largest number (float32:
    3.9e-7 to 2.6e6), inside which no plausible parameters reach the bound."""
    largest = torch.finfo(dtype).max
    return largest ** (-1.0 / 6.0), largest ** (1.0 / 6.0)


def check_implicit_log_ratio(
    prior_name: str, energy, latents: list[torch.Tensor], ratio: torch.Tensor,
    inputs: Sequence[torch.Tensor] = (), num_pairs: int | None = None,
) -> None:
    r"""Raises ValueError if the implicit prior's per-pair terms ``ratio`` (shape (N,)) or their
    gradients are not finite in the latents' dtype, naming the valid range of latent norms and
    the fix (module docstring). Does nothing without Pyro's validation or while tracing or
    compiling.

    Cost: one fused reduction (the sum of ``ratio``, the largest and smallest row norm of
    the latents) and one synchronisation. The energy's
    :meth:`~rpm.priors._base.Energy.logit_bound`, evaluated at the smallest, the smallest
    positive and the largest row norm, is consulted only when some latent norm leaves
    :math:`[m^{-1/6}, m^{1/6}]` (float32: 3.9e-7 to 2.6e6, m the largest number of the
    dtype); inside it the bound is exceeded only by parameters far beyond trained values (e.g.
    an RBF lengthscale below ~1e-9 of the latents' spread, or a bilinear
    :math:`\lVert W \rVert` above 1e19), and a non-finite loss is still diagnosed.

    :param str prior_name: the prior, for the message.
    :param energy: the energy f.
    :param latents: every latent the energy saw (z, z2, the negatives), each (., D).
    :param torch.Tensor ratio: the per-pair terms, shape (N,), or minus them, or their sum
        (a scalar, with ``num_pairs``; only its finiteness, number and dtype are read).
    :param num_pairs: N when ``ratio`` is a sum.
    :param inputs: tensors checked to be finite in the same reduction (the views of a batch
        whose other checks the caller made before); a non-finite one raises ValueError
        without naming rows (the caller evaluates the batch again with every check).

    Inside :func:`deferred_value_checks` the checks recorded by :func:`defer_values` are made
    in the same reduction (a latent among them is covered by the range: its row norms are
    finite only when its entries are); if one fails, or a latent is not finite while they are
    pending, :class:`DeferredValuesError` is raised (a loss that is not finite for finite
    latents and values is diagnosed as without them).
    """
    if not is_validation_enabled() or torch.jit.is_tracing() or torch.compiler.is_compiling():
        return
    unique: list[torch.Tensor] = []
    for z in latents:
        for seen in unique:
            if z is seen:
                break
        else:
            unique.append(z)
    dtype = ratio.dtype
    pending = _DEFERRED.get()
    deferred = bool(pending)
    finite, positive = _take(pending, unique) if pending else ([], [])
    # the reductions read back together: the loss's sum, the smallest and largest row norm of
    # the latents in their dtype (NaN where a row holds one; infinite where the squares
    # overflow, which happens only far outside the window below), the inputs' largest |x|,
    # the deferred tensors' sums and the deferred scales' minima
    with torch.no_grad():
        rows = unique[0] if len(unique) == 1 else torch.cat(unique)
        norms = torch.linalg.vector_norm(rows, dim=-1)
        values = [ratio if ratio.dim() == 0 else ratio.sum(), *torch.aminmax(norms)]
        for value in inputs:
            if value.is_floating_point() and value.numel():
                values.append(value.abs().amax())
        num_inputs = len(values) - 3
        values += [t.sum() for t in finite]
        values += [scale.amin() for scale in positive]
        for index, value in enumerate(values):
            if value.dtype != dtype:
                values[index] = value.to(dtype)
        total, smallest, largest, *read = torch.stack(values).tolist()
    if not all(math.isfinite(m) for m in read[:num_inputs]):
        raise ValueError(f"{prior_name}: the inputs hold NaN or infinite entries")
    latents_finite = math.isfinite(largest) or all(all_finite(z) for z in unique)
    if deferred:
        sums, smallest_scales = read[num_inputs:num_inputs + len(finite)], read[num_inputs + len(finite):]
        # a loss that is not finite for finite latents is the energy's: diagnosed below
        if not (latents_finite and all(value > 0 for value in smallest_scales)
                and (math.isfinite(sum(sums)) or all(all_finite(t) for t in finite))):
            raise DeferredValuesError(
                f"{prior_name}: the batch's inputs or latents are not finite, or a scale is not "
                "positive")
    num_pairs = ratio.numel() if num_pairs is None else num_pairs
    if math.isfinite(total) and latents_finite:
        low, high = _window(dtype)
        if smallest >= low and largest <= high:
            return
        bound = energy.logit_bound(_norm_extremes(unique)) if isinstance(energy, Energy) else None
        if bound is None or bool(_MARGIN * num_pairs * bound.amax() <= torch.finfo(dtype).max):
            return
    _raise(prior_name, energy, unique, dtype, num_pairs)


def _take(pending: list, latents: list[torch.Tensor]) -> tuple[list, list]:
    """Empties the pending checks (:func:`defer_values`) into the tensors that must be finite,
    less the ``latents`` (covered by the range), and the scales that must be positive."""
    items = pending[:]
    pending.clear()
    finite = [t for checks, _ in items for t in checks if all(t is not z for z in latents)]
    return finite, [scale for _, scales in items for scale in scales]


def _norm_extremes(latents: list[torch.Tensor]) -> torch.Tensor:
    """The smallest and the largest row norm over the latents, then the smallest positive one
    (the largest if none is positive), float64, shape (3,): an energy may treat a row of zeros
    apart (the cosine energy's zero vector), so its bound is read at both smallest norms."""
    norms = torch.cat([torch.linalg.vector_norm(z.detach(), dim=-1, dtype=torch.float64)
                       for z in latents])
    largest = norms.amax()
    positive = norms.where(norms > 0, largest)
    return torch.stack([norms.amin(), largest, positive.amin()])


def _raise(prior_name: str, energy, latents: list[torch.Tensor], dtype: torch.dtype,
           num_pairs: int) -> None:
    """The ValueError of :func:`check_implicit_log_ratio`: what overflowed and the fix."""
    name = type(energy).__name__
    if not all(bool(torch.isfinite(z.detach()).all()) for z in latents):
        raise ValueError(
            f"{prior_name}: the latents are not finite (nan or inf): the encoder's output "
            "overflowed or the inputs hold nan; check the inputs, lower the learning rate, or "
            "compute in float64"
        )
    low, high, _ = _norm_extremes(latents).tolist()
    kind = str(dtype).removeprefix("torch.")
    found = f"{kind} latents of norm {low:.2g} to {high:.2g}"
    fix = ("compute in float64 (model.double() and float64 inputs), or keep the latents in "
           "range (normalise them, e.g. CosineEnergy, or scale the encoder's output or the "
           "energy: a larger lengthscale or temperature)")
    norms = valid_norms(energy, num_pairs, dtype) if isinstance(energy, Energy) else None
    if norms is not None:
        raise ValueError(
            f"{prior_name}: {name} overflows {kind} for {found}: the loss of {num_pairs} pairs "
            f"and its gradients stay finite only for latent norms {_describe(norms)} here (the "
            f"energy's logit_bound); {fix}"
        )
    largest = torch.finfo(dtype).max
    raise ValueError(
        f"{prior_name}: the InfoNCE loss is not finite for {found}: {name} produced values "
        f"beyond the largest {kind} number ({largest:.2g}) or nan (f of the {num_pairs} pairs "
        f"must stay well below {largest / (_MARGIN * num_pairs):.2g}); {fix}"
    )
