r"""Device-level settings shared by the kernels of :mod:`rpm.ops`: the block edge of the
streamed kernels and full-precision float32 matrix products."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["default_block_size", "ieee_float32_matmul"]

# Default block edge per device type: a block of the streamed matrix is block_size^2 elements.
_DEFAULT_BLOCK_SIZE = {"cpu": 1024, "cuda": 4096}


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
    log-density by about 1e-2; every matrix product of this module runs in full float32.
    """
    allow_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32
