r"""Missing frames at random: the masks over frames that :class:`~rpm.RPM` and the Kalman kernels
take (``mask=``, True = observed; ``docs/theory.md``, sequences).

Each frame is dropped independently with probability p (missing completely at random), so a
sequence of T frames keeps :math:`\mathrm{Binomial}(T, 1 - p)` of them; the ELBO of the
remaining frames is exact (the state-space prior marginalises the dropped ones).
"""

from __future__ import annotations

import torch

__all__ = ["drop_frames"]


def drop_frames(shape: tuple[int, ...] | torch.Size, fraction: float,
                generator: torch.Generator | None = None,
                device: torch.device | str | None = None) -> torch.Tensor:
    r"""A mask over frames with each frame dropped independently with probability ``fraction``.

    .. math::

        m_{n,t} \sim \mathrm{Bernoulli}(1 - p) \quad \text{independently}, \qquad
        m_{n,t} = 1: \text{frame t of sequence n is observed}.

    :param shape: the mask's shape, e.g. (N, T) for N sequences of T frames.
    :param float fraction: p, in [0, 1).
    :param generator: the random numbers' source (a seeded ``torch.Generator`` for a
        reproducible mask); None: torch's global generator.
    :param device: where the mask lives (default: CPU).
    :return: a bool tensor of ``shape``, True where the frame is kept.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
        raise ValueError(f"fraction must be a number in [0, 1) (the probability of dropping a "
                         f"frame), got {fraction!r}")
    shape = torch.Size(shape)
    if fraction == 0:
        return torch.ones(shape, dtype=torch.bool, device=device)
    uniform = torch.rand(shape, generator=generator,
                         device=generator.device if generator is not None else device)
    return (uniform >= fraction).to(device)
