r"""Which batches the per-batch checks of a model run on (private).

The checks of a batch: the views are tensors with one batch size N >= 2 and, under
``pyro.enable_validation``, finite entries; the recognition models return N latents (finite,
under validation) of the prior's dimension; a deterministic encoder meets a prior that accepts
it (Appendix B of Aitchison & Ganev).

* Under ``pyro.enable_validation`` (Pyro's default) **every batch** runs every check.
  :class:`~rpm.RPMELBO`'s specialised step (:mod:`rpm.inference.fast_step`) makes the value
  checks one fused reduction and, when it refuses a batch, evaluates it again under
  :func:`full_checks`, so that the error names the input rows or the encoder.
* Without validation the structural checks run on the first batch of each **signature** and
  no value check runs. A signature (:func:`signature`) is the shapes, dtypes and devices of the
  views and the :func:`~rpm.nn.structure_version`, which changes with every assignment of a
  module or attribute of the package's modules (a prior, an energy, a recognition model,
  ``noise_scale``): the checks are decided by what was assigned, never by object identities,
  so no sequence of assignments skips the checks of the modules assigned last.

The implicit priors' range check (:func:`~rpm.priors.energy_range.check_implicit_log_ratio`)
runs on every batch under validation; it guards the gradients too, which a finite loss does
not.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Hashable, Iterator

import torch

__all__ = ["checks_skipped", "full_checks", "passed", "remember", "signature", "skipped_checks"]

_FULL = contextvars.ContextVar("rpm_full_checks", default=False)
_SKIP = contextvars.ContextVar("rpm_skipped_checks", default=False)
# Signatures kept per model; beyond this the memory is cleared (a loop over many shapes).
_LIMIT = 256
_ATTRIBUTE = "_rpm_checked_batches"


def signature(tensors, *extra: Hashable) -> tuple | None:
    """The signature of a batch: ``(shape, dtype, device)`` of each tensor, then ``extra`` (the
    :func:`~rpm.nn.structure_version`); None when an entry is not a tensor (such a batch is
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
