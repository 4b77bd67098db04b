"""Draws from torch's global generator made a function of a ``torch.Generator``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

__all__ = ["global_rng_from"]


@contextlib.contextmanager
def global_rng_from(generator: torch.Generator,
                    devices: Sequence[torch.device | int] = ()) -> Iterator[None]:
    """Inside the block, torch's global generator (the CPU's, and that of each CUDA device in
    ``devices``) is seeded with one number drawn from ``generator`` (a CPU
    ``torch.Generator``), so that code drawing from the global generator (kornia, Pyro's
    samplers, torch.distributions) draws a function of ``generator``'s state; those states are
    restored at the end (:func:`torch.random.fork_rng`) and no other device's is touched."""
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    with torch.random.fork_rng(devices=list(devices)):
        torch.default_generator.manual_seed(seed)
        for device in devices:
            with torch.cuda.device(device):
                torch.cuda.manual_seed(seed)
        yield
