r"""Overhead of one RPM training step through Pyro against a bare PyTorch InfoNCE step.

Both train the same MLP encoder on the same batch with Adam:

* **bare**: ``cross_entropy(kappa * zhat @ zhat2.T, arange(N))``, ``loss.backward()``,
  ``optimizer.step()`` (what users write today);
* **svi**: ``pyro.infer.SVI(rpm.model, rpm.guide, pyro.optim.Adam(...), rpm.RPMELBO()).step``
  for an RPM with Delta recognition and the implicit prior with a cosine energy (the same
  objective, Eq. 23-25 of Aitchison & Ganev);
* **elbo+torch**: ``rpm.RPMELBO().differentiable_loss`` with a plain ``torch.optim.Adam``, the
  path of :class:`rpm.training.Trainer` (:func:`rpm._objective.elbo` on the model's
  :meth:`~rpm.models._rpm.RPM.objective_inputs`);
* **svi-floor** (with ``--svi-floor``): the bare loss as an ``SVI`` loss, a model that only
  registers the encoder (``pyro.module``), with ``pyro.optim.Adam``: what SVI costs whatever
  the model computes.

With ``--no-validation`` every step runs under ``pyro.enable_validation(False)`` (Pyro's
default is on: the RPM then checks every batch's recognition outputs and the implicit prior's
range), which separates the cost of those checks from the rest of the step.

Prints the median step time of each (the steps timed in turn, one step at a time) and the
ratio to the bare step. ``--profile K`` then prints the K functions with the most own time
(cProfile) in each of the two RPM steps at the first batch size.
Usage: ``python benchmarks/step_overhead.py --batch-sizes 256 6144 --device cpu``.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import pyro
import torch
from pyro.infer import SVI

import rpm
from rpm.priors import CosineEnergy, ImplicitPrior


def make_encoder(dim: int, hidden: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(dim, hidden), torch.nn.LeakyReLU(),
        torch.nn.Linear(hidden, hidden), torch.nn.LeakyReLU(),
        torch.nn.Linear(hidden, dim),
    )


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def time_steps(step, device, warmup: int, repeats: int, clock: str = "wall") -> float:
    """Median time of one step; ``clock="cpu"`` counts this process's CPU time only, which is
    far less sensitive than wall time to other processes on a shared machine (CPU only)."""
    now = CLOCKS[clock]
    for _ in range(warmup):
        step()
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = now()
        step()
        synchronize(device)
        times.append(now() - start)
    return statistics.median(times)


def round_robin(steps, device, warmup: int, repeats: int, clock: str = "wall") -> dict[str, float]:
    """Median time of one step of each, the steps timed in turn one at a time (``3 * repeats``
    each), so that the load of a shared machine, which changes over seconds, affects them
    alike."""
    now = CLOCKS[clock]
    for _, step in steps:
        for _ in range(warmup):
            step()
    times = {name: [] for name, _ in steps}
    for _ in range(3 * repeats):
        for name, step in steps:
            synchronize(device)
            start = now()
            step()
            synchronize(device)
            times[name].append(now() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def benchmark(batch_size: int, dim: int, hidden: int, kappa: float, device: torch.device,
              warmup: int, repeats: int, clock: str = "wall", profile: int = 0,
              svi_floor: bool = False) -> dict[str, float]:
    x = torch.randn(batch_size, dim, device=device)
    x2 = x + 0.1 * torch.randn(batch_size, dim, device=device)
    labels = torch.arange(batch_size, device=device)

    bare_encoder = make_encoder(dim, hidden, 0).to(device)
    bare_optimizer = torch.optim.Adam(bare_encoder.parameters(), lr=1e-4)

    def bare_step():
        z = torch.nn.functional.normalize(bare_encoder(x), dim=-1)
        z2 = torch.nn.functional.normalize(bare_encoder(x2), dim=-1)
        loss = torch.nn.functional.cross_entropy(kappa * z @ z2.T, labels)
        bare_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        bare_optimizer.step()
        return loss.item()  # SVI.step returns a float too

    def make_svi_step():
        model = rpm.RPM(rpm.DeltaRecognition(make_encoder(dim, hidden, 0)),
                        ImplicitPrior(CosineEnergy(kappa))).to(device)
        svi = SVI(model.model, model.guide, pyro.optim.Adam({"lr": 1e-4}), rpm.RPMELBO())

        def svi_step():
            return svi.step(x, x2)

        return svi_step

    def make_torch_step():
        torch_model = rpm.RPM(rpm.DeltaRecognition(make_encoder(dim, hidden, 0)),
                              ImplicitPrior(CosineEnergy(kappa))).to(device)
        torch_optimizer = torch.optim.Adam(torch_model.parameters(), lr=1e-4)
        elbo = rpm.RPMELBO()

        def torch_step():
            loss = elbo.differentiable_loss(torch_model.model, torch_model.guide, x, x2) / batch_size
            torch_optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch_optimizer.step()
            return loss.item()

        return torch_step

    svi_step, torch_step = make_svi_step(), make_torch_step()

    floor_encoder = make_encoder(dim, hidden, 0).to(device)

    def floor_loss(model, guide):
        model()
        z = torch.nn.functional.normalize(floor_encoder(x), dim=-1)
        z2 = torch.nn.functional.normalize(floor_encoder(x2), dim=-1)
        return torch.nn.functional.cross_entropy(kappa * z @ z2.T, labels)

    floor_svi = SVI(lambda: pyro.module("svi_floor_encoder", floor_encoder), lambda: None,
                    pyro.optim.Adam({"lr": 1e-4}), loss=floor_loss)
    steps = [("bare", bare_step), ("svi", svi_step), ("elbo+torch", torch_step)]
    if svi_floor:
        steps.append(("svi-floor", floor_svi.step))
    results = round_robin(steps, device, warmup, repeats, clock)
    if profile:
        for name, step in (("svi", svi_step), ("elbo+torch", torch_step)):
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(200):
                step()
            profiler.disable()
            print(f"--- {name}, batch {batch_size}: 200 steps, the {profile} functions with the "
                  "most own time")
            pstats.Stats(profiler).sort_stats("tottime").print_stats(profile)
    return results


def main(args: argparse.Namespace) -> None:
    device = torch.device(args.device)
    pyro.enable_validation(not args.no_validation)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"device={device} threads={torch.get_num_threads()} dim={args.dim} hidden={args.hidden} "
          f"clock={args.clock} validation={not args.no_validation}")
    names = ("svi", "elbo+torch") + (("svi-floor",) if args.svi_floor else ())
    print(f"{'batch':>7} {'bare ms':>9} " + " ".join(f"{n + ' ms':>14}" for n in names)
          + " " + " ".join(f"{n + '/bare':>16}" for n in names))
    for index, batch_size in enumerate(args.batch_sizes):
        r = benchmark(batch_size, args.dim, args.hidden, args.kappa, device, args.warmup,
                      args.repeats, args.clock, args.profile if index == 0 else 0, args.svi_floor)
        print(f"{batch_size:>7} {1e3 * r['bare']:>9.3f} "
              + " ".join(f"{1e3 * r[n]:>14.3f}" for n in names) + " "
              + " ".join(f"{r[n] / r['bare']:>16.2f}" for n in names))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``argv``: a list for tests, None for ``sys.argv``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[256, 6144])
    parser.add_argument("--dim", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--kappa", type=float, default=10.0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall time, or this process's CPU time (for a shared CPU)")
    parser.add_argument("--profile", type=int, default=0,
                        help="print the K functions with the most own time of each RPM step")
    parser.add_argument("--svi-floor", action="store_true",
                        help="also time the bare loss as an SVI loss with pyro.optim.Adam")
    parser.add_argument("--no-validation", action="store_true",
                        help="run every step under pyro.enable_validation(False)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    main(parse_args())
