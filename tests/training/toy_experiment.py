"""A tiny experiment on :class:`rpm.training.trainer.Trainer`, run as a real process by the
trainer and CLI tests (kill, interrupt, resume).

Linear regression y = x w + 0.1 noise with a PyroModule that has a constrained PyroParam (so
the Pyro param store is exercised), Adam and a StepLR schedule. Minibatch inputs come from the
global torch RNG, the noise from a registered torch.Generator, and each evaluation draws a
fresh batch from the global RNG as well, so that every RNG state matters for exact resumption.

Usage: ``python tests/inference/toy_experiment.py toy --out DIR [--resume] ...``. The final
parameters are in ``DIR/toy/checkpoint.pt``; ``--step-delay`` slows the steps down so that a test
can kill the process midway.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import pyro
import pyro.nn
import torch
from torch.distributions import constraints

from rpm.cli import main as cli_main
from rpm.experiments.common import (
    add_common_arguments,
    nonnegative_float,
    nonnegative_int,
    open_run,
    positive_float,
    positive_int,
    probability,
    resolve_device,
    seed_everything,
    write_json_atomic,
)
from rpm.training.trainer import Trainer

DIM = 4


class ToyRegression(pyro.nn.PyroModule):
    """y_hat = scale * (x @ weight) + bias, with scale > 0 a PyroParam."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = pyro.nn.PyroModule[torch.nn.Linear](DIM, 1)
        self.scale = pyro.nn.PyroParam(torch.tensor(0.5), constraints.positive)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * self.linear(x).squeeze(-1)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("toy", help="tiny regression used by the trainer tests")
    add_common_arguments(parser, default_checkpoint_every=20, grow_flag="--num-steps")
    parser.add_argument("--num-steps", type=positive_int, default=200)
    parser.add_argument("--lr", type=positive_float, default=0.05)
    parser.add_argument("--eval-every", type=nonnegative_int, default=25)
    parser.add_argument("--log-every", type=positive_int, default=10)
    parser.add_argument("--step-delay", type=nonnegative_float, default=0.0)
    parser.add_argument("--nan-at-step", type=nonnegative_int, default=None)
    parser.add_argument("--dropout", type=probability, default=0.0)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with open_run(args, may_change=("step_delay",), may_grow=("num_steps",)) as run:
        return _run(args, run)


def _run(args: argparse.Namespace, run) -> int:
    out = run.path
    device = resolve_device(args.device)
    seed_everything(args.seed)
    pyro.clear_param_store()
    model = ToyRegression().to(device)
    w_true = torch.arange(1.0, DIM + 1, device=device)
    noise_gen = torch.Generator(device=device).manual_seed(args.seed + 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.7)

    def loss_fn(step: int) -> torch.Tensor:
        if args.step_delay:
            time.sleep(args.step_delay)
        x = torch.randn(16, DIM, device=device)
        y = x @ w_true + 0.1 * torch.randn(16, device=device, generator=noise_gen)
        x = torch.nn.functional.dropout(x, p=args.dropout)
        loss = (model(x) - y).pow(2).mean()
        if step == args.nan_at_step:
            loss = loss * float("nan")
        return loss

    def eval_fn(step: int) -> dict[str, float]:
        with torch.no_grad():
            x = torch.randn(64, DIM, device=device)
            return {
                "mse": (model(x) - x @ w_true).pow(2).mean().item(),
                "scale": model.scale.item(),
            }

    trainer = Trainer(
        model,
        optimizer,
        loss_fn,
        out_dir=out / "toy",  # the run-folder contract: one subfolder per trained model
        num_steps=args.num_steps,
        scheduler=scheduler,
        eval_fn=eval_fn,
        eval_every=args.eval_every,
        checkpoint_every=args.checkpoint_every,
        log_every=args.log_every,
        generators={"noise": noise_gen},
        progress=args.progress,
        description="toy",
    )
    history = trainer.fit(resume=args.resume and trainer.has_checkpoint())
    write_json_atomic(out / "results.json", {"final": history["evaluations"][-1],
                                             **run.provenance()})
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(message)s")
    sys.exit(cli_main(modules=[sys.modules[__name__]]))
