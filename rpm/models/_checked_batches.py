r"""Which batches the per-batch checks of a model run on (private).

The checks of a batch: the views are tensors with one batch size N >= 2 and, under
``pyro.enable_validation``, finite entries; the recognition models return N latents (finite,
under validation) of the prior's dimension; a deterministic encoder meets a prior that accepts
it (Appendix B of Aitchison & Ganev).

* The structural checks (the views' batch sizes, the recognition models' output shapes and
  dimension, the prior's requirements) run on the first batch of each **signature**
  (:func:`signature`): the shapes, dtypes and devices of the views and the
  ``rpm.nn._structure_version``, which changes with every assignment of a module or
  attribute of the package's modules (a prior, an energy, a recognition model,
  ``noise_scale``): the checks are decided by what was assigned, never by object identities,
  so no sequence of assignments skips the checks of the modules assigned last.
* Under ``pyro.enable_validation`` (Pyro's default) **every batch** has its values checked:
  the recognition parameters, which are all the objective reads of a batch (a Delta's
  latents, a Gaussian's location and scale), finite and the scales positive, in one reduction
  (:func:`check_values`; within an :class:`~rpm.RPMELBO` evaluation, in the reduction of the
  implicit prior's range check when the batch reaches one); a batch that fails it is encoded
  again under :func:`full_checks`, where every check runs and the error names the input rows
  that hold NaN or infinite entries, or the encoder. (A non-finite input entry that the
  encoder does not propagate into its outputs leaves the loss and its gradients finite, and
  is not reported.)

The implicit priors' range check (``rpm.priors._energy_range.check_implicit_log_ratio``)
runs on every batch under validation; it guards the gradients too, which a finite loss does
not.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Hashable, Iterator, Sequence

import torch
from pyro.distributions import Delta, Independent, Normal
from torch.distributions import Distribution

from rpm.ops._finite import all_finite
from rpm.priors._energy_range import defer_values

__all__ = ["check_values", "checks_skipped", "full_checks", "passed", "remember", "signature",
           "skipped_checks", "value_tensors", "values_valid"]

_FULL = contextvars.ContextVar("rpm_full_checks", default=False)
_SKIP = contextvars.ContextVar("rpm_skipped_checks", default=False)
# Signatures kept per model; beyond this the memory is cleared (a loop over many shapes).
_LIMIT = 256
_ATTRIBUTE = "_rpm_checked_batches"


def signature(tensors, *extra: Hashable) -> tuple | None:
    """The signature of a batch: ``(shape, dtype, device)`` of each tensor, then ``extra`` (the
    ``rpm.nn._structure_version``); None when an entry is not a tensor (such a batch is
    always checked: the checks name what is wrong)."""
    parts = []
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor):
            return None
        parts.append((tensor.shape, tensor.dtype, tensor.device))
    return (*parts, *extra)


def passed(owner, key: tuple | None) -> bool:
    """True when the checks of ``owner`` passed for a batch of signature ``key`` before (and
    :func:`full_checks` is not active): they may be skipped."""
    if key is None or _FULL.get():
        return False
    return key in owner.__dict__.get(_ATTRIBUTE, ())


def remember(owner, key: tuple | None) -> None:
    """Records that the checks of ``owner`` passed for signature ``key``."""
    if key is None:
        return
    seen = owner.__dict__.get(_ATTRIBUTE)
    if seen is None or len(seen) >= _LIMIT:
        seen = owner.__dict__[_ATTRIBUTE] = set()
    seen.add(key)


@contextlib.contextmanager
def full_checks() -> Iterator[None]:
    """Every check runs inside this context, remembered signatures or not."""
    token = _FULL.set(True)
    try:
        yield
    finally:
        _FULL.reset(token)


class skipped_checks:  # noqa: N801 (a context manager, named as one)
    """Inside this context the recognition models skip their value checks: the model runs it
    around the encoder calls of a batch whose signature passed before. (A class rather than a
    generator: it runs on every step.)"""

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token = _SKIP.set(True)

    def __exit__(self, *exc) -> None:
        _SKIP.reset(self._token)


def checks_skipped() -> bool:
    """True inside :func:`skipped_checks` (a recognition model called by a model on a batch of a
    remembered signature)."""
    return _SKIP.get()


def value_tensors(recognitions: Sequence[Distribution]
                  ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The tensors of a batch that must be finite (the location of a Delta, the location and
    scale of a (diagonal) Normal; any other family checks its own) and the scales that must
    be positive."""
    tensors = []
    scales = []
    for dist in recognitions:
        base = dist.base_dist if isinstance(dist, Independent) else dist
        if isinstance(base, Delta):
            tensors.append(base.v)
        elif isinstance(base, Normal):
            tensors += [base.loc, base.scale]
            scales.append(base.scale)
    return tensors, scales


def values_valid(tensors: Sequence[torch.Tensor], scales: Sequence[torch.Tensor]) -> bool:
    r"""True when every entry of ``tensors`` is finite and every entry of ``scales`` positive.

    One synchronisation: the sums :math:`s_t = \sum_k x_{t,k}` and the smallest scales are read
    together, and :math:`\sum_t s_t` is finite only when every entry is (a NaN or an infinity
    makes it NaN or infinite); only when it overflows with finite entries is each tensor tested
    on its own (:func:`~rpm.ops._finite.all_finite`)."""
    if not tensors:
        return True
    with torch.no_grad():
        dtype = tensors[0].dtype
        values = [t.sum() for t in tensors] + [scale.amin() for scale in scales]
        values = torch.stack([v if v.dtype == dtype else v.to(dtype) for v in values]).tolist()
    sums, smallest = values[:len(tensors)], values[len(tensors):]
    if any(not value > 0 for value in smallest):
        return False
    return math.isfinite(sum(sums)) or all(all_finite(t) for t in tensors)


def check_values(recognitions: Sequence[Distribution]) -> bool:
    r"""True when every entry of the recognition distributions' parameters (location, and
    scale for a Gaussian) is finite and every scale is positive (:func:`value_tensors`,
    :func:`values_valid`); the value checks of a batch whose structure passed before (the
    views themselves are read by the objective only through these parameters).

    Inside :func:`~rpm.priors._energy_range.deferred_value_checks` (an
    :class:`~rpm.RPMELBO` evaluation) the check is recorded instead and True returned: the
    implicit prior's range check makes it in its own reduction, or the evaluation makes it
    at its end (:func:`~rpm.priors._energy_range.defer_values`).

    :param recognitions: the recognition distributions of the batch.
    """
    tensors, scales = value_tensors(recognitions)
    if defer_values(tensors, scales):
        return True
    return values_valid(tensors, scales)
