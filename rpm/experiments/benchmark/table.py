"""The summary of ``rpm benchmark``'s rows: mean and standard deviation over seeds of each
(objective, dataset) cell, as ``table.md`` (markdown) and ``table.png`` (a figure)."""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence

__all__ = ["METRICS", "markdown_table", "plot_table", "summarise"]

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


def plot_table(path: str | os.PathLike, summary: dict, datasets: Sequence[str], title: str):
    """The summary as a figure: one panel per metric, objectives down, datasets across, each
    cell coloured by its mean and labelled mean ± s.d.; returns the figure."""
    import numpy as np
    from matplotlib.figure import Figure

    from rpm.experiments.figures import DPI

    objectives = list(summary)
    fig = Figure(figsize=(2.2 + 1.6 * len(datasets) * len(METRICS), 1.0 + 0.42 * len(objectives)),
                 layout="constrained")
    axes = fig.subplots(1, len(METRICS), squeeze=False)[0]
    for ax, (metric, name) in zip(axes, METRICS.items(), strict=True):
        means = np.full((len(objectives), len(datasets)), np.nan)
        for i, objective in enumerate(objectives):
            for j, dataset in enumerate(datasets):
                if dataset in summary[objective]:
                    score = summary[objective][dataset][metric]
                    means[i, j] = score["mean"]
                    ax.text(j, i, _cell(score), ha="center", va="center", fontsize=8,
                            color="white" if score["mean"] > 70 else "black")  # legible on dark
        ax.imshow(means, cmap="YlGn", vmin=0, vmax=100, aspect="auto")
        ax.set_xticks(range(len(datasets)), datasets)
        ax.set_yticks(range(len(objectives)), objectives)
        ax.set_title(f"{name} (%)", fontsize=10)
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=DPI)
    return fig
