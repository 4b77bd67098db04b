"""The figure of ``rpm masks``: test MCC per prior, MCC against the training step, and the
first frames of a test video."""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch
from matplotlib.figure import Figure

from rpm.experiments.figures import colours_for

__all__ = ["plot_masks"]


def plot_masks(path: str | os.PathLike, priors: Mapping[str, Mapping], frames: torch.Tensor,
               true_shape: float, learned_shape: float | None) -> Figure:
    """Draws ``masks.png``: MCC per prior (bars), the MCC trajectories, and ``frames``.

    :param path: the PNG to write.
    :param priors: per prior, its result (``mcc``, ``trajectory`` with ``step`` and ``mcc``).
    :param torch.Tensor frames: frames of one test video. Shape: (F, 1, S, S).
    :param float true_shape: the generator's shape, named in the title.
    :param learned_shape: the learned prior's shape, or None.
    """
    names = list(priors)
    colours = colours_for(names)
    fig = Figure(figsize=(10, 5.2), layout="constrained")
    grid = fig.add_gridspec(2, max(len(frames), 2), height_ratios=(3, 1))
    bars = fig.add_subplot(grid[0, : grid.ncols // 2])
    bars.bar(names, [priors[name]["mcc"] for name in names],
             color=[colours[name] for name in names])
    for i, name in enumerate(names):
        bars.text(i, priors[name]["mcc"] + 0.01, f"{priors[name]['mcc']:.3f}", ha="center")
    bars.set_ylim(0, 1.05)
    bars.set_ylabel("test MCC")
    bars.set_title("MCC per prior")
    curves = fig.add_subplot(grid[0, grid.ncols // 2:])
    for name in names:
        trajectory = priors[name]["trajectory"]
        curves.plot(trajectory["step"], trajectory["mcc"], color=colours[name], label=name)
    curves.set_xlabel("step")
    curves.set_ylabel("test MCC")
    curves.set_ylim(0, 1.05)
    curves.legend()
    for i, frame in enumerate(frames):
        axis = fig.add_subplot(grid[1, i])
        axis.imshow(frame[0].cpu().numpy(), cmap="gray", vmin=0, vmax=1)
        axis.set_axis_off()
    learned = "" if learned_shape is None else f", learned {learned_shape:.2f}"
    fig.suptitle(f"moving masks, generalized-normal steps of shape {true_shape}{learned}")
    fig.savefig(path, dpi=100)
    return fig
