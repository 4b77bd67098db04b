r"""Vectorised rejection sampling: draw :math:`K` proposals per item at once and keep the first
accepted one. Since the proposals are i.i.d., taking the first accepted of a sequence split into
rounds of any sizes gives exactly the target law.
"""

from __future__ import annotations

import math

import torch

__all__ = ["first_accepted", "oversampling_factor"]


def oversampling_factor(acceptance: float, miss_probability: float = 1e-9,
                        max_factor: int = 64) -> int:
    r"""Number :math:`K` of proposals drawn at once per item so that all :math:`K` are rejected
    with probability :math:`(1 - a)^K \le` ``miss_probability``, capped at ``max_factor``.

    :param float acceptance: lower bound :math:`a \in (0, 1]` on the acceptance probability.
    :param float miss_probability: target probability that an item needs a fallback round.
    :param int max_factor: cap on :math:`K` (memory); extra rounds then cover the rest.
    :returns: :math:`K \ge 1`.
    :rtype: int
    """
    if not 0.0 < acceptance <= 1.0:
        raise ValueError(f"acceptance must lie in (0, 1], got {acceptance!r}")
    if acceptance >= 1.0 - 1e-15:
        return 1
    k = math.ceil(math.log(miss_probability) / math.log1p(-acceptance))
    return max(1, min(k, max_factor))


def first_accepted(proposal: torch.Tensor, accepted: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Select, for every item, the first accepted of its :math:`K` proposals.

    :param torch.Tensor proposal: proposals along the leading axis. Shape: ``(K, *item_shape)``.
    :param torch.Tensor accepted: boolean acceptance mask. Shape: as ``proposal``.
    :returns: ``(value, found)``: the first accepted proposal (arbitrary where none was) and
        whether one was. Shape: ``item_shape`` each.
    :rtype: tuple[torch.Tensor, torch.Tensor]
    """
    first = accepted.to(proposal.dtype).argmax(dim=0, keepdim=True)   # first maximum: (1, ...)
    return proposal.gather(0, first).squeeze(0), accepted.any(dim=0)
