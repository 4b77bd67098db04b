r"""Which batches the per-batch checks of a model run on: the first batch of each kind, and every
batch whose loss is not finite (private).

Under ``pyro.enable_validation`` (on by default) a model checks each batch before its step:
the views are tensors with one batch size N >= 2 and finite entries, the recognition models
return N finite latents of the prior's dimension, a deterministic encoder meets a prior that
accepts it. Each check costs a reduction, a synchronisation or a few Python calls; together
they were about 7 % of a training step of a small model (``benchmarks/README.md``, step
overhead), which the issue's rule (validation costing more than a few percent runs once, not
every step) does not allow.

So a model remembers the **signature** of every batch whose checks passed: the shapes, dtypes
and devices of its views and the identity of its modules (:func:`signature`). A later batch
with a remembered signature skips the checks that depend only on the signature (every
structural one) and the value checks (finite inputs and latents); a batch of a new shape,
dtype or device, or after a module was replaced, is checked in full. Values can still go bad
later (a NaN in a later batch, an encoder that starts to overflow): :class:`~rpm.RPMELBO`
checks the ELBO of every step (one synchronisation) and, when it is not finite or a check
downstream refused the batch, evaluates the step again under :func:`full_checks`, where every
check runs, so the error names the input rows or the encoder, as on the first batch. (Pyro's
own ELBOs run the model and guide, whose checks follow the same rule, but do not evaluate a
step again: there a later NaN shows as a non-finite loss.) The implicit priors' range check
(:func:`~rpm.priors.energy_range.check_implicit_log_ratio`) runs on every batch; it guards the
gradients too, which a finite loss does not.
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
    identities of the modules the checks concern); None when an entry is not a tensor (such a
    batch is always checked: the checks name what is wrong)."""
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
