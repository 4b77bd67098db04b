"""Figures of the ``rpm peer-supervision`` experiment: the held-out confusion matrices."""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
from matplotlib.figure import Figure

from rpm.experiments.figures import DPI, centred_suptitle

__all__ = ["matched_confusion", "plot_confusion"]

#: Panels side by side before they wrap into another row.
_COLUMNS = 3


def matched_confusion(counts, label_of_cluster) -> tuple[np.ndarray, list[int]]:
    """The confusion matrix with its clusters in the order of their matched digits (the
    matched clusters on the diagonal), the unmatched clusters last.

    :param counts: ``counts[c][k]``, the images of digit c in cluster k. Shape: (C, K).
    :param label_of_cluster: each cluster's matched digit, -1 for none. Shape: (K,).
    :returns: the reordered counts (C, K) and the cluster of each column.
    """
    counts = np.asarray(counts)
    labels = np.asarray(label_of_cluster)
    matched = [int(k) for k in np.argsort(np.where(labels < 0, labels.size + counts.shape[0],
                                                   labels), kind="stable")]
    return counts[:, matched], matched


def plot_confusion(path: str | os.PathLike, panels: Mapping[str, Mapping],
                   title: str | None = None) -> Figure:
    """One confusion matrix per setting or baseline: rows the true digit, columns the
    clusters in the order of the digit each is matched to (so the matched images lie on the
    diagonal), each cell the count of held-out images, the shade the fraction of the row.

    :param path-like path: the PNG to write.
    :param dict panels: panel title -> ``{"confusion": counts (C, K), "label_of_cluster": (K,),
        "accuracy": float}``.
    :param title: the figure's title, or None.
    :returns: the figure.
    """
    names = list(panels)
    if not names:
        raise ValueError("plot_confusion needs at least one panel")
    columns = min(len(names), _COLUMNS)
    rows = -(-len(names) // columns)
    fig = Figure(figsize=(3.6 * columns + 0.8, 3.7 * rows + 0.4), layout="constrained")
    axes = np.asarray(fig.subplots(rows, columns, squeeze=False))
    image = None
    for k in range(len(names), rows * columns):
        axes[k // columns, k % columns].set_visible(False)
    for k, name in enumerate(names):
        ax = axes[k // columns, k % columns]
        panel = panels[name]
        counts, clusters = matched_confusion(panel["confusion"], panel["label_of_cluster"])
        shares = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
        image = ax.imshow(shares, cmap="Blues", vmin=0.0, vmax=1.0)
        for c in range(counts.shape[0]):
            for j in range(counts.shape[1]):
                if counts[c, j]:
                    ax.text(j, c, str(counts[c, j]), ha="center", va="center", fontsize=6,
                            color="white" if shares[c, j] > 0.6 else "black")
        labels = np.asarray(panel["label_of_cluster"])
        ax.set_xticks(range(counts.shape[1]),
                      [str(labels[cluster]) if labels[cluster] >= 0 else "-"
                       for cluster in clusters], fontsize=7)
        ax.set_yticks(range(counts.shape[0]), [str(c) for c in range(counts.shape[0])],
                      fontsize=7)
        ax.set_xlabel("cluster (by its matched digit)", fontsize=8)
        ax.set_ylabel("true digit", fontsize=8)
        ax.set_title(f"{name}: accuracy {100 * panel['accuracy']:.1f}%", fontsize=9)
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8,
                     label="fraction of the digit's held-out images")
    if title:
        centred_suptitle(fig, title, [ax for ax in axes.ravel() if ax.get_visible()])
    fig.savefig(path, dpi=DPI)
    return fig
