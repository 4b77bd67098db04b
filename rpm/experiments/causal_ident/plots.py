"""Figures of ``rpm causal-ident``: the table as a heat map beside the published one, and the
training curves."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from rpm.experiments.causal_ident.rows import FACTORS
from rpm.experiments.figures import DPI, plot_training

__all__ = ["plot_table", "plot_training_curves"]

_LABELS = ("class\n(acc.)", "position\nobject", "position\nspotlight", "hue\nobject",
           "hue\nspotlight", "hue\nbackground", "rotation")


def plot_table(path: str | os.PathLike, rows: Sequence[Mapping]) -> Figure:
    """The table as two heat maps, measured (left) and published (right): one line per row
    (its views), one column per factor of ``FACTORS``, the value in each cell, colours on
    [0, 1].

    :param path-like path: the PNG to write.
    :param rows: the ``rows`` of ``results.json`` (``views``, ``scores``, ``published``).
    :return: the figure.
    """
    fig = Figure(figsize=(11.5, 0.45 * len(rows) + 1.9), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    for ax, key, title in ((axes[0], "scores", "this renderer (RPM, implicit prior)"),
                           (axes[1], "published", "published (SimCLR, Causal3DIdent)")):
        values = np.array([[row[key][f] for f in FACTORS] for row in rows], dtype=np.float64)
        image = ax.imshow(values.clip(0.0, 1.0), cmap="viridis", vmin=0.0, vmax=1.0,
                          aspect="auto")
        for (i, j), value in np.ndenumerate(values):
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=8,
                    color="black" if value > 0.6 else "white")
        ax.set_xticks(range(len(FACTORS)), _LABELS, fontsize=7)
        ax.set_title(title, fontsize=9)
    axes[0].set_yticks(range(len(rows)), [row["views"] for row in rows], fontsize=8)
    fig.colorbar(image, ax=list(axes), label="accuracy (class) or $R^2$", shrink=0.9)
    fig.suptitle("What each view keeps: held-out read-outs of the factors", fontsize=10)
    fig.savefig(path, dpi=DPI)
    return fig


def plot_training_curves(path: str | os.PathLike, rows: Sequence[Mapping]) -> Figure:
    """The loss and the validation mean linear :math:`R^2` of the six continuous factors of
    every row against the step (:func:`~rpm.experiments.figures.plot_training`).

    :param path-like path: the PNG to write.
    :param rows: the ``rows`` of ``results.json`` (``losses``, ``trajectory``).
    :return: the figure.
    """
    histories = {
        row["views"]: {"losses": row.get("losses") or [],
                       "evaluations": [{"step": s, "r2": v} for s, v in zip(
                           row["trajectory"]["step"], row["trajectory"]["mean_r2_linear"],
                           strict=True)]}
        for row in rows
    }
    return plot_training(path, histories,
                         score_label="validation mean $R^2$ (linear)",
                         title="What augmentations keep: training curves")
