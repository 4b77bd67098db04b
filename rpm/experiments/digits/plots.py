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
    class, on the backbone's representation h (top) and on the latent z (bottom), one line per
    method (mean over the label draws, the band one standard deviation), the baselines dashed
    (the raw pixels, which have no latent, in both rows).

    :param path-like path: the PNG to write.
    :param dict methods: name -> result with ``linear_probe``, ``knn`` and their ``_std``
        entries keyed by labels per class (``"1"``, ..., ``"all"``), and the same under
        ``"latent"`` where the method has a latent.
    :param title: the figure's title, or None.
    :returns: the figure.
    """
    names = list(methods)
    if not names:
        raise ValueError("plot_label_efficiency needs at least one method")
    keys = list(methods[names[0]]["linear_probe"])
    positions = np.arange(len(keys))
    colours = colours_for(names)
    fig = Figure(figsize=(9.0, 6.6), layout="constrained")
    axes = fig.subplots(2, 2, sharey=True, sharex=True)
    for row, representation in enumerate(("backbone", "latent")):
        for col, (classifier, label) in enumerate((("linear_probe", "linear probe"), ("knn", "kNN"))):
            ax = axes[row, col]
            for name in names:
                result = methods[name]
                if representation == "latent" and "latent" in result:
                    result = result["latent"]
                elif representation == "latent" and name not in _BASELINES:
                    continue
                mean = np.array([result[classifier][k] for k in keys]) * 100
                std = np.array([result[f"{classifier}_std"][k] for k in keys]) * 100
                style = "--" if name in _BASELINES else "-"
                ax.plot(positions, mean, style, marker="o", ms=3, color=colours[name], label=name)
                ax.fill_between(positions, mean - std, mean + std, color=colours[name], alpha=0.15, lw=0)
            ax.set_xticks(positions, keys)
            ax.set_title(f"{label} on {'h (backbone)' if representation == 'backbone' else 'z (latent)'}",
                         fontsize=10)
            ax.grid(alpha=0.3)
        axes[row, 0].set_ylabel("test accuracy (%)")
    for ax in axes[1]:
        ax.set_xlabel("labelled images per class")
    axes[0, 1].legend(fontsize=7, loc="lower right")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=DPI)
    return fig
