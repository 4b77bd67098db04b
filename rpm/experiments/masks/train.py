"""Training of one prior of ``rpm masks`` (:func:`train_prior`)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pyro
import torch

import rpm
from rpm.data.masks import MaskVideo
from rpm.experiments.common import derived_seed, fit_or_resume, seed_everything
from rpm.experiments.masks.model import model_from_arguments, walk_parameters
from rpm.experiments.trained import write_model_record
from rpm.metrics import mcc, mcc_per_dimension
from rpm.training.trainer import Trainer

__all__ = ["train_prior"]


def _encode(model: rpm.RPM, frames: torch.Tensor) -> torch.Tensor:
    """The encoder's outputs for all ``frames`` (M, 1, S, S), shape (M, D)."""
    model.eval()
    with torch.no_grad():
        return model.encode(frames)


def train_prior(name: str, args: argparse.Namespace, video: MaskVideo, test: MaskVideo,
                device, out: Path) -> dict:
    """Trains (or resumes, or reloads) the RPM with prior ``name`` in ``out`` on pairs (or
    windows of ``args.window`` frames) of ``video``, ``args.delta_t`` frames apart, and scores
    it on ``test``.

    Every prior starts from the same encoder initialisation (the run seed) and sees the same
    minibatches: step s draws its pairs from the stream ``derived_seed(seed, "train", s)``.
    The learned shape is held at its start, 1 (the Laplace walk), for the first
    ``args.shape_warmup`` steps: learned from the start, it falls below 1 while the encoder is
    still far from the factors, and the encoder then settles on a worse map.

    :return: the JSON-ready result: the test ``mcc``, the per-factor correlations, the learned
        prior parameters, the trajectory, the losses and the training time.
    """
    seed_everything(args.seed)
    arguments = {"prior": name, "image_size": args.image_size, "dim": video.dim,
                 "channels": args.channels, "hidden": args.hidden, "window": args.window}
    model = model_from_arguments(arguments).to(device)
    walk = model.prior.energy.walk
    write_model_record(out, "masks", arguments,
                       (1, args.image_size, args.image_size))  # what rpm.load rebuilds it from
    frames = video.frames.reshape(-1, 1, args.image_size, args.image_size).to(device)
    test_frames = test.frames.reshape(-1, 1, args.image_size, args.image_size).to(device).float()
    test_factors = test.factors.reshape(-1, test.dim).to(device)
    windows = video.windows(args.window, args.delta_t).to(device)  # (M, window) frame indices
    elbo = rpm.RPMELBO()

    def loss_fn(step: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(derived_seed(args.seed, "train", step))
        rows = windows[torch.randint(len(windows), (args.batch_size,),
                                     generator=generator).to(device)]
        views = frames[rows].float()                                   # (N, window, 1, S, S)
        with pyro.validation_enabled(False):
            if args.window == 2:
                loss = elbo.differentiable_loss(model.model, model.guide, views[:, 0], views[:, 1])
            else:
                loss = elbo.differentiable_loss(model.model, model.guide, views)
        return loss / args.batch_size

    def eval_fn(step: int) -> dict:
        return {"mcc": mcc(test_factors, _encode(model, test_frames)), **walk_parameters(walk)}

    shape = [p for n, p in walk.named_parameters() if n.startswith("shape")]
    walk_params = [p for p in walk.parameters() if all(p is not q for q in shape)]
    encoder_params = [p for p in model.parameters() if all(p is not q for q in walk_params + shape)]
    groups = [{"params": encoder_params, "lr": args.lr},
              {"params": walk_params, "lr": args.prior_lr}]
    factors = [lambda step: 1.0, lambda step: 1.0]
    if shape:  # held at its start (1, the Laplace walk) for the first --shape-warmup steps
        groups.append({"params": shape, "lr": args.prior_lr})
        factors.append(lambda step: float(step >= args.shape_warmup))
    optimizer = torch.optim.Adam(groups)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factors)
    trainer = Trainer(model, optimizer, loss_fn, out_dir=out, num_steps=args.steps,
                      scheduler=scheduler,
                      eval_fn=eval_fn, eval_every=args.eval_every,
                      checkpoint_every=args.checkpoint_every, log_every=min(100, args.steps),
                      progress=args.progress, description=name, eval_at_start=True,
                      eval_label="test")
    history = fit_or_resume(trainer, args.resume, name)
    latents = _encode(model, test_frames)
    evaluations = history["evaluations"]
    return {
        "mcc": mcc(test_factors, latents),
        "mcc_per_factor": mcc_per_dimension(test_factors, latents).abs_correlation.tolist(),
        "prior_parameters": walk_parameters(walk),
        "trajectory": {key: [e.get(key) for e in evaluations]
                       for key in ("step", "mcc", "wall_time", "step_scale", "shape")
                       if key in evaluations[-1]},
        "losses": history["losses"],
        "train_seconds": evaluations[-1]["wall_time"],
        "steps": args.steps,
    }
