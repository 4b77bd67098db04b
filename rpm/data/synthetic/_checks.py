"""Argument checks shared by the synthetic-data modules (private)."""

from __future__ import annotations

import math

import torch

from rpm.data.synthetic.spaces import SPACES


def positive_float(name: str, value: object) -> float:
    """Return ``value`` as a float after checking it is a finite positive real number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a positive float, got {type(value).__name__} {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return float(value)


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    """Return ``value`` after checking it is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return str(value)


def check_space_dim(space: object, dim: object) -> tuple[str, int]:
    """Check the space name and the latent dimension (>= 1; >= 2 on the sphere)."""
    check_choice("space", space, SPACES)
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ValueError(f"dim must be a positive integer, got {dim!r}")
    if space == "sphere" and dim < 2:
        raise ValueError(f"the sphere needs dim >= 2 (dim is the ambient dimension), got {dim}")
    return str(space), dim


def check_batch_size(batch_size: object) -> int:
    """Check a batch size is a positive integer."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    return batch_size


def check_generator(generator: torch.Generator | None, device: torch.device) -> None:
    """Check that a generator (if any) lives on the sampling device."""
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got "
                        f"{type(generator).__name__}")
    gdev = generator.device
    if gdev.type != device.type or (
            device.index is not None and gdev.index is not None and gdev.index != device.index):
        raise ValueError(f"the generator lives on {gdev} but samples are drawn on {device}; "
                         f"create it with torch.Generator(device={str(device)!r})")
