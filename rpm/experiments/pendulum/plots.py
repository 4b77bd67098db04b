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


def plot_pendulum(path: str | os.PathLike, frames: torch.Tensor, states: torch.Tensor,
                  decoded: torch.Tensor, r2: float) -> Figure:
    """Top: every fifth of the first 40 frames of a held-out video. Bottom: its true state
    (solid) and the affine read-out of the smoothed latents (dashed).

    :param path-like path: the PNG to write.
    :param torch.Tensor frames: the video, (T, 1, S, S).
    :param torch.Tensor states: its state, (T, 3).
    :param torch.Tensor decoded: the read-out, (T, 3).
    :param float r2: the held-out R^2, in the title.
    """
    fig = Figure(figsize=(9.0, 4.6), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[1, 1.6])
    axes = top.subplots(1, _SHOWN)
    for k, ax in enumerate(axes):
        t = 5 * k
        if t < len(frames):
            ax.imshow(frames[t, 0].numpy(), cmap="gray", vmin=0, vmax=1)
            ax.set_title(f"t = {t}", fontsize=8)
        ax.axis("off")
    ax = bottom.subplots()
    steps = np.arange(len(states))
    for k, name in enumerate(("sin theta", "cos theta", "omega")):
        line, = ax.plot(steps, states[:, k].numpy(), lw=1.2, label=name)
        ax.plot(steps, decoded[:, k].numpy(), ls="--", color=line.get_color(), lw=1.2)
    ax.set_xlabel("frame")
    ax.legend(fontsize=8, ncol=3, loc="upper right")
    ax.set_title(f"held-out video: state (solid) and read-out of the smoothed latents (dashed); "
                 f"R^2 {r2:.3f}", fontsize=9)
    fig.savefig(path, dpi=DPI)
    return fig
