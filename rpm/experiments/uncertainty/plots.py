"""The figures of ``rpm uncertainty``: the learned against the true concentration (and the
means' cosines) of the controlled process, the digits' concentration against the crop and the
blur, and the linear probe's reliability diagram."""

from __future__ import annotations

import os

import numpy as np
from matplotlib.figure import Figure

from rpm.evaluation import ReliabilityBins
from rpm.experiments.figures import DPI

__all__ = ["plot_corruptions", "plot_kappa", "plot_reliability"]


def plot_kappa(path: str | os.PathLike, true_kappa: np.ndarray, learned_kappa: np.ndarray,
               true_cosines: np.ndarray, learned_cosines: np.ndarray, rank_correlation: float,
               means_rank_correlation: float) -> Figure:
    """Left: the learned against the true posterior concentration of fresh inputs, with the
    diagonal (a calibrated level lies on it); right: the learned against the true pairwise
    cosines of their means (a subsample of the pairs)."""
    figure = Figure(figsize=(10, 4.4))
    left, right = figure.subplots(1, 2)
    left.scatter(true_kappa, learned_kappa, s=3, alpha=0.3, color="tab:purple", linewidths=0)
    span = [float(min(true_kappa.min(), learned_kappa.min())),
            float(max(true_kappa.max(), learned_kappa.max()))]
    left.plot(span, span, color="grey", linestyle="--", linewidth=1, label="equal")
    left.legend(loc="upper left")
    left.set_xlabel(r"true posterior $\kappa(x)$")
    left.set_ylabel(r"learned $\hat\kappa(x)$")
    left.set_title(f"concentration: Spearman {rank_correlation:.3f}")
    right.scatter(true_cosines, learned_cosines, s=2, alpha=0.2, color="tab:blue", linewidths=0)
    right.plot([-1, 1], [-1, 1], color="grey", linestyle="--", linewidth=1, label="equal")
    right.set_xlim(-1, 1)
    right.set_ylim(-1, 1)
    right.set_xlabel(r"true $\mu_i^\top \mu_j$")
    right.set_ylabel(r"learned $\hat\mu_i^\top \hat\mu_j$")
    right.set_title(f"means: Spearman {means_rank_correlation:.3f}")
    right.legend(loc="upper left")
    figure.suptitle("controlled process: the learned posterior against the true one")
    figure.tight_layout()
    figure.savefig(path, dpi=DPI)
    return figure


def _quantile_band(axis, x: np.ndarray, values: np.ndarray, colour: str, label: str) -> None:
    """Median and the 10-90% band of ``values`` (N, L) at each of the L abscissae ``x``."""
    low, median, high = np.quantile(values, [0.1, 0.5, 0.9], axis=0)
    axis.fill_between(x, low, high, color=colour, alpha=0.2, linewidth=0)
    axis.plot(x, median, marker="o", color=colour, label=label)


def plot_corruptions(path: str | os.PathLike, sides: np.ndarray, crop_kappa: np.ndarray,
                     sigmas: np.ndarray, blur_kappa: np.ndarray, crop_order: float,
                     blur_correlation: float) -> Figure:
    """The digits encoder's concentration of the test images: left, against the side of a
    nested crop window (``crop_kappa`` (N, L) at ``sides`` (L,)); right, against the blur's
    standard deviation (``blur_kappa`` (N, K) at ``sigmas`` (K,)); median and 10-90% band."""
    figure = Figure(figsize=(10, 4.2))
    left, right = figure.subplots(1, 2)
    _quantile_band(left, sides, crop_kappa, "tab:red", "median, 10-90%")
    left.invert_xaxis()
    left.set_yscale("log")
    left.set_xlabel("crop window side (fraction of the image; smaller: more hidden)")
    left.set_ylabel(r"learned $\hat\kappa$")
    left.set_title(f"crop: smaller window, lower kappa in {100 * crop_order:.1f}% of pairs")
    left.legend()
    _quantile_band(right, sigmas, blur_kappa, "tab:green", "median, 10-90%")
    right.set_yscale("log")
    right.set_xlabel(r"blur $\sigma$ (pixels)")
    right.set_ylabel(r"learned $\hat\kappa$")
    right.set_title(f"blur: Spearman(sigma, 1/kappa) {blur_correlation:.3f}")
    right.legend()
    figure.suptitle("digits: the posterior concentration falls as the input loses information")
    figure.tight_layout()
    figure.savefig(path, dpi=DPI)
    return figure


def plot_reliability(path: str | os.PathLike, bins: dict[str, ReliabilityBins],
                     errors: dict[str, float]) -> Figure:
    """The reliability diagram: accuracy against confidence per bin for each predictive
    (name -> bins), the diagonal of perfect calibration, and the share of inputs per bin."""
    figure = Figure(figsize=(6, 6.4))
    top, bottom = figure.subplots(2, 1, height_ratios=[3, 1], sharex=True)
    top.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="calibrated")
    colours = ("tab:orange", "tab:blue")
    width = None
    for index, (name, binned) in enumerate(bins.items()):
        centres = (binned.edges[:-1] + binned.edges[1:]) / 2
        width = binned.edges[1] - binned.edges[0]
        filled = binned.counts > 0
        top.plot(binned.confidence[filled], binned.accuracy[filled], marker="o",
                 color=colours[index % 2], label=f"{name} (ECE {errors[name]:.3f})")
        offset = (index - 0.5) * width / 2
        bottom.bar(centres + offset, binned.counts / binned.counts.sum(), width=width / 2,
                   color=colours[index % 2], alpha=0.7)
    top.set_xlim(0, 1)
    top.set_ylim(0, 1)
    top.set_ylabel("accuracy")
    top.set_title("linear probe on corrupted test digits")
    top.legend(loc="upper left")
    bottom.set_xlabel("confidence (largest class probability)")
    bottom.set_ylabel("share of inputs")
    figure.tight_layout()
    figure.savefig(path, dpi=DPI)
    return figure
