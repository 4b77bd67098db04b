"""Figures of the ``rpm bouncing-balls`` experiment: held-out R^2 per prior, true against decoded
trajectories, the learned feature maps, and the training curves
(:func:`~rpm.experiments.figures.plot_training`).

Figures are drawn on :class:`matplotlib.figure.Figure` objects directly (no ``pyplot`` state, no
interactive backend), so they can be written from any process or thread.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from rpm.experiments.figures import DPI, colours_for, plot_training

__all__ = ["plot_comparison", "plot_feature_maps", "plot_forecasts", "plot_trajectories",
           "plot_training_curves"]

_BALL_COLOURS = ("tab:red", "tab:green", "tab:blue", "tab:orange", "tab:purple", "tab:brown")


def _numpy(tensor: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(tensor, torch.Tensor):
        return tensor.detach().to("cpu", torch.float64).numpy()
    return np.asarray(tensor, dtype=np.float64)


def _runs(value: Mapping | Sequence[Mapping]) -> list[Mapping]:
    """A prior's result (one seed) or list of results (several seeds), as a list."""
    if isinstance(value, Mapping):
        return [value]
    runs = list(value)
    if not runs:
        raise ValueError("a prior needs at least one result to plot")
    return runs


def _mean_std(runs: Sequence[Mapping], key: str) -> tuple[float, float]:
    values = np.asarray([run[key] for run in runs], dtype=np.float64)
    return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0


def plot_comparison(path: str | os.PathLike,
                    results: Mapping[str, Mapping | Sequence[Mapping]]) -> Figure:
    """Held-out R^2 (left) and pixel error (right) of each prior, one colour per prior in both
    panels, with the untrained encoder's value as a black dashed bar-wide line on each bar (dashed
    so that the top of a bar just below it shows through). With several
    seeds per prior the bars are the means and the error bars one standard deviation over the
    seeds; the untrained values' standard deviation is a grey band when every prior shares them
    (the same seeds give the same initial encoder), an error bar beside each line otherwise.

    :param path-like path: the PNG to write.
    :param dict results: prior name -> ``{"r2": float, "pixel_error": float, "untrained_r2":
        float, "untrained_pixel_error": float}``, or a list of such dicts, one per seed.
    :return: the figure.

    Runs of several seeds (``python -m rpm bouncing-balls --seed S --out runs/seed-S``) combine as::

        runs = [json.loads(Path(f"runs/seed-{s}/results.json").read_text())["priors"]
                for s in (0, 1, 2)]
        plot_comparison("comparison.png", {name: [run[name] for run in runs] for name in runs[0]})
    """
    names = list(results)
    runs = {name: _runs(results[name]) for name in names}
    seeds = {len(value) for value in runs.values()}
    colours = colours_for(names)
    positions = np.arange(len(names))
    fig = Figure(figsize=(max(7.2, 1.6 * len(names) + 1.2), 3.0), layout="constrained")
    panels = fig.subplots(1, 2)
    specs = (("r2", "untrained_r2", r"held-out $R^2$ of the ball positions", "{:.3f}"),
             ("pixel_error", "untrained_pixel_error", "held-out error (pixels)", "{:.2f}"))
    for ax, (key, baseline_key, label, fmt) in zip(panels, specs, strict=True):
        stats = [_mean_std(runs[name], key) for name in names]
        baseline = [_mean_std(runs[name], baseline_key) if all(baseline_key in r for r in runs[name])
                    else None for name in names]
        means = [mean for mean, _ in stats]
        spreads = [std for _, std in stats]
        ax.bar(positions, means, width=0.6, color=[colours[name] for name in names],
               yerr=spreads if max(seeds) > 1 else None, capsize=3,
               error_kw={"elinewidth": 1, "ecolor": "0.2"})
        # the same untrained encoder for every prior (one seed, one initialisation): its spread
        # over seeds is one band across the panel rather than an error bar on every bar
        shared = all(base is not None and base == baseline[0] for base in baseline)
        if shared and max(seeds) > 1 and baseline[0][1] > 0:
            mean, std = baseline[0]
            ax.axhspan(mean - std, mean + std, color="0.55", alpha=0.25, lw=0, zorder=0)
        label_at = []
        for x, value, spread, base in zip(positions, means, spreads, baseline, strict=True):
            top = max(value, 0.0) + spread
            if base is not None:
                # dashed and thin enough for a bar's top just below it to show through
                ax.hlines(base[0], x - 0.36, x + 0.36, color="black", lw=1.5, zorder=4,
                          linestyles=(0, (4, 2)))
                if not shared and max(seeds) > 1 and base[1] > 0:
                    ax.errorbar(x + 0.3, base[0], yerr=base[1], color="black", lw=1, capsize=2)
            label_at.append((top, base))
        span = max(max(top for top, _ in label_at),
                   *(base[0] + base[1] for _, base in label_at if base is not None), 1e-9)
        # a value label sits just above its bar (and its error bar), or above the untrained
        # line (and the line's own error bar) where the line would run through it
        for x, value, (top, base) in zip(positions, means, label_at, strict=True):
            y = top + 0.02 * span
            if base is not None and y - 0.03 * span <= base[0] <= y + 0.1 * span:
                y = base[0] + (0.0 if shared else base[1]) + 0.02 * span
            ax.text(x, y, fmt.format(value), ha="center", va="bottom", fontsize=8)
        low = min(0.0, *(value - spread for value, spread in zip(means, spreads, strict=True)),
                  *(base[0] for base in baseline if base is not None))
        ax.set_ylim(low, 1.15 * span)
        ax.set_ylabel(label, fontsize=9)
        ax.set_xticks(positions, names, fontsize=9)
        ax.spines[["top", "right"]].set_visible(False)
    if all(base is not None for base in baseline):
        untrained = {(round(_mean_std(runs[name], "untrained_r2")[0], 3),
                      round(_mean_std(runs[name], "untrained_pixel_error")[0], 2))
                     for name in names}
        label = "the same encoder, untrained"
        if len(untrained) == 1:  # one initialisation for every prior: say its scores
            (r2, error), = untrained
            label += f" ($R^2$ {r2:.3f}, error {error:.2f} px)"
        panels[0].plot([], [], color="black", lw=1.5, ls=(0, (4, 2)), label=label)
        if max(seeds) > 1:
            panels[0].fill_between([], [], color="0.55", alpha=0.25, lw=0,
                                   label="its standard deviation over seeds")
        fig.legend(loc="outside lower center", fontsize=8, frameon=False, ncols=2)
    if seeds == {1}:
        note = "one seed"
    elif len(seeds) == 1:
        note = f"mean and standard deviation over {seeds.pop()} seeds"
    else:
        note = f"mean and standard deviation over {min(seeds)}-{max(seeds)} seeds"
    fig.suptitle(f"Bouncing balls: linear read-out of the 3 ball positions from the 6 encoder "
                 f"outputs\n({note})", fontsize=9)
    fig.savefig(path, dpi=DPI)
    return fig


def plot_trajectories(
    path: str | os.PathLike,
    centres: torch.Tensor,
    decoded: Mapping[str, torch.Tensor],
    num_frames: int = 60,
) -> Figure:
    """True (solid) against decoded (dashed) x and y of every ball over the first held-out
    frames, one row per prior, one colour per ball (the colour of its channel in the frames).

    :param path-like path: the PNG to write.
    :param torch.Tensor centres: true centres in pixels of all the held-out frames (the title
        says how many of them are shown). Shape: (T, K, 2).
    :param dict decoded: prior name -> decoded centres of the same frames. Shape: (T, K, 2) each.
    :param int num_frames: how many held-out frames to show (from the first).
    :return: the figure.
    """
    all_truth = _numpy(centres)  # (T, K, 2)
    truth = all_truth[:num_frames]  # (T', K, 2)
    num_balls = truth.shape[1]
    time = np.arange(len(truth))
    rows = max(len(decoded), 1)
    fig = Figure(figsize=(9.0, 1.7 * rows + 1.0), layout="constrained")
    axes = np.asarray(fig.subplots(rows, 2, sharex=True, sharey=True, squeeze=False))
    for row, (name, values) in enumerate(decoded.items()):
        guess = _numpy(values)[:num_frames]  # (T', K, 2)
        for column, coordinate in enumerate("xy"):
            ax = axes[row, column]
            for ball in range(num_balls):
                colour = _BALL_COLOURS[ball % len(_BALL_COLOURS)]
                ax.plot(time, truth[:, ball, column], color=colour, lw=1.2)
                ax.plot(time, guess[:, ball, column], color=colour, lw=1.2, ls="--")
            ax.set_ylabel(f"{name}\n{coordinate} (pixels)", fontsize=8)
            ax.tick_params(labelsize=8)
            ax.spines[["top", "right"]].set_visible(False)
            if row == 0:
                ax.set_title(f"{coordinate} of each ball", fontsize=9)
    for ax in axes[-1]:
        ax.set_xlabel("held-out frame", fontsize=9)
    handles = [Line2D([], [], color=_BALL_COLOURS[ball % len(_BALL_COLOURS)], lw=2,
                      label=f"ball {ball + 1}") for ball in range(num_balls)]
    handles += [Line2D([], [], color="0.3", lw=1.2, label="true"),
                Line2D([], [], color="0.3", lw=1.2, ls="--", label="decoded")]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8,
               frameon=False)
    fig.suptitle(f"True and linearly decoded ball positions, the first {len(truth)} of the "
                 f"{len(all_truth)} held-out frames", fontsize=9)
    fig.savefig(path, dpi=DPI)
    return fig


def plot_feature_maps(
    path: str | os.PathLike,
    frames: torch.Tensor,
    maps: Mapping[str, torch.Tensor],
    centres_of_mass: Mapping[str, torch.Tensor],
    frame_labels: Sequence[str] | None = None,
    max_frames: int = 2,
) -> Figure:
    """The learned feature maps of every prior (rows) on a few held-out frames (column groups:
    the frame, then its K maps), on one colour scale with a colour bar; a cross marks each map's
    centre of mass, the encoder's output.

    Where a map is not zero away from its ball, the centre of mass sits between the ball and the
    middle of the frame: the encoder's outputs are then an affine, shrunk copy of the positions,
    which the linear decoder of the evaluation maps back. The figure's caption says so.

    :param path-like path: the PNG to write.
    :param torch.Tensor frames: frames in ``[0, 1]``, one channel per ball (shown as RGB when
        there are 3 channels, as grey otherwise). Shape: (F, C, H, W).
    :param dict maps: prior name -> feature maps in ``(0, 1)``. Shape: (F, K, H, W) each.
    :param dict centres_of_mass: prior name -> centres of mass ``(x_1, y_1, ...)`` in pixels.
        Shape: (F, 2K) each.
    :param frame_labels: a label per frame (e.g. its index in the video).
    :param int max_frames: at most this many of the frames are shown.
    :return: the figure.
    """
    images = _numpy(frames)[:max_frames]  # (F, C, H, W)
    num_frames, channels = images.shape[:2]
    shown = images.transpose(0, 2, 3, 1) if channels == 3 else images.max(1)  # (F, H, W[, 3])
    names = list(maps)
    num_maps = max((value.shape[1] for value in maps.values()), default=0)
    rows, columns = max(len(names), 1), num_frames * (1 + num_maps)
    fig = Figure(figsize=(0.95 * columns + 1.1, 0.95 * rows + 1.2), layout="constrained")
    axes = np.asarray(fig.subplots(rows, columns, squeeze=False))
    image = None
    for row, name in enumerate(names):
        feature = _numpy(maps[name])[:num_frames]  # (F, K, H, W)
        com = _numpy(centres_of_mass[name])[:num_frames].reshape(num_frames, -1, 2)  # (F, K, 2)
        for f in range(num_frames):
            first = f * (1 + num_maps)
            axes[row, first].imshow(np.clip(shown[f], 0.0, 1.0), cmap="gray", vmin=0, vmax=1)
            for k in range(feature.shape[1]):
                ax = axes[row, first + 1 + k]
                image = ax.imshow(feature[f, k], cmap="magma", vmin=0, vmax=1)
                # pixel [i, j] has centre (j + 1/2, i + 1/2); imshow puts it at (j, i)
                ax.plot(com[f, k, 0] - 0.5, com[f, k, 1] - 0.5, "+", color="cyan", ms=7, mew=1.5)
                if row == 0:
                    ax.set_title(f"map {k + 1}", fontsize=8)
            if row == 0:
                label = frame_labels[f] if frame_labels is not None else f"frame {f + 1}"
                axes[row, first].set_title(label, fontsize=8)
        axes[row, 0].set_ylabel(name, fontsize=9)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8, label="map value", pad=0.01)
    fig.suptitle("Learned feature maps on held-out frames; + marks each map's centre of mass "
                 "(the encoder's output)", fontsize=9)
    fig.text(0.01, 0.005, "Where a map is not zero away from its ball, its centre of mass lies "
             "between the ball and the middle of the frame:\nthe 6 outputs are then an affine, "
             "shrunk copy of the ball positions, which the linear decoder of the evaluation "
             "maps back.", fontsize=7, ha="left", va="bottom")
    fig.get_layout_engine().set(rect=(0, 0.06, 1, 0.94))
    fig.savefig(path, dpi=DPI)
    return fig


def plot_training_curves(path: str | os.PathLike, histories: Mapping[str, Mapping],
                         untrained_r2: Mapping[str, float] | None = None) -> Figure:
    """The loss and the held-out R^2 of every prior against the step, with the untrained
    encoder's R^2 dashed (:func:`~rpm.experiments.figures.plot_training`).

    :param path-like path: the PNG to write.
    :param dict histories: prior name -> the trainer's history (``{"losses": [[step, loss],
        ...], "evaluations": [{"step": ..., "r2": ...}, ...]}``, the ``history.json`` of each
        prior's folder).
    :param untrained_r2: prior name -> held-out R^2 of its encoder before training, or None.
    :return: the figure.
    """
    return plot_training(path, histories, loss_label="negative ELBO / N",
                         title="Bouncing balls: training curves", baselines=untrained_r2,
                         baseline_label="untrained")


def plot_forecasts(
    path: str | os.PathLike,
    centres: torch.Tensor,
    forecast: torch.Tensor,
    num_frames: int = 15,
    error_px: float | None = None,
    baseline_px: float | None = None,
) -> Figure:
    """The state-space prior's one-step forecasts against the true trajectories: each ball's
    true path (solid, dots at the frames) and the forecast of each frame from the frames before
    it (crosses, joined by a thin line to the true position they predict), over the first
    held-out frames; a legend names the balls and the marks.

    The title gives the mean errors over *all* the held-out frames (those of ``results.json``:
    ``error_px`` and ``baseline_px`` when given, else computed from ``centres`` and ``forecast``,
    the baseline then from consecutive frames of ``centres``), not over the frames shown.

    :param path-like path: the PNG to write.
    :param torch.Tensor centres: true held-out centres in pixels. Shape: (T, K, 2).
    :param torch.Tensor forecast: one-step forecasts of the same frames. Shape: (T, K, 2).
    :param int num_frames: how many held-out frames to show.
    :param float error_px: mean forecast error over the T frames (``forecast_error_px``).
    :param float baseline_px: mean error of the last position as the forecast
        (``baseline_forecast_error_px``).
    :return: the figure.
    """
    all_truth, all_guess = _numpy(centres), _numpy(forecast)  # (T, K, 2)
    truth, guess = all_truth[:num_frames], all_guess[:num_frames]  # (T', K, 2)
    if error_px is None:
        error_px = float(np.linalg.norm(all_guess - all_truth, axis=-1).mean())
    if baseline_px is None:
        baseline_px = float(np.linalg.norm(all_truth[1:] - all_truth[:-1], axis=-1).mean())
    fig = Figure(figsize=(4.8, 5.4), layout="constrained")
    ax = fig.subplots()
    for ball in range(truth.shape[1]):
        colour = _BALL_COLOURS[ball % len(_BALL_COLOURS)]
        ax.plot(truth[:, ball, 0], truth[:, ball, 1], color=colour, lw=1.0, marker=".", ms=4)
        ax.scatter(guess[:, ball, 0], guess[:, ball, 1], color=colour, marker="x", s=14)
        for t in range(len(truth)):
            ax.plot([truth[t, ball, 0], guess[t, ball, 0]],
                    [truth[t, ball, 1], guess[t, ball, 1]], color=colour, lw=0.5, alpha=0.6)
    ax.set_aspect("equal")
    ax.invert_yaxis()  # image coordinates: y grows downwards
    ax.set_xlabel("x (pixels)")
    ax.set_ylabel("y (pixels)")
    handles = [Line2D([], [], color=_BALL_COLOURS[ball % len(_BALL_COLOURS)], lw=2,
                      label=f"ball {ball + 1}") for ball in range(truth.shape[1])]
    handles += [Line2D([], [], color="0.3", lw=1.0, marker=".", ms=4, label="true path"),
                Line2D([], [], color="0.3", lw=0, marker="x", ms=5, label="forecast"),
                Line2D([], [], color="0.3", lw=0.5, label="forecast error")]
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=7, frameon=False)
    ax.set_title(f"state-space prior: one-step forecasts, the first {len(truth)} of "
                 f"{len(all_truth)} held-out frames\nmean error over all {len(all_truth)}: "
                 f"{error_px:.2f} px (last position as the forecast: {baseline_px:.2f} px)",
                 fontsize=8)
    fig.savefig(path, dpi=DPI)
    return fig
