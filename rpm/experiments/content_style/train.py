r"""Training and scoring of one row of the ``rpm content-style`` table.

:func:`train_row` minimises the negative RPM ELBO per pair of the content prior
(:mod:`~rpm.experiments.content_style.model`; Eq. 15 of Aitchison & Ganev),
``RPMELBO().differentiable_loss(model, guide, x, x2) / N``, with Adam, a linear warm-up and a
cosine decay (:func:`~rpm.training.schedule.cosine_schedule`), through
:class:`~rpm.training.trainer.Trainer` (checkpoints, exact resumption, progress). The pairs are
those of :class:`~rpm.experiments.identifiability.data.PairStream` (the minibatch of a step is a
pure function of the seed and the step) with the row's
:class:`~rpm.data.synthetic.ContentStyleProcess` and the mixing g. It then scores the encoder
on a fresh held-out set: the block :math:`R^2` (:func:`rpm.metrics.block_r2`) of the true
content and of the true style regressed on :math:`\hat c = h(g(z))`, linear and nonlinear.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pyro
import torch

import rpm
from rpm.data.synthetic import ContentStyleProcess, InvertibleMLP
from rpm.experiments.common import fit_with_cosine_schedule, seed_everything
from rpm.experiments.content_style.model import model_from_arguments
from rpm.experiments.identifiability.data import PairStream
from rpm.experiments.trained import write_model_record
from rpm.metrics import block_r2

__all__ = ["block_scores", "train_row"]


@torch.no_grad()
def _representation(model: rpm.RPM, x: torch.Tensor) -> torch.Tensor:
    model.eval()
    return model.encode(x)


def block_scores(z: torch.Tensor, c_hat: torch.Tensor, content_dim: int,
                 nonlinear: bool = True) -> dict:
    r"""Held-out block :math:`R^2` of the content ``z[:, :content_dim]`` and of the style
    ``z[:, content_dim:]`` regressed on ``c_hat`` (first half fits, second half scores).

    :param torch.Tensor z: true latents. Shape: (M, n_c + n_s).
    :param torch.Tensor c_hat: the representation. Shape: (M, m).
    :param int content_dim: :math:`n_c`.
    :param bool nonlinear: also the kernel ridge scores (seconds for a few thousand samples).
    :return: ``content_r2_linear``, ``style_r2_linear`` and, with ``nonlinear``,
        ``content_r2_nonlinear``, ``style_r2_nonlinear``.
    """
    blocks = {"content": z[:, :content_dim], "style": z[:, content_dim:]}
    scores = {f"{name}_r2_linear": block_r2(block, c_hat) for name, block in blocks.items()}
    if nonlinear:
        scores.update({f"{name}_r2_nonlinear": block_r2(block, c_hat, nonlinear=True)
                       for name, block in blocks.items()})
    return scores


def train_row(name: str, args: argparse.Namespace, process: ContentStyleProcess,
              mixing: InvertibleMLP, held_out: dict, out: Path) -> dict:
    """Trains (or resumes, or reloads) the encoder of one row in ``out`` and scores it.

    :param str name: the row's name (its folder, the progress label).
    :param argparse.Namespace args: the resolved flags.
    :param ContentStyleProcess process: the row's latent process, on the training device.
    :param InvertibleMLP mixing: the mixing g, on the training device.
    :param dict held_out: ``{"eval": (z, x), "test": (z, x)}``, fresh held-out sets.
    :param Path out: the row's folder (checkpoint, history).
    :return: the JSON-ready result (scores, the untrained encoder's, the style :math:`R^2` of
        the true content, the trajectory).
    """
    seed_everything(args.seed)  # the same encoder initialisation in every row
    dim = process.dim
    arguments = {"dim": dim, "content_dims": args.content_dims, "hidden": args.hidden,
                 "depth": args.depth, "prior": args.prior, "lengthscale": args.lengthscale,
                 "noise_scale": args.noise_scale}
    model = model_from_arguments(arguments).to(process.device)
    write_model_record(out, "content-style", arguments, (dim,))  # what rpm.load rebuilds it from
    z_eval, x_eval = held_out["eval"]
    z_test, x_test = held_out["test"]
    untrained = block_scores(z_test, _representation(model, x_test), process.content_dim,
                             nonlinear=False)
    stream = PairStream(process, mixing, args.batch_size, args.seed, args.chunk_steps)
    elbo = rpm.RPMELBO()

    def loss_fn(step: int) -> torch.Tensor:
        x, x2 = stream(step)  # (N, n) each
        with pyro.validation_enabled(False):  # our own sampler's pairs: no per-step checks
            return elbo.differentiable_loss(model.model, model.guide, x, x2) / args.batch_size

    def eval_fn(step: int) -> dict:
        return block_scores(z_eval, _representation(model, x_eval), process.content_dim,
                            nonlinear=False)

    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    history = fit_with_cosine_schedule(model, optimizer, loss_fn, args, out, name, eval_fn,
                                       log_every=min(100, args.steps))
    evaluations = history["evaluations"]
    scores = block_scores(z_test, _representation(model, x_test), process.content_dim)
    return {
        "row": name,
        "p_change": process.p_change,
        "statistical": process.statistical,
        "causal": process.causal,
        **scores,
        # what a perfect content encoder would give: the style explained by the true content
        "style_r2_linear_true_content": block_r2(z_test[:, process.content_dim:],
                                                 z_test[:, :process.content_dim]),
        "untrained": untrained,
        "trajectory": {key: [e.get(key) for e in evaluations]
                       for key in ("step", "content_r2_linear", "style_r2_linear", "wall_time")},
        "losses": history["losses"],
        "train_seconds": evaluations[-1]["wall_time"],
    }
