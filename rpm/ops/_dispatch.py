r"""The dispatch policy of the kernels of :mod:`rpm.ops`: when the mixture marginal runs in the
fused Triton kernel, when a matrix of pairwise terms is streamed in blocks instead of stored,
how big the blocks are, and full-precision float32 matrix products.

The fused kernel (:func:`~rpm.ops._gaussian_mixture.fused_gaussian_mixture_log_prob`) serves the mixture
marginal of float32 CUDA inputs with at most ``FUSED_MAX_DIM`` latent dimensions whenever Triton
is importable, at every size: it never stores the M x N matrix and computes each pair in the
difference form. That form has no matrix product: its backward pass costs about 13 scalar
operations per pair and dimension where the expansion's three matrix products cost 6 fused
multiply-adds, so for wider latents the matrix-product paths below are used.
:func:`fused_mixture_kernel` switches it off or on for a block of code, and the ``fused``
argument of :func:`~rpm.ops.gaussian_mixture_log_prob` for one call. The switch is a
:class:`contextvars.ContextVar`: it holds for the thread (or asyncio task) that entered the
block, until the block exits; other threads and tasks keep their own value (the default,
allowed, in a thread that never set it).

One rule serves the mixture marginal (:func:`~rpm.ops.gaussian_mixture_log_prob`) and the
InfoNCE normaliser of the implicit prior (:func:`~rpm.ops.streaming_matmul_logsumexp`): an
M x N matrix is streamed when the caller asks for a block size, or when it has more than
``STREAMING_MIN_PAIRS[device type]`` entries. On the CPU the blocked kernels are also the
faster ones from about 512 x 512 pairs on (cache-sized blocks, no M x N temporaries; measured
in ``benchmarks/marginal.py``); on CUDA the dense kernels win until memory matters.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.util
from collections.abc import Iterator

import torch

__all__ = [
    "FUSED_MAX_DIM",
    "RECOMPUTE_MIN_PAIRS",
    "STREAMING_MIN_PAIRS",
    "default_block_size",
    "fused_mixture_allowed",
    "fused_mixture_kernel",
    "ieee_float32_matmul",
    "triton_available",
    "use_fused_mixture",
    "use_streaming",
]

#: Above this many pairs (per device type) a matrix is streamed by default.
#: On CUDA the dense kernels are the faster ones at every size that fits (about 2x for the
#: mixture and the normaliser, benchmarks/marginal.py); the limit, 8192 x 8192 pairs, keeps the
#: dense mixture's temporaries near 2 GB.
STREAMING_MIN_PAIRS = {"cpu": 1 << 18, "cuda": 1 << 26}
#: Above this many pairs a streamed kernel built from a user's ``forward`` (which keeps its
#: autograd intermediates, unlike the hand-written kernels) recomputes each block in the
#: backward pass instead of keeping them: 4M pairs, 16 MB per float32 matrix. Below it the
#: blocks' intermediates fit and recomputing them would only cost time (about 1.5x).
RECOMPUTE_MIN_PAIRS = 1 << 22
# ... on any other device type.
_OTHER_MIN_PAIRS = 1 << 22
# Default block edge per device type: a block of the streamed matrix is block_size^2 elements.
_DEFAULT_BLOCK_SIZE = {"cpu": 1024, "cuda": 4096}
#: The widest latent (D) the fused mixture kernel serves by default; wider latents use the
#: dense or streamed matrix-product kernels (module docstring).
FUSED_MAX_DIM = 32
# Whether the fused mixture kernel may be used in the current context (thread or asyncio task);
# set only by fused_mixture_kernel.
_FUSED_MIXTURE: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "rpm_fused_mixture_kernel", default=True)


@functools.cache
def triton_available() -> bool:
    """Whether Triton is installed (found without importing it)."""
    return importlib.util.find_spec("triton") is not None


def fused_mixture_allowed() -> bool:
    """Whether the fused mixture kernel may be chosen automatically in the current context:
    True unless the innermost enclosing :func:`fused_mixture_kernel` block of this thread (or
    asyncio task) says ``False``."""
    return _FUSED_MIXTURE.get()


def use_fused_mixture(z: torch.Tensor, fused: bool | None = None) -> bool:
    """Whether the mixture marginal of these points runs in the fused Triton kernel.

    With ``fused=None`` (automatic): float32 on CUDA, at most :data:`FUSED_MAX_DIM`
    dimensions, Triton installed, and not switched off by :func:`fused_mixture_kernel` in the
    current context. ``fused=True`` or ``False`` decides for the call, whatever the context
    (True asks for the kernel even where it cannot run: the kernel then says why).

    :param torch.Tensor z: the points, shape (M, D) (their device and dtype are those of the
        whole call).
    :param fused: None for the automatic choice, or the caller's choice.
    :return: True for the fused kernel.
    :raises TypeError: if ``fused`` is not None, True or False.
    """
    if fused is not None and not isinstance(fused, bool):
        raise TypeError(f"fused must be None (automatic), True or False, got {fused!r}")
    if fused is not None:
        return fused
    return (fused_mixture_allowed() and z.device.type == "cuda" and z.dtype == torch.float32
            and z.shape[-1] <= FUSED_MAX_DIM and triton_available())


@contextlib.contextmanager
def fused_mixture_kernel(enabled: bool) -> Iterator[None]:
    """Context manager that allows (``True``) or forbids (``False``) the automatic choice of
    the fused Triton kernel in :func:`~rpm.ops.gaussian_mixture_log_prob` inside the block;
    forbidden, the dense and streamed paths serve every device as on a machine without Triton.

    The setting is scoped: it holds in the thread (or asyncio task) that entered the block and
    only until the block exits (also on an exception), where the value from before comes back;
    blocks nest. Other threads and tasks are not affected. A call's own ``fused=True`` or
    ``fused=False`` takes precedence over the block.

    :param bool enabled: whether the fused kernel may be chosen inside the block.
    :raises TypeError: if ``enabled`` is not a bool.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"fused_mixture_kernel(enabled) takes True or False, got {enabled!r}")
    token = _FUSED_MIXTURE.set(enabled)
    try:
        yield
    finally:
        _FUSED_MIXTURE.reset(token)


def use_streaming(
    num_rows: int, num_cols: int, device: torch.device | str, block_size: int | None = None
) -> bool:
    """Whether an (num_rows, num_cols) matrix of pairwise terms is streamed in blocks.

    :param int num_rows: M, the rows (points, or first-view latents).
    :param int num_cols: N, the columns (components, or candidates).
    :param device: the device of the inputs.
    :param block_size: a block edge asked for by the caller (then always streamed), or None.
    :return: True to stream, False for the dense matrix.
    """
    if block_size is not None:
        return True
    kind = device.type if isinstance(device, torch.device) else torch.device(device).type
    limit = STREAMING_MIN_PAIRS.get(kind, _OTHER_MIN_PAIRS)
    return num_rows * num_cols > limit


def default_block_size(device: torch.device | str) -> int:
    """The default block edge for a device: 1024 on the CPU (cache-sized), 4096 on CUDA.

    :param device: the device of the inputs.
    :return: the number of rows (and columns) per block.
    """
    return _DEFAULT_BLOCK_SIZE.get(torch.device(device).type, 1024)


@contextlib.contextmanager
def ieee_float32_matmul() -> Iterator[None]:
    """Context manager that switches TF32 off for CUDA matrix products (restored on exit).

    TF32 rounds the inputs of a float32 product to 10 mantissa bits, which moves the mixture
    log-density by about 1e-2; every matrix product of the kernels runs in full float32.
    """
    allow_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32
