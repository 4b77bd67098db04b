"""The summary of ``rpm benchmark``'s rows: mean and standard deviation over seeds of each
(objective, dataset) cell, as ``table.md`` (markdown) and ``table.png`` (a figure)."""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence

__all__ = ["METRICS", "column_shades", "markdown_table", "plot_table", "summarise"]

#: The scores of a row, and their names in the table.
METRICS = {"knn": "kNN on z", "linear": "linear probe on h"}


def summarise(rows: Sequence[dict], objectives: Sequence[str], datasets: Sequence[str]) -> dict:
    """``{objective: {dataset: {metric: {"mean", "std", "seeds"}}}}`` in percent over the rows
    of each cell (``std``: the sample standard deviation over seeds, None for one seed); cells
    without rows are left out.

    :param rows: the rows (``dataset``, ``objective``, ``seed``, ``knn``, ``linear``).
    :param objectives: the table's rows, in order.
    :param datasets: its columns, in order.
    """
    summary: dict = {}
    for objective in objectives:
        for dataset in datasets:
            cell = [r for r in rows if r["objective"] == objective and r["dataset"] == dataset]
            if not cell:
                continue
            summary.setdefault(objective, {})[dataset] = {
                metric: {"mean": statistics.fmean(100 * r[metric] for r in cell),
                         "std": (statistics.stdev(100 * r[metric] for r in cell)
                                 if len(cell) > 1 else None),
                         "seeds": len(cell)}
                for metric in METRICS}
    return summary


def _cell(score: dict) -> str:
    text = f"{score['mean']:.1f}"
    return text if score["std"] is None else f"{text} ± {score['std']:.1f}"


def markdown_table(summary: dict, datasets: Sequence[str], title: str) -> str:
    """The summary as a markdown table: one row per objective, two columns per dataset (kNN on
    z, linear probe on h), mean ± s.d. over seeds in percent."""
    head = ["objective"] + [f"{dataset} {name}" for dataset in datasets for name in METRICS.values()]
    lines = [f"# {title}", "",
             "Test accuracy (%), mean ± s.d. over seeds (the number of seeds in brackets).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for objective, cells in summary.items():
        values = [f"{_cell(cells[d][m])} ({cells[d][m]['seeds']})" if d in cells else "–"
                  for d in datasets for m in METRICS]
        lines.append("| " + " | ".join([objective, *values]) + " |")
    return "\n".join(lines) + "\n"


def column_shades(means):
    """Each column of ``means`` (objectives x datasets, NaN where a cell is missing) mapped
    linearly from its lowest mean (0) to its highest (1), NaN kept; a column whose cells are all
    equal maps to 0.5. The colours of :func:`plot_table`, so that the objectives of a dataset
    whose scores all lie within a few points are told apart within its column."""
    import numpy as np

    means = np.asarray(means, dtype=float)
    low, high = np.nanmin(means, axis=0), np.nanmax(means, axis=0)
    span = high - low
    shades = (means - low) / np.where(span > 0, span, 1.0)
    return np.where(span > 0, shades, np.where(np.isnan(means), np.nan, 0.5))


def plot_table(path: str | os.PathLike, summary: dict, datasets: Sequence[str], title: str):
    """The summary as a figure: one panel per metric, objectives down, datasets across, each
    cell labelled mean ± s.d. and coloured by :func:`column_shades` of the means (within its
    column, light the lowest, dark the highest); returns the figure."""
    import numpy as np
    from matplotlib.figure import Figure

    from rpm.experiments.figures import DPI

    objectives = list(summary)
    fig = Figure(figsize=(max(6.4, 2.2 + 1.6 * len(datasets) * len(METRICS)),
                         1.2 + 0.42 * len(objectives)),
                 layout="constrained")
    axes = fig.subplots(1, len(METRICS), squeeze=False)[0]
    for ax, (metric, name) in zip(axes, METRICS.items(), strict=True):
        means = np.full((len(objectives), len(datasets)), np.nan)
        for i, objective in enumerate(objectives):
            for j, dataset in enumerate(datasets):
                if dataset in summary[objective]:
                    means[i, j] = summary[objective][dataset][metric]["mean"]
        shades = column_shades(means)
        for i, objective in enumerate(objectives):
            for j, dataset in enumerate(datasets):
                if dataset in summary[objective]:
                    ax.text(j, i, _cell(summary[objective][dataset][metric]), ha="center",
                            va="center", fontsize=8,
                            color="white" if shades[i, j] > 0.6 else "black")  # legible on dark
        ax.imshow(shades, cmap="YlGn", vmin=-0.1, vmax=1, aspect="auto")
        ax.set_xticks(range(len(datasets)), datasets)
        ax.set_yticks(range(len(objectives)), objectives)
        ax.set_title(f"{name} (%)", fontsize=10)
    fig.suptitle(f"{title}\ncolour: each column from its lowest mean (light) to its highest (dark)",
                 fontsize=10)
    fig.savefig(path, dpi=DPI)
    return fig
