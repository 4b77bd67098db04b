r"""Learning-rate schedules shared by the experiments."""

from __future__ import annotations

import math

__all__ = ["cosine_schedule"]


def cosine_schedule(num_steps: int, warmup: float):
    r"""The learning-rate factor of step s: a linear warm-up over the first
    :math:`W = \lceil w S \rceil` steps, then a cosine decay to 0,

    .. math::

        \eta_s / \eta = \frac{s + 1}{W} \ (s < W), \qquad
        \eta_s / \eta = \tfrac12 \Big(1 + \cos \frac{\pi (s - W)}{S - W}\Big) \ (s \ge W).

    :param int num_steps: S.
    :param float warmup: w in [0, 1].
    :return: a function of the step s (for :class:`torch.optim.lr_scheduler.LambdaLR`).
    """
    warm = min(num_steps, math.ceil(warmup * num_steps))

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return 0.5 * (1.0 + math.cos(math.pi * (step - warm) / max(1, num_steps - warm)))

    return factor
