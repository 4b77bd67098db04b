r"""A finiteness test for the validation checks of every step.

``torch.isfinite(x).all()`` builds a boolean tensor of the size of x from several kernels
(:math:`x = x` and :math:`|x| \ne \infty`), then reduces it. :func:`all_finite` reduces once
instead: :math:`\max_k |x_k|` is finite exactly when every entry is (``amax`` propagates NaN,
and an infinite entry makes the maximum infinite).
"""

from __future__ import annotations

import math

import torch

__all__ = ["all_finite"]


def all_finite(tensor: torch.Tensor) -> bool:
    r"""True when every entry of a floating-point tensor is finite (no NaN, no :math:`\pm\infty`):
    :math:`\max_k |x_k| < \infty`, one reduction and one synchronisation.

    :param torch.Tensor tensor: a floating-point tensor (an empty one is finite).
    :rtype: bool
    """
    if tensor.numel() == 0:
        return True
    with torch.no_grad():
        return math.isfinite(tensor.detach().abs().amax().item())
