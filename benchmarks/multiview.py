r"""Steps of the one RPM over J views: the sequence toy and a J-view step against a pair step.

Two measurements, each a ratio against a baseline measured in the same run:

* **sequence toy** (issue 22, "What is wrong" 5): ``rpm.RPM`` with N = 64 sequences of
  T = 10 frames, D = 2, one ``torch.nn.Linear(4, 2)`` under ``DeltaRecognition(noise_scale=0.1)``
  and the ``StateSpacePrior``, one ``RPMELBO`` + ``torch.optim.Adam`` step (and, with
  ``--svi``, one ``SVI`` + ``Trace_ELBO`` step) with the recognition guide and with the
  structured guide (target: at most 20 ms each); the baseline is the same step of a pair
  ``rpm.RPM`` with the implicit prior on the same N T frames. ``--kalman-recursions`` also times
  every sequence step with ``rpm.ops._kalman.DENSE_THRESHOLD = 0``: the scans and square-root
  recursions that the 10-frame windows took before the dense form (the code before it, in the
  same run).
* **J views against pairs over the same frames**: ``rpm.RPM`` with ``MarkovImplicitPrior``
  (an RBF energy) on N / (J / 2) instances of J views, against the pair ``rpm.RPM`` with
  ``ImplicitPrior`` on N pairs: both encode 2N frames with the same MLP and evaluate the same
  InfoNCE terms in total size (target: J-view step at most 1.2x the pair step).

Usage: ``python benchmarks/multiview.py --threads 1 --clock cpu``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import pyro
import torch

import rpm
from rpm.ops import _kalman as kalman
from rpm.priors import ImplicitPrior, MarkovImplicitPrior, RBFEnergy, StateSpacePrior

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def torch_step(model, args: tuple):
    """One RPMELBO + torch.optim.Adam step of ``model`` on ``args``."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    elbo = rpm.RPMELBO()

    def step():
        loss = elbo.differentiable_loss(model.model, model.guide, *args)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


def svi_step(model, args: tuple):
    """One ``SVI`` + ``Trace_ELBO`` + ``pyro.optim.Adam`` step of ``model`` on ``args``."""
    svi = pyro.infer.SVI(model.model, model.guide, pyro.optim.Adam({"lr": 1e-3}),
                         pyro.infer.Trace_ELBO())
    return lambda: svi.step(*args)


def with_dense_threshold(step, threshold: int):
    """``step`` run with ``rpm.ops._kalman.DENSE_THRESHOLD = threshold`` (restored after)."""
    def run():
        saved, kalman.DENSE_THRESHOLD = kalman.DENSE_THRESHOLD, threshold
        try:
            return step()
        finally:
            kalman.DENSE_THRESHOLD = saved
    return run


def sequence_toy(warmup: int, repeats: int, clock: str, svi: bool = False,
                 recursions: bool = False) -> dict[str, float]:
    num, frames, dim = 64, 10, 2
    x = torch.randn(num, frames, 4)
    steps = {}
    routes = {"RPMELBO": torch_step, **({"SVI+Trace_ELBO": svi_step} if svi else {})}
    variants = {"": None, **({" (recursions)": 0} if recursions else {})}
    for guide in ("recognition", "structured"):
        for route, make_step in routes.items():
            for suffix, threshold in variants.items():
                torch.manual_seed(0)
                model = rpm.RPM(
                    rpm.DeltaRecognition(torch.nn.Linear(4, dim), noise_scale=0.1),
                    StateSpacePrior(dim), guide=guide, encoder_calls="concat")
                step = make_step(model, (x,))
                if threshold is not None:
                    step = with_dense_threshold(step, threshold)
                steps[f"{guide}, {route}{suffix}"] = step
    torch.manual_seed(0)
    pair = rpm.RPM(rpm.DeltaRecognition(torch.nn.Linear(4, dim)), ImplicitPrior(RBFEnergy()))
    flat = x.reshape(num * frames // 2, 2, 4)
    steps["pair, same frames"] = torch_step(pair, (flat[:, 0], flat[:, 1]))
    return _interleaved(steps, warmup, repeats, clock)


def views_against_pairs(pairs: int, num_views: int, hidden: int, warmup: int, repeats: int,
                        clock: str) -> dict[str, float]:
    in_dim, dim = 10, 8
    instances = 2 * pairs // num_views

    def encoder():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(in_dim, hidden), torch.nn.ReLU(),
                                   torch.nn.Linear(hidden, dim))

    x, x2 = torch.randn(pairs, in_dim), torch.randn(pairs, in_dim)
    views = list(torch.randn(num_views, instances, in_dim).unbind(0))
    steps = {
        "pair": torch_step(
            rpm.RPM(rpm.DeltaRecognition(encoder()), ImplicitPrior(RBFEnergy())), (x, x2)),
        f"J={num_views} per_view": torch_step(
            rpm.RPM(rpm.DeltaRecognition(encoder()), MarkovImplicitPrior(RBFEnergy())),
            (views,)),
        f"J={num_views} concat": torch_step(
            rpm.RPM(rpm.DeltaRecognition(encoder()), MarkovImplicitPrior(RBFEnergy()),
                    encoder_calls="concat"), (views,)),
    }
    return _interleaved(steps, warmup, repeats, clock)


def _interleaved(steps: dict, warmup: int, repeats: int, clock: str) -> dict[str, float]:
    """The median of each step, the steps timed in turn one step at a time (``3 * repeats``
    each), so that the load of a shared machine, which changes over seconds, affects them
    alike."""
    now = CLOCKS[clock]
    for step in steps.values():
        for _ in range(warmup):
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(3 * repeats):
        for name, step in steps.items():
            start = now()
            step()
            times[name].append(now() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main(args: argparse.Namespace) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    pyro.enable_validation(args.validation)
    load = os.getloadavg()
    print(f"threads={torch.get_num_threads()} clock={args.clock} validation={args.validation} "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if not args.skip_sequence_toy:
        toy = sequence_toy(args.warmup, args.repeats, args.clock, args.svi, args.kalman_recursions)
        base = toy["pair, same frames"]
        print("sequence toy (N=64, T=10, D=2, one Linear):")
        for name, seconds in toy.items():
            print(f"  {name:>46}: {1e3 * seconds:8.2f} ms   {seconds / base:5.2f}x the pair step")
    if args.skip_views:
        return
    for pairs in args.pairs:
        r = views_against_pairs(pairs, args.views, args.hidden, args.warmup, args.repeats,
                                args.clock)
        print(f"{2 * pairs} frames: {pairs} pairs against {2 * pairs // args.views} instances of "
              f"J = {args.views} views (hidden {args.hidden}):")
        for name, seconds in r.items():
            print(f"  {name:>28}: {1e3 * seconds:8.2f} ms   {seconds / r['pair']:5.2f}x the pair "
                  "step")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``argv``: a list for tests, None for ``sys.argv``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--views", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: default)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                        help="this process's CPU time (for a shared CPU) or wall time")
    parser.add_argument("--validation", action=argparse.BooleanOptionalAction, default=False,
                        help="Pyro's validation (off: as in training)")
    parser.add_argument("--svi", action="store_true",
                        help="also time the sequence toy under SVI + Trace_ELBO")
    parser.add_argument("--kalman-recursions", action="store_true",
                        help="also time each sequence step with the Kalman recursions "
                             "(rpm.ops._kalman.DENSE_THRESHOLD = 0)")
    parser.add_argument("--skip-views", action="store_true",
                        help="the sequence toy only (no J-view comparison)")
    parser.add_argument("--skip-sequence-toy", action="store_true",
                        help="the J views against pairs only (no sequence toy)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    main(parse_args())
