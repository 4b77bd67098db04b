"""The staircase figure of ``python -m rpm mutual-information`` (Poole et al. Fig. 2): for one
critic, every estimator's estimate against the step (faint: each step's; solid: an exponential
moving average over 200 steps), the true MI as a staircase, and the ceilings log N (InfoNCE) and
1 + log((N - 1) / alpha) (I_alpha) dashed; one row per variant (Gaussian, cubic)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from rpm.experiments.figures import DPI, colours_for

__all__ = ["plot_staircase"]


def _moving_average(values: np.ndarray, span: int = 200) -> np.ndarray:
    beta = 1.0 - 1.0 / span
    out, state = np.empty_like(values), values[0]
    for i, v in enumerate(values):
        state = beta * state + (1 - beta) * v
        out[i] = state
    return out


def plot_staircase(path: str | os.PathLike, critic: str, traces: Mapping[str, Mapping[str, np.ndarray]],
                   mis: Sequence[float], ceilings: Mapping[str, float]) -> Figure:
    """Writes the figure of one critic.

    :param path-like path: the PNG to write.
    :param str critic: the critic's name (the title).
    :param traces: variant -> estimator -> estimates, shape (stages, steps).
    :param mis: the true MI of each stage.
    :param ceilings: estimator -> its ceiling, drawn dashed.
    """
    variants = list(traces)
    names = list(next(iter(traces.values())))
    colours = colours_for(names)
    fig = Figure(figsize=(2.2 * len(names), 2.2 * len(variants) + 0.4), layout="constrained")
    axes = np.asarray(fig.subplots(len(variants), len(names), sharex=True, sharey=True,
                                   squeeze=False))
    for row, variant in enumerate(variants):
        for col, name in enumerate(names):
            ax = axes[row, col]
            values = np.asarray(traces[variant][name]).reshape(-1)
            steps = np.arange(len(values))
            per_stage = len(values) // len(mis)
            ax.plot(steps, values, color=colours[name], alpha=0.25, lw=0.5)
            ax.plot(steps, _moving_average(values), color=colours[name], lw=1.2)
            ax.plot(steps, np.repeat(np.asarray(mis, dtype=float), per_stage), color="black",
                    lw=1.0)
            if name in ceilings:
                ax.axhline(ceilings[name], color="gray", ls="--", lw=0.8)
            ax.set_ylim(-1, max(mis) + 4)
            if row == 0:
                ax.set_title(name, fontsize=9)
            if col == 0:
                ax.set_ylabel(f"{variant}: MI (nats)", fontsize=8)
            if row == len(variants) - 1:
                ax.set_xlabel("step", fontsize=8)
            ax.tick_params(labelsize=7)
    fig.suptitle(f"{critic} critic: estimates against the true MI (black)", fontsize=10)
    fig.savefig(path, dpi=DPI)
    return fig
