"""Figures of the ``rpm identifiability`` experiment: the held-out R^2 and MCC during training,
and the comparison of energies (per-dimension R^2, learned against true concentrations).

Figures are drawn on :class:`matplotlib.figure.Figure` objects directly (no ``pyplot`` state, no
interactive backend), so they can be written from any process or thread.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
from matplotlib.figure import Figure

__all__ = ["plot_comparison", "plot_trajectories"]

_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")


def plot_trajectories(path: str | os.PathLike, runs: Mapping[str, Mapping]) -> None:
    """Held-out R^2 and MCC against the training step (left) and the wall time (right), one
    colour per run, with the identity baseline (the observations x themselves) dashed.

    :param path-like path: the PNG to write.
    :param dict runs: label -> a result of :func:`rpm.experiments.identifiability.train.train_energy`
        (keys ``"trajectory"`` with lists ``"step"``, ``"r2"``, ``"mcc"``, ``"wall_time"``, and
        ``"baseline"`` with ``{"identity": {"r2": ...}}``).
    """
    fig = Figure(figsize=(9.0, 3.2), layout="constrained")
    by_step, by_time = fig.subplots(1, 2, sharey=True)
    identity = None
    for colour, (label, run) in zip(_COLOURS, runs.items(), strict=False):
        trajectory = run["trajectory"]
        identity = run["baseline"]["identity"]["r2"]
        for axes, x in ((by_step, trajectory["step"]), (by_time, trajectory["wall_time"])):
            axes.plot(x, trajectory["r2"], color=colour, label=f"{label} $R^2$")
            axes.plot(x, trajectory["mcc"], color=colour, linestyle=":", label=f"{label} MCC")
    for axes in (by_step, by_time):
        if identity is not None:
            axes.axhline(identity, color="grey", linestyle="--", linewidth=1,
                         label="identity $R^2$")
        axes.set_ylim(min(0.0, *(axes.get_ylim()[:1])), 1.0)
        axes.grid(alpha=0.3)
        axes.spines[["top", "right"]].set_visible(False)
    by_step.set_xlabel("training step")
    by_time.set_xlabel("training time (s)")
    by_step.set_ylabel("held-out score")
    by_step.legend(fontsize=7, frameon=False, loc="lower right")
    fig.suptitle("Identifiability: held-out affine $R^2$ and MCC of the encoder", fontsize=9)
    fig.savefig(path, dpi=100)


def plot_comparison(path: str | os.PathLike, runs: Mapping[str, Mapping],
                    true_concentrations: list | None = None) -> None:
    """Per-dimension held-out R^2 of every energy (left) and, for the runs that learn a
    concentration Lambda (anisotropic energy), the learned Lambda of the recovered dimension
    matched to each true dimension next to the true Lambda and the Lambda fitted on the true
    latents (right, log scale).

    :param path-like path: the PNG to write.
    :param dict runs: energy name -> result with ``"r2_per_dimension"`` (list of n floats) and,
        optionally, ``"concentration_matched"`` and ``"concentration_oracle"`` (n floats each).
    :param true_concentrations: the true Lambda of the anisotropic conditional (n floats), or
        None.
    """
    names = list(runs)
    dim = len(runs[names[0]]["r2_per_dimension"])
    dims = np.arange(dim)
    learned = {name: run["concentration_matched"] for name, run in runs.items()
               if run.get("concentration_matched") is not None}
    fig = Figure(figsize=(9.0, 3.2), layout="constrained")
    left, right = fig.subplots(1, 2)
    width = 0.8 / len(names)
    for i, (colour, name) in enumerate(zip(_COLOURS, names, strict=False)):
        left.bar(dims + (i - (len(names) - 1) / 2) * width, runs[name]["r2_per_dimension"],
                 width, color=colour, label=name)
    left.axhline(0.95, color="grey", linestyle="--", linewidth=1, label="0.95")
    left.set_ylim(min(0.0, *(min(run["r2_per_dimension"]) for run in runs.values())), 1.2)
    left.set_yticks(np.linspace(0.0, 1.0, 6))
    left.set_xticks(dims)
    left.set_xlabel("true latent dimension")
    left.set_ylabel(r"held-out $R^2_d$")
    left.legend(fontsize=7, frameon=False, loc="upper left", ncols=3)
    if true_concentrations is not None:
        right.plot(dims, true_concentrations, "ks", label=r"true $\Lambda$ (of the noise)")
    for colour, name in zip(_COLOURS, names, strict=False):
        oracle = runs[name].get("concentration_oracle")
        if oracle is not None:
            right.plot(dims, oracle, "D", color="grey", markerfacecolor="none",
                       label=r"$\Lambda$ fitted on the true latents")
        if name in learned:
            right.plot(dims, learned[name], "o", color=colour,
                       label=rf"learned $\Lambda$ ({name})")
    if true_concentrations is not None or learned:
        right.set_yscale("log")
        right.legend(fontsize=7, frameon=False)
    else:
        right.text(0.5, 0.5, "no learned concentrations", ha="center", va="center",
                   transform=right.transAxes)
    right.set_xticks(dims)
    right.set_xlabel("true latent dimension (learned: matched dimension)")
    right.set_ylabel(r"concentration $\Lambda_d$")
    for axes in (left, right):
        axes.spines[["top", "right"]].set_visible(False)
    fig.suptitle("Energies compared on the same data: per-dimension recovery and learned "
                 "concentrations", fontsize=9)
    fig.savefig(path, dpi=100)
