"""Figures of the ``rpm bouncing-balls`` experiment: held-out R^2 per prior, true against decoded
trajectories, and the learned feature maps.

Figures are drawn on :class:`matplotlib.figure.Figure` objects directly (no ``pyplot`` state, no
interactive backend), so they can be written from any process or thread.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from matplotlib.figure import Figure

__all__ = ["plot_comparison", "plot_feature_maps", "plot_trajectories"]

_BALL_COLOURS = ("tab:red", "tab:green", "tab:blue", "tab:orange", "tab:purple", "tab:brown")


def _numpy(tensor: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(tensor, torch.Tensor):
        return tensor.detach().to("cpu", torch.float64).numpy()
    return np.asarray(tensor, dtype=np.float64)


def plot_comparison(path: str | os.PathLike, results: Mapping[str, Mapping[str, float]]) -> None:
    """Bar chart of the held-out R^2 and pixel error of each prior, with the untrained encoder's
    R^2 as a marker.

    :param path-like path: the PNG to write.
    :param dict results: prior name -> ``{"r2": float, "pixel_error": float,
        "untrained_r2": float}``.
    """
    names = list(results)
    r2 = [results[name]["r2"] for name in names]
    untrained = [results[name]["untrained_r2"] for name in names]
    error = [results[name]["pixel_error"] for name in names]
    positions = np.arange(len(names))
    fig = Figure(figsize=(7.0, 2.8), layout="constrained")
    left, right = fig.subplots(1, 2)
    bars = left.bar(positions, r2, color="tab:blue", label="trained")
    left.scatter(positions, untrained, marker="_", s=400, color="black", zorder=3,
                 label="untrained encoder")
    left.bar_label(bars, labels=[f"{value:.3f}" for value in r2], padding=2, fontsize=8)
    left.set_ylim(min(0.0, *r2, *untrained) - 0.02, 1.3)
    left.set_yticks(np.linspace(0.0, 1.0, 6))
    left.set_ylabel(r"held-out position $R^2$")
    left.legend(loc="upper left", ncols=2, fontsize=7, frameon=False)
    bars = right.bar(positions, error, color="tab:orange")
    right.bar_label(bars, labels=[f"{value:.2f}" for value in error], padding=2, fontsize=8)
    right.set_ylim(0.0, 1.15 * max(error))
    right.set_ylabel("held-out error (pixels)")
    for axes in (left, right):
        axes.set_xticks(positions, names)
        axes.spines[["top", "right"]].set_visible(False)
    fig.suptitle("Bouncing balls: linear read-out of the ball positions from the 6 RPM outputs",
                 fontsize=9)
    fig.savefig(path, dpi=100)


def plot_trajectories(
    path: str | os.PathLike,
    centres: torch.Tensor,
    decoded: Mapping[str, torch.Tensor],
    num_frames: int = 60,
) -> None:
    """True (solid) against decoded (dashed) x and y of every ball over the first held-out
    frames, one row per prior.

    :param path-like path: the PNG to write.
    :param torch.Tensor centres: true held-out centres in pixels. Shape: (T, K, 2).
    :param dict decoded: prior name -> decoded centres. Shape: (T, K, 2) each.
    :param int num_frames: how many held-out frames to show.
    """
    truth = _numpy(centres)[:num_frames]  # (T', K, 2)
    num_balls = truth.shape[1]
    time = np.arange(len(truth))
    rows = max(len(decoded), 1)
    fig = Figure(figsize=(9.0, 1.9 * rows + 0.4), layout="constrained")
    axes = np.asarray(fig.subplots(rows, 2, sharex=True, sharey=True, squeeze=False))
    for row, (name, values) in enumerate(decoded.items()):
        guess = _numpy(values)[:num_frames]  # (T', K, 2)
        for column, coordinate in enumerate("xy"):
            ax = axes[row, column]
            for ball in range(num_balls):
                colour = _BALL_COLOURS[ball % len(_BALL_COLOURS)]
                ax.plot(time, truth[:, ball, column], color=colour, lw=1.2)
                ax.plot(time, guess[:, ball, column], color=colour, lw=1.2, ls="--")
            ax.set_ylabel(f"{name}\n{coordinate} (pixels)", fontsize=8)
            if row == 0:
                ax.set_title(f"{coordinate} of each ball: true (solid), decoded (dashed)",
                             fontsize=9)
    for ax in axes[-1]:
        ax.set_xlabel("held-out frame")
    fig.savefig(path, dpi=90)


def _strip(images: np.ndarray, gap: int) -> np.ndarray:
    """Frames side by side with ``gap`` columns of NaN (drawn blank) between them.
    (F, H, W[, 3]) -> (H, F W + (F - 1) gap[, 3])."""
    num, height = images.shape[:2]
    blank = np.full((height, gap, *images.shape[3:]), np.nan)
    parts = []
    for index in range(num):
        parts.extend([images[index], blank] if index < num - 1 else [images[index]])
    return np.concatenate(parts, axis=1)


def plot_feature_maps(
    path: str | os.PathLike,
    frames: torch.Tensor,
    maps: Mapping[str, torch.Tensor],
    centres_of_mass: Mapping[str, torch.Tensor],
    frame_labels: Sequence[str] | None = None,
) -> None:
    """A few frames (top row) and, for each prior, each learned feature map over the same
    frames with its centre of mass (cross), one row per map.

    :param path-like path: the PNG to write.
    :param torch.Tensor frames: frames in ``[0, 1]``, one channel per ball (shown as RGB when
        there are 3 channels, as grey otherwise). Shape: (F, C, H, W).
    :param dict maps: prior name -> feature maps in ``(0, 1)``. Shape: (F, K, H, W) each.
    :param dict centres_of_mass: prior name -> centres of mass ``(x_1, y_1, ...)`` in pixels.
        Shape: (F, 2K) each.
    :param frame_labels: a label per frame, written under the top row.
    """
    images = _numpy(frames)  # (F, C, H, W)
    num_frames, channels, height, width = images.shape
    gap = max(1, width // 8)
    shown = images.transpose(0, 2, 3, 1) if channels == 3 else images.max(1)  # (F, H, W[, 3])
    num_maps = max((value.shape[1] for value in maps.values()), default=0)
    rows = 1 + num_maps * len(maps)
    # one axes per row (the frames side by side): much faster to draw than one per image
    fig_width = 1.2 * num_frames + 1.0
    fig = Figure(figsize=(fig_width, 1.25 * rows + 0.2))
    fig.subplots_adjust(left=0.9 / fig_width, right=0.98, bottom=0.02, top=0.98, hspace=0.25)
    axes = np.atleast_1d(fig.subplots(rows, 1))
    axes[0].imshow(np.clip(_strip(shown, gap), 0.0, 1.0), cmap="gray", vmin=0, vmax=1)
    axes[0].set_ylabel("frames", fontsize=8)
    offsets = np.arange(num_frames) * (width + gap)  # x offset of each frame in a strip
    if frame_labels is not None:
        axes[0].set_xticks(offsets + width / 2 - 0.5, frame_labels, fontsize=7)
    row = 1
    for name, values in maps.items():
        feature = _numpy(values)  # (F, K, H, W)
        com = _numpy(centres_of_mass[name]).reshape(num_frames, -1, 2)  # (F, K, 2)
        for k in range(feature.shape[1]):
            ax = axes[row]
            ax.imshow(_strip(feature[:, k], gap), cmap="magma", vmin=0, vmax=1)
            # pixel [i, j] has centre (j + 1/2, i + 1/2); imshow puts it at (j, i)
            ax.plot(offsets + com[:, k, 0] - 0.5, com[:, k, 1] - 0.5, "+", color="cyan",
                    ms=8, mew=1.5, ls="none")
            ax.set_ylabel(f"{name}\nmap {k + 1}", fontsize=8)
            row += 1
    for index, ax in enumerate(axes):
        if index or frame_labels is None:
            ax.set_xticks([])
        ax.set_yticks([])
        ax.tick_params(length=0)
    fig.savefig(path, dpi=80)
