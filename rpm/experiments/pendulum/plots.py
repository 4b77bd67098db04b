"""The figure of ``rpm pendulum`` (``pendulum.png``): frames of a held-out video and its state
:math:`(\\sin\\theta, \\cos\\theta, \\omega)` against the read-out from the smoothed latents.

Figures are drawn on :class:`matplotlib.figure.Figure` objects directly (no ``pyplot`` state).
"""

from __future__ import annotations

import os

import numpy as np
import torch
from matplotlib.figure import Figure

from rpm.experiments.figures import DPI

__all__ = ["plot_pendulum"]

_SHOWN = 8


def plot_pendulum(path: str | os.PathLike, frames: torch.Tensor, states: torch.Tensor | None,
                  decoded: torch.Tensor, r2: float | None,
                  names: tuple[str, ...] | None = ("sin theta", "cos theta", "omega"),
                  value_range: tuple[float, float] | None = (0.0, 1.0)) -> Figure:
    """Top: every fifth of the first 40 frames of a held-out video. Bottom: its true state
    (solid, the first three coordinates) and the affine read-out of the smoothed latents
    (dashed); without states, the first three smoothed latents of the video.

    :param path-like path: the PNG to write.
    :param torch.Tensor frames: the video, (T, C, H, W): the first channel is shown, or the
        colours of a three-channel video.
    :param states: its state, (T, K), or None.
    :param torch.Tensor decoded: the read-out, (T, K); without states the smoothed latents.
    :param r2: the held-out R^2, in the title, or None.
    :param names: the state's coordinates in the legend (default: ``state 0``, ...).
    :param value_range: the intensities shown black and white; None: the video's range.
    """
    fig = Figure(figsize=(9.0, 4.6), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[1, 1.6])
    axes = top.subplots(1, _SHOWN)
    low, high = value_range or (float(frames.min()), float(frames.max()))
    for k, ax in enumerate(axes):
        t = 5 * k
        if t < len(frames):
            if frames.shape[1] == 3:
                image = ((frames[t] - low) / max(high - low, 1e-12)).clamp(0, 1)
                ax.imshow(image.permute(1, 2, 0).numpy())
            else:
                ax.imshow(frames[t, 0].numpy(), cmap="gray", vmin=low, vmax=high)
            ax.set_title(f"t = {t}", fontsize=8)
        ax.axis("off")
    ax = bottom.subplots()
    steps = np.arange(len(decoded))
    for k in range(min(3, decoded.shape[1])):
        if states is None:
            ax.plot(steps, decoded[:, k].numpy(), lw=1.2, label=f"latent {k}")
            continue
        label = names[k] if names is not None else f"state {k}"
        line, = ax.plot(steps, states[:, k].numpy(), lw=1.2, label=label)
        ax.plot(steps, decoded[:, k].numpy(), ls="--", color=line.get_color(), lw=1.2)
    ax.set_xlabel("frame")
    ax.legend(fontsize=8, ncol=3, loc="upper right")
    ax.set_title("a video's smoothed latents (no states to compare with)" if states is None
                 else "held-out video: state (solid) and read-out of the smoothed latents "
                 f"(dashed); R^2 {r2:.3f}", fontsize=9)
    fig.savefig(path, dpi=DPI)
    return fig
