"""Figures of ``rpm content-style``: the table as a heat map, and the training curves."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from rpm.experiments.figures import DPI, plot_training

__all__ = ["COLUMNS", "plot_table", "plot_training_curves"]

#: The heat map's columns: (results key, label).
COLUMNS = (("content_r2_nonlinear", "content\nnonlinear"), ("content_r2_linear", "content\nlinear"),
           ("style_r2_nonlinear", "style\nnonlinear"), ("style_r2_linear", "style\nlinear"))


def _row_label(row: Mapping) -> str:
    return (f"p(chg) {row['p_change']:g}, stat. {'yes' if row['statistical'] else 'no'}, "
            f"caus. {'yes' if row['causal'] else 'no'}")


def plot_table(path: str | os.PathLike, rows: Sequence[Mapping],
               title: str = "Held-out block $R^2$ of the true blocks from the learned content"
               ) -> Figure:
    """The table as a heat map: one line per row, the four block :math:`R^2` as columns, the
    value written in each cell, colours on [0, 1].

    :param path-like path: the PNG to write.
    :param rows: the ``rows`` of ``results.json``.
    :param str title: the figure's title.
    :return: the figure.
    """
    values = np.array([[row[key] for key, _ in COLUMNS] for row in rows], dtype=np.float64)
    fig = Figure(figsize=(6.4, 0.55 * len(rows) + 1.6), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(values, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    for (i, j), value in np.ndenumerate(values):
        ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=9,
                color="black" if value > 0.6 else "white")
    ax.set_xticks(range(len(COLUMNS)), [label for _, label in COLUMNS], fontsize=8)
    ax.set_yticks(range(len(rows)), [_row_label(row) for row in rows], fontsize=8)
    fig.colorbar(image, ax=ax, label="$R^2$")
    ax.set_title(title, fontsize=9)
    fig.savefig(path, dpi=DPI)
    return fig


def plot_training_curves(path: str | os.PathLike, rows: Sequence[Mapping]) -> Figure:
    """The loss and the validation linear content :math:`R^2` of every row against the step
    (:func:`~rpm.experiments.figures.plot_training`).

    :param path-like path: the PNG to write.
    :param rows: the ``rows`` of ``results.json`` (``"losses"``, ``"trajectory"``).
    :return: the figure.
    """
    histories = {
        row["row"]: {"losses": row.get("losses") or [],
                     "evaluations": [{"step": s, "r2": v} for s, v in zip(
                         row["trajectory"]["step"], row["trajectory"]["content_r2_linear"],
                         strict=True)]}
        for row in rows
    }
    return plot_training(path, histories, score_label="validation content $R^2$ (linear)",
                         title="Content and style: training curves")
