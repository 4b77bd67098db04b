"""The figure of ``rpm lds`` (``dynamics.png``): the learned and true eigenvalues of the
transition in the complex plane, and a held-out sequence's true state against its smoothed
latents mapped to the state by the affine map of the evaluation.

Figures are drawn on :class:`matplotlib.figure.Figure` objects directly (no ``pyplot`` state).
"""

from __future__ import annotations

import os

import numpy as np
import torch
from matplotlib.figure import Figure

from rpm.experiments.figures import DPI

__all__ = ["plot_dynamics"]


def plot_dynamics(path: str | os.PathLike, learned: torch.Tensor, true: torch.Tensor | None,
                  states: torch.Tensor | None, decoded: torch.Tensor, scores: dict) -> Figure:
    """Left: the eigenvalues of the learned A (crosses) and the true A (circles, when known)
    with the unit circle. Right: the first three coordinates of the true state of the first
    held-out sequence (solid) and their affine read-out from the smoothed latents (dashed); or,
    without states, the first three smoothed latents of a sequence.

    :param path-like path: the PNG to write.
    :param torch.Tensor learned: eigenvalues of the learned A, complex, (H,).
    :param true: eigenvalues of the true A, complex, (H,), or None.
    :param states: the true state of the first held-out sequence, (T, K), or None.
    :param torch.Tensor decoded: its read-out from the smoothed latents, (T, K); without states,
        the smoothed latents of one sequence, (T, H).
    :param dict scores: ``r2`` and ``eigenvalue_error`` (either may be None), in the titles.
    """
    fig = Figure(figsize=(9.0, 3.6), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=[1, 2])
    angle = np.linspace(0, 2 * np.pi, 200)
    left.plot(np.cos(angle), np.sin(angle), color="0.8", lw=1)
    if true is not None:
        left.scatter(true.real.numpy(), true.imag.numpy(), facecolors="none", edgecolors="k",
                     s=60, label="true")
    left.scatter(learned.real.numpy(), learned.imag.numpy(), marker="x", color="tab:red",
                 label="learned")
    left.set_aspect("equal")
    error = scores.get("eigenvalue_error")
    left.set_title("eigenvalues of A" + ("" if error is None else f" (max error {error:.3f})"),
                   fontsize=9)
    left.set_xlim(-1.15, 1.15)
    left.set_ylim(-1.15, 1.15)
    left.legend(fontsize=8, loc="center")
    steps = np.arange(len(decoded))
    for k in range(min(3, decoded.shape[1])):
        if states is None:
            right.plot(steps, decoded[:, k].numpy(), lw=1.2)
            continue
        line, = right.plot(steps, states[:, k].to(torch.float64).numpy(), lw=1.2)
        right.plot(steps, decoded[:, k].numpy(), ls="--", color=line.get_color(), lw=1.2)
    right.set_xlabel("step")
    # Two lines: constrained layout makes room for a title's height, not its width, and one
    # line was wider than the axes and clipped at the figure's right edge.
    right.set_title("a sequence's smoothed latents\n(no states to compare with)" if states is None
                    else "held-out sequence: true state (solid),\nfrom the smoothed latents "
                    f"(dashed); R^2 {scores['r2']:.4f}", fontsize=9)
    fig.savefig(path, dpi=DPI)
    return fig
