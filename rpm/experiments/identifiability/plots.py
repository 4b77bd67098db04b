"""Figures of the ``rpm identifiability`` experiment: the held-out R^2 and MCC during training,
the training curves (loss and held-out R^2 against the step), and the comparison of energies
(per-dimension R^2, learned against true concentrations).

Figures are drawn on :class:`matplotlib.figure.Figure` objects directly (no ``pyplot`` state, no
interactive backend), so they can be written from any process or thread.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

from rpm.experiments.figures import DPI, colours_for, plot_training

__all__ = ["plot_comparison", "plot_scores", "plot_training_curves"]


def plot_scores(path: str | os.PathLike, runs: Mapping[str, Mapping]) -> Figure:
    """Held-out (validation) R^2 (solid) and MCC (dotted) against the training step, with a
    marker at every evaluation, one colour per run, and the identity baseline (the observations
    x themselves) in grey: its R^2 dashed, its MCC dotted. (``scores.png``; the bouncing-balls
    ``trajectories.png`` shows positions.)

    :param path-like path: the PNG to write.
    :param dict runs: label -> a result of :func:`rpm.experiments.identifiability.train.train_energy`
        (keys ``"trajectory"`` with lists ``"step"``, ``"r2"``, ``"mcc"``, and ``"baseline"``
        with ``{"identity": {"r2": ...}}``).
    :return: the figure.
    """
    colours = colours_for(list(runs))
    fig = Figure(figsize=(7.4, 3.4), layout="constrained")
    ax = fig.subplots()
    identity = identity_mcc = None
    low = 1.0
    for label, run in runs.items():
        trajectory = run["trajectory"]
        identity = run["baseline"]["identity"]["r2"]
        identity_mcc = run["baseline"]["identity"].get("mcc")
        ax.plot(trajectory["step"], trajectory["r2"], "o-", ms=3.5, color=colours[label],
                label=f"{label}: $R^2$")
        ax.plot(trajectory["step"], trajectory["mcc"], "s:", ms=3, color=colours[label],
                label=f"{label}: MCC")
        low = min(low, *trajectory["r2"], *trajectory["mcc"])
    if identity is not None:
        ax.axhline(identity, color="grey", linestyle="--", linewidth=1,
                   label="identity map: $R^2$")
        low = min(low, identity)
    if identity_mcc is not None:
        ax.axhline(identity_mcc, color="grey", linestyle=":", linewidth=1.2,
                   label="identity map: MCC")
        low = min(low, identity_mcc)
    ax.set_ylim(max(low - 0.05 * (1.0 - low), -1.0), 1.0 + 0.02 * (1.0 - low))
    ax.grid(alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    ax.set_xlabel("training step")
    ax.set_ylabel("held-out score")
    ax.legend(fontsize=7, frameon=False, loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax.set_title("Identifiability: validation affine $R^2$ and MCC of the encoder", fontsize=9)
    fig.savefig(path, dpi=DPI)
    return fig


def plot_training_curves(path: str | os.PathLike, runs: Mapping[str, Mapping]) -> Figure:
    """The loss and the held-out R^2 of every run against the step
    (:func:`~rpm.experiments.figures.plot_training`).

    :param path-like path: the PNG to write.
    :param dict runs: label -> a result of :func:`rpm.experiments.identifiability.train.train_energy`
        (keys ``"losses"``: ``[[step, loss], ...]``, and ``"trajectory"`` with lists ``"step"``
        and ``"r2"``).
    :return: the figure.
    """
    histories = {
        label: {"losses": run.get("losses") or [],
                "evaluations": [{"step": step, "r2": value} for step, value in
                                zip(run["trajectory"]["step"], run["trajectory"]["r2"],
                                    strict=True)]}
        for label, run in runs.items()
    }
    identity = {label: run["baseline"]["identity"]["r2"] for label, run in runs.items()
                if run.get("baseline", {}).get("identity") is not None}
    return plot_training(path, histories, loss_label="negative ELBO / N",
                         title="Identifiability: training curves", baselines=identity,
                         baseline_label="identity map")


def _log_ticks(low: float, high: float) -> list[float]:
    """Round values 1, 2, 5, 10, 20, 50 ... covering [low, high], for a readable log axis."""
    ticks = []
    for exponent in range(int(np.floor(np.log10(low))) - 1, int(np.ceil(np.log10(high))) + 1):
        ticks.extend(m * 10.0**exponent for m in (1, 2, 5))
    inside = [t for t in ticks if low / 1.3 <= t <= high * 1.3]
    return inside if len(inside) >= 2 else ticks


def plot_comparison(path: str | os.PathLike, runs: Mapping[str, Mapping],
                    true_concentrations: list | None = None) -> Figure:
    """Per-dimension held-out R^2 of every energy (left, the axis zoomed on the values so the
    differences show) and, for the runs that learn a concentration Lambda (anisotropic energy),
    the learned Lambda of the recovered dimension matched to each true dimension next to the
    true Lambda and the Lambda fitted on the true latents (right, log scale with round ticks).

    :param path-like path: the PNG to write.
    :param dict runs: energy name -> result with ``"r2_per_dimension"`` (list of n floats) and,
        optionally, ``"concentration_matched"`` and ``"concentration_oracle"`` (n floats each).
    :param true_concentrations: the true Lambda of the anisotropic conditional (n floats), or
        None.
    :return: the figure.
    """
    names = list(runs)
    colours = colours_for(names)
    dim = len(runs[names[0]]["r2_per_dimension"])
    dims = np.arange(dim)
    learned = {name: run["concentration_matched"] for name, run in runs.items()
               if run.get("concentration_matched") is not None}
    fig = Figure(figsize=(9.0, 3.3), layout="constrained")
    left, right = fig.subplots(1, 2)
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        left.bar(dims + (i - (len(names) - 1) / 2) * width, runs[name]["r2_per_dimension"],
                 width, color=colours[name], label=name)
    low = min(min(run["r2_per_dimension"]) for run in runs.values())
    margin = max(0.1 * (1.0 - low), 0.005)
    bottom = max(low - margin, -1.0)
    left.set_ylim(bottom, 1.0 + 0.25 * (1.0 - bottom))  # room for the legend above the bars
    left.axhline(1.0, color="grey", linewidth=0.8)
    left.set_xticks(dims, [str(d + 1) for d in dims])
    left.set_xlabel("true latent dimension")
    left.set_ylabel(r"held-out $R^2_d$")
    left.legend(fontsize=7, frameon=False, loc="upper left", ncols=len(names))
    left.grid(axis="y", alpha=0.3)
    values = []
    if true_concentrations is not None:
        right.plot(dims, true_concentrations, "ks", label=r"true $\Lambda$ (of the noise)")
        values += list(true_concentrations)
    oracle_drawn = False
    for name in names:
        oracle = runs[name].get("concentration_oracle")
        if oracle is not None and not oracle_drawn:
            right.plot(dims, oracle, "D", color="grey", markerfacecolor="none",
                       label=r"$\Lambda$ fitted on the true latents")
            values += list(oracle)
            oracle_drawn = True
        if name in learned:
            right.plot(dims, learned[name], "o", color=colours[name],
                       label=rf"learned $\Lambda$ ({name}), matched dimension")
            values += list(learned[name])
    positive = [v for v in values if v > 0]
    if positive:
        right.set_yscale("log")
        right.yaxis.set_major_locator(FixedLocator(_log_ticks(min(positive), max(positive))))
        right.yaxis.set_major_formatter(ScalarFormatter())
        right.yaxis.set_minor_locator(NullLocator())
        right.set_ylim(min(positive) / 1.4, max(positive) * 1.4)
        right.legend(fontsize=7, frameon=False)
    else:
        right.text(0.5, 0.5, "no learned concentrations", ha="center", va="center",
                   transform=right.transAxes)
    right.set_xticks(dims, [str(d + 1) for d in dims])
    right.set_xlabel("true latent dimension")
    right.set_ylabel(r"concentration $\Lambda_d$")
    for axes in (left, right):
        axes.spines[["top", "right"]].set_visible(False)
    fig.suptitle("Energies compared on the same data: per-dimension recovery and learned "
                 "concentrations", fontsize=9)
    fig.savefig(path, dpi=DPI)
    return fig
