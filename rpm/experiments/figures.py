"""Figure helpers shared by the experiments: one colour per run name across every figure, and the
training-curve figure (loss and held-out score against the step) that every experiment writes.

Figures are drawn on :class:`matplotlib.figure.Figure` objects directly (no ``pyplot`` state, no
interactive backend), so they can be written from any process or thread.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

__all__ = ["DPI", "centred_suptitle", "colours_for", "plot_training"]

#: Resolution of every experiment figure (dots per inch).
DPI = 150

# Fixed colours for the names the experiments use, so that a prior or an energy has the same
# colour in every figure and every run; other names take the unused colours in order.
_NAMED = {
    "rbf": "tab:blue",
    "bilinear": "tab:orange",
    "dynamics": "tab:green",
    "cosine": "tab:purple",
    "anisotropic": "tab:red",
}
_SPARE = ("tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray")
# From this many logged losses on, the loss is drawn faint with a running mean over it.
_SMOOTH_FROM = 60

#: The most runs side by side in :func:`plot_training`; more wrap into further bands.
RUNS_PER_BAND = 5


def colours_for(names: Sequence[str]) -> dict[str, str]:
    """A colour per name: the fixed colour of a known name (``"rbf"``, ``"cosine"`` ...), the
    unused spare colours in order for the others (cycling when there are more names than
    colours).

    :param names: run names (priors, energies), in the order they are drawn.
    :return: name -> matplotlib colour.
    """
    used = {_NAMED[name] for name in names if name in _NAMED}
    spare = [colour for colour in (*_SPARE, *_NAMED.values()) if colour not in used]
    colours, position = {}, 0
    for name in names:
        if name in _NAMED:
            colours[name] = _NAMED[name]
        else:
            colours[name] = spare[position % len(spare)]
            position += 1
    return colours


def _smooth(values: np.ndarray, width: int) -> np.ndarray:
    """Running mean over a centred window of ``width`` points (shrunk at the ends)."""
    width = min(width, len(values))  # np.convolve's "same" returns the longer of the two
    if width <= 1:
        return values
    kernel = np.ones(width)
    total = np.convolve(values, kernel, mode="same")
    count = np.convolve(np.ones_like(values), kernel, mode="same")
    return total / count


def plot_training(
    path: str | os.PathLike,
    histories: Mapping[str, Mapping],
    score: str = "r2",
    score_label: str = r"held-out $R^2$",
    loss_label: str = "negative ELBO / N",
    title: str | None = None,
    baselines: Mapping[str, float] | None = None,
    baseline_label: str = "baseline",
) -> Figure:
    """The training curves of every run: the loss (top panel) and the held-out score at the
    evaluation steps (the panel below it, markers at the evaluations), one column per run, with
    the run's colour of :func:`colours_for`; more than ``RUNS_PER_BAND`` (5) runs wrap into
    bands of that many columns, one band under the other. The losses of different runs are
    different objectives (each prior or energy is its own model), so each run has its own loss
    axis; the scores share one axis.

    :param path-like path: the PNG to write.
    :param dict histories: run name -> the trainer's history, ``{"losses": [[step, mean loss
        over the logging window ending at step], ...], "evaluations": [{"step": int, score:
        float, ...}, ...]}`` (:class:`~rpm.training.Trainer`).
    :param str score: the key of the held-out score in each evaluation.
    :param str score_label: its axis label.
    :param str loss_label: the loss axis label.
    :param title: the figure's title, or None.
    :param baselines: run name -> a reference score drawn dashed in its score panel (e.g. the
        untrained encoder's), or None.
    :param str baseline_label: the label written on the baseline.
    :return: the figure.
    """
    names = list(histories)
    if not names:
        raise ValueError("plot_training needs at least one run's history")
    colours = colours_for(names)
    columns = min(len(names), RUNS_PER_BAND)
    bands = -(-len(names) // columns)
    fig = Figure(figsize=(max(2.6 * columns + 0.6, 4.6), 4.2 * bands), layout="constrained")
    grid = np.asarray(fig.subplots(2 * bands, columns, squeeze=False))
    pairs = [(grid[2 * (k // columns), k % columns], grid[2 * (k // columns) + 1, k % columns])
             for k in range(len(names))]
    for k in range(len(names), bands * columns):  # the last band's empty places
        for ax in grid[2 * (k // columns):2 * (k // columns) + 2, k % columns]:
            ax.set_visible(False)
    for (top, bottom), name in zip(pairs, names, strict=True):
        bottom.sharex(top)
        top.tick_params(labelbottom=False)
        history = histories[name]
        losses = np.asarray(history.get("losses") or [], dtype=np.float64).reshape(-1, 2)
        if len(losses) >= _SMOOTH_FROM:  # many logged points: faint, with a running mean
            top.plot(losses[:, 0], losses[:, 1], color=colours[name], lw=0.6, alpha=0.45)
            top.plot(losses[:, 0], _smooth(losses[:, 1], len(losses) // 20),
                     color=colours[name], lw=1.4)
        elif len(losses):
            top.plot(losses[:, 0], losses[:, 1], ".-", color=colours[name], lw=1.2, ms=4)
        evaluations = [e for e in history.get("evaluations") or [] if e.get(score) is not None]
        if evaluations:
            bottom.plot([e["step"] for e in evaluations], [e[score] for e in evaluations], "o-",
                        color=colours[name], ms=3, lw=1.2)
        if baselines and name in baselines:
            bottom.axhline(baselines[name], color="0.4", ls="--", lw=1)
            bottom.annotate(baseline_label, (0.02, baselines[name]), xycoords=("axes fraction",
                            "data"), xytext=(0, 3), textcoords="offset points", fontsize=7,
                            color="0.3")
        top.set_title(name, fontsize=9)
        bottom.set_xlabel("step")
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
            ax.spines[["top", "right"]].set_visible(False)
            ax.tick_params(labelsize=8)
    many = any(len(h.get("losses") or []) >= _SMOOTH_FROM for h in histories.values())
    for band in range(bands):
        grid[2 * band, 0].set_ylabel(f"{loss_label}\n(faint: logged, solid: running mean)"
                                     if many else loss_label, fontsize=8)
        grid[2 * band + 1, 0].set_ylabel(score_label, fontsize=8)
    scores = [e[score] for h in histories.values() for e in h.get("evaluations") or []
              if e.get(score) is not None] + list((baselines or {}).values())
    low, high = (min(scores), max(scores)) if scores else (None, None)
    if scores:
        margin = 0.05 * max(high - low, 1e-3)
        for _, bottom in pairs:
            bottom.set_ylim(low - margin, high + 2 * margin)
    if title:
        centred_suptitle(fig, title, [ax for pair in pairs for ax in pair])
    fig.savefig(path, dpi=DPI)
    return fig


def centred_suptitle(fig: Figure, title: str, axes: Sequence, fontsize: float = 9) -> None:
    """A figure title centred over the panels ``axes`` rather than over the whole figure, which
    the axis labels on the left make look off-centre.

    :param Figure fig: a figure with a layout engine.
    :param str title: the title.
    :param axes: the panels to centre it over.
    """
    fig.draw_without_rendering()  # lays the panels out
    boxes = [ax.get_position() for ax in axes]
    centre = (min(box.x0 for box in boxes) + max(box.x1 for box in boxes)) / 2
    fig.suptitle(title, fontsize=fontsize, x=centre, ha="center")
