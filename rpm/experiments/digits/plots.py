"""Figures of the ``rpm digits`` experiment: accuracy against labels per class."""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
from matplotlib.figure import Figure

from rpm.experiments.figures import DPI, colours_for

__all__ = ["plot_label_efficiency"]

#: Drawn dashed: the references that are not trained.
_BASELINES = ("raw_pixels", "untrained")


def plot_label_efficiency(path: str | os.PathLike, methods: Mapping[str, Mapping],
                          title: str | None = None) -> Figure:
    """Linear-probe (left) and kNN (right) test accuracy against the labelled images per
    class, one line per method (mean over the label draws, the band one standard deviation),
    the baselines dashed.

    :param path-like path: the PNG to write.
    :param dict methods: name -> result with ``linear_probe``, ``knn`` and their ``_std``
        entries keyed by labels per class (``"1"``, ..., ``"all"``).
    :param title: the figure's title, or None.
    :returns: the figure.
    """
    names = list(methods)
    if not names:
        raise ValueError("plot_label_efficiency needs at least one method")
    keys = list(methods[names[0]]["linear_probe"])
    positions = np.arange(len(keys))
    colours = colours_for(names)
    fig = Figure(figsize=(9.0, 3.8), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    for ax, classifier, label in ((axes[0], "linear_probe", "linear probe"), (axes[1], "knn", "kNN")):
        for name in names:
            mean = np.array([methods[name][classifier][k] for k in keys]) * 100
            std = np.array([methods[name][f"{classifier}_std"][k] for k in keys]) * 100
            style = "--" if name in _BASELINES else "-"
            ax.plot(positions, mean, style, marker="o", ms=3, color=colours[name], label=name)
            ax.fill_between(positions, mean - std, mean + std, color=colours[name], alpha=0.15, lw=0)
        ax.set_xticks(positions, keys)
        ax.set_xlabel("labelled images per class")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy (%)")
    axes[1].legend(fontsize=7, loc="lower right")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=DPI)
    return fig
