"""Argument checks of the synthetic-data modules that are specific to them (private): the
latent space with its dimension, and a generator's device. The generic number, count and choice
checks are those of :mod:`rpm._validation`."""

from __future__ import annotations

import torch

from rpm._validation import check_choice, check_positive_int
from rpm.data.synthetic.spaces import SPACES


def check_space_dim(space: object, dim: object) -> tuple[str, int]:
    """Check the space name and the latent dimension (>= 1; >= 2 on the sphere)."""
    check_choice("space", space, SPACES)
    dim = check_positive_int("dim", dim)
    if space == "sphere" and dim < 2:
        raise ValueError(f"the sphere needs dim >= 2 (dim is the ambient dimension), got {dim}")
    return str(space), dim


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
