"""Figures of ``rpm rpm-hmm``: the learned transition matrix beside the true one, and a stretch
of the held-out chain's true classes against the posterior modes."""

from __future__ import annotations

import os

import numpy as np
from matplotlib.figure import Figure
from matplotlib.image import AxesImage

from rpm.experiments.figures import DPI

__all__ = ["plot_transitions"]


def _matrix(ax, matrix: np.ndarray, title: str, vmax: float) -> AxesImage:
    image = ax.imshow(matrix, cmap="viridis", vmin=0.0, vmax=vmax)
    size = matrix.shape[0]
    for i in range(size):
        for j in range(size):
            value = matrix[i, j]
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7,
                    color="black" if value > 0.6 * vmax else "white")
    ax.set_xticks(range(size))
    ax.set_yticks(range(size))
    ax.set_xlabel("next digit")
    ax.set_ylabel("digit")
    ax.set_title(title, fontsize=10)
    return image


def plot_transitions(path: str | os.PathLike, learned: np.ndarray, true: np.ndarray,
                     classes: np.ndarray, modes: np.ndarray, error: float, accuracy: float,
                     frames: int = 150) -> Figure:
    """The learned transition matrix (its states renamed as the classes they were matched to)
    beside the true one, each cell written, and below them the first ``frames`` frames of the
    held-out chain: the true digit and the matched posterior mode.

    :param path-like path: the PNG to write.
    :param learned: the matched learned matrix. Shape: (K, K).
    :param true: the true matrix. Shape: (K, K).
    :param classes: the held-out chain's digits. Shape: (T,).
    :param modes: its matched posterior modes. Shape: (T,).
    :param float error: the transition error, shown in the title.
    :param float accuracy: the held-out state accuracy, shown in the title.
    :param int frames: the frames of the chain drawn.
    :returns: the figure.
    """
    learned, true = np.asarray(learned), np.asarray(true)
    fig = Figure(figsize=(9.0, 6.4), layout="constrained")
    grid = fig.add_gridspec(2, 2, height_ratios=[3.0, 1.2])
    vmax = float(max(learned.max(), true.max()))
    _matrix(fig.add_subplot(grid[0, 0]), true, "true transition matrix", vmax)
    image = _matrix(fig.add_subplot(grid[0, 1]), learned,
                    f"learned (max abs. difference {error:.3f})", vmax)
    fig.colorbar(image, ax=fig.axes, shrink=0.8, location="right")
    ax = fig.add_subplot(grid[1, :])
    shown = min(frames, len(classes))
    steps = np.arange(shown)
    ax.step(steps, classes[:shown], where="mid", color="black", lw=2.5, label="true digit")
    ax.step(steps, modes[:shown], where="mid", color="tab:orange", lw=1.2, ls="--",
            label="posterior mode")
    ax.set_xlabel("frame of the held-out chain")
    ax.set_ylabel("digit")
    ax.set_yticks(range(true.shape[0]))
    ax.set_ylim(-0.5, true.shape[0] + 0.6)  # room for the legend above the top state
    ax.legend(fontsize=7, loc="upper right", ncol=2)
    fig.suptitle(f"RPM-HMM on a chain of digits: held-out state accuracy {100 * accuracy:.1f}%",
                 fontsize=10)
    fig.savefig(path, dpi=DPI)
    return fig
