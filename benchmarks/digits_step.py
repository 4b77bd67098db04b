r"""CPU time of one ``rpm digits`` training step of each method against the plain-torch
NT-Xent step (issue target: an rpm step at most 1.1x the plain-torch step).

Every method trains the experiment's CNN (:class:`rpm.experiments.digits.model.DigitsEncoder`)
with Adam on the same augmented views of a batch of digits (two, or the J views of the
methods over more views, whose steps encode J / 2 times as many images and are not held to the
1.1x target): the views are drawn once, so only the encoder, the objective and the optimiser
are timed. The methods are timed in turns
(round robin, ``--rounds`` rounds of ``--steps`` steps) so that a change of the machine's load
affects all of them alike; the median per-step CPU time of this process
(``time.process_time``) of each is printed with its ratio to ``torch_ntxent``.

Usage: ``python benchmarks/digits_step.py --batch-size 256 --rounds 5 --steps 10``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import pyro
import torch

from rpm.data.digits import load_digits_split
from rpm.experiments.digits.model import METHODS, VIEWS, build_method, torch_ntxent_loss
from rpm.experiments.digits.train import method_views, rpm_step_loss


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    images = load_digits_split().train.images[:args.batch_size]
    views = {name: method_views(name)(images, torch.Generator().manual_seed(0)) for name in METHODS}
    steps = {}
    for name in METHODS:
        torch.manual_seed(0)
        module, encoder = build_method(name, 16, 64, args.temperature)
        optimizer = torch.optim.Adam(module.parameters(), lr=1e-3)

        def step(name=name, module=module, encoder=encoder, optimizer=optimizer, xs=views[name]) -> None:
            if name == "torch_ntxent":
                loss = torch_ntxent_loss(encoder(xs[0]), encoder(xs[1]), args.temperature)
                latents = None
            else:  # the experiment's step: RPMELBO, or the queue's ELBO and its push after the step
                with pyro.validation_enabled(False):
                    loss, latents = rpm_step_loss(module, list(xs))
                loss = loss / xs[0].shape[0]
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if latents is not None:
                module.prior.push(latents)

        step()  # warm-up
        steps[name] = step
    times = {name: [] for name in METHODS}
    for _ in range(args.rounds):
        for name, step in steps.items():
            start = time.process_time()
            for _ in range(args.steps):
                step()
            times[name].append((time.process_time() - start) / args.steps)
    base = statistics.median(times["torch_ntxent"])
    print(f"batch {args.batch_size}, {args.threads} thread(s), torch {torch.__version__}; median CPU time "
          f"per step over {args.rounds} rounds of {args.steps} steps")
    print(f"{'method':<14} {'views':>6} {'ms/step':>8} {'/ torch_ntxent':>15}")
    for name, values in times.items():
        median = statistics.median(values)
        views_ = "+".join(str(v) for v in VIEWS[name] if v)
        print(f"{name:<14} {views_:>6} {1000 * median:>8.1f} {median / base:>15.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
