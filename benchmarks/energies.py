r"""Benchmark of the energies of the implicit prior at a mild and a sharp temperature, and of the
step of ``rpm identifiability`` in the settings of issue 23, in one run, on one CPU thread.

1. ``energies``: the InfoNCE term of :class:`rpm.priors.ImplicitPrior`,
   :math:`F_{ii} - \log \sum_j e^{F_{ij}} + \log N` (Eq. 23-25 of Aitchison & Ganev), forward
   + backward, N pairs of D-dimensional latents (z ~ N(0, I), z' = z + 0.3 N(0, I)), for every
   energy at a mild temperature (logits spread over a few nats) and a sharp one (hundreds to
   thousands of nats, so that most exponentials of a row would be subnormal):

   * ``now``: the package as it is (the underflow-safe log-sum-exp, the blocked Lp kernel);
   * ``before``: the same energy matrix through ``torch.logsumexp`` and, for the Lp energy,
     ``torch.cdist`` (the implementation of main 43c952f), measured in the same run.

   Times are CPU seconds of this process (``time.process_time``) per call, the minimum over
   ``--repeats`` rounds after a warm-up; with one torch thread CPU time is the work done and
   depends little on what else runs on the machine. ``x rbf`` is the time over that of the mild
   RBF energy, ``x before`` the old implementation's time over the new one.

2. ``steps`` (``--steps-table``): the CPU time per step of ``rpm identifiability`` (10 latents,
   batch 512, one thread) for the four settings of issue 23's table, as the difference of two
   runs of ``--steps-short`` and ``--steps-long`` steps after a warm-up run (start-up,
   evaluations and figures cancel), each setting in a child process with ``PYTHONPATH`` set
   to the package tree; with ``--baseline-tree DIR`` (e.g. ``git archive`` of an older commit
   unpacked in DIR) the same steps are
   measured with that tree too, in the same run. ``x rbf`` is the time over the unbounded RBF
   step of the same tree.

Examples: ``python benchmarks/energies.py`` (part 1); ``python benchmarks/energies.py
--steps-table --baseline-tree /tmp/rpm-43c952f`` (both; the tables of benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent

# (name, mild factory, sharp factory); the sharp temperatures put the logits of a row hundreds
# to thousands of nats apart for N(0, I) latents in 10 dimensions.
ENERGIES = [
    ("bilinear", "BilinearEnergy(dim, init_scale=1.0)", "BilinearEnergy(dim, init_scale=100.0)"),
    ("cosine", "CosineEnergy(kappa=1.0)", "CosineEnergy(kappa=1000.0)"),
    ("rbf", "RBFEnergy(lengthscale=2.0)", "RBFEnergy(lengthscale=0.05)"),
    ("anisotropic", "AnisotropicEnergy(dim, normalize=False, init=0.25)",
     "AnisotropicEnergy(dim, normalize=False, init=400.0)"),
    ("lp p=1", "LpEnergy(p=1.0, tau=1.0)", "LpEnergy(p=1.0, tau=0.01)"),
    ("lp p=1.5", "LpEnergy(p=1.5, tau=1.0)", "LpEnergy(p=1.5, tau=0.01)"),
    ("lp p=3", "LpEnergy(p=3.0, tau=10.0)", "LpEnergy(p=3.0, tau=0.1)"),
    ("lp p=10", "LpEnergy(p=10.0, tau=1e6)", "LpEnergy(p=10.0, tau=1e4)"),
    ("neural", "NeuralEnergy(dim, hidden=16)", "scaled(NeuralEnergy(dim, hidden=16), 100.0)"),
]

# The four settings of issue 23 (10 latents, batch 512).
SETTINGS = {
    "unbounded, rbf --tau 2": [
        "--space", "unbounded", "--marginal", "normal", "--conditional", "normal",
        "--energy", "rbf", "--tau", "2"],
    "box, laplace 0.05, lp --p 1": [
        "--space", "box", "--marginal", "uniform", "--conditional", "laplace",
        "--conditional-param", "0.05", "--energy", "lp", "--p", "1"],
    "box, normal 0.05, rbf --tau 0.005": [
        "--space", "box", "--marginal", "uniform", "--conditional", "normal",
        "--conditional-param", "0.05", "--energy", "rbf", "--tau", "0.005"],
    "box, gennorm, lp --p 3 --learn-temperature --tau 0.1": [
        "--space", "box", "--marginal", "uniform", "--conditional", "gennorm",
        "--energy", "lp", "--p", "3", "--learn-temperature", "--tau", "0.1"],
}


def scaled(module: torch.nn.Module, factor: float) -> torch.nn.Module:
    """The module with its output layer multiplied by ``factor`` (a sharp neural energy)."""
    with torch.no_grad():
        module.out.weight.mul_(factor)
        module.out.bias.mul_(factor)
    return module


def cpu_seconds(fn, repeats: int, number: int) -> float:
    """Minimum over ``repeats`` rounds of the CPU time of ``number`` calls, per call."""
    fn()
    best = math.inf
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(number):
            fn()
        best = min(best, (time.process_time() - start) / number)
    return best


def old_energy_matrix(energy, z, z2):
    """The energy matrix as main 43c952f computed it (torch.cdist for the Lp energy)."""
    from rpm.priors import LpEnergy

    if isinstance(energy, LpEnergy) and energy.p != 2.0:
        return -torch.cdist(z, z2, p=energy.p).pow(energy.p) / energy.tau.to(z.dtype)
    return energy(z, z2)


def energy_rows(args) -> list[dict]:
    import rpm.priors as priors

    namespace = {**vars(priors), "scaled": scaled, "dim": args.dim}
    z = torch.randn(args.n, args.dim)
    z2 = z + 0.3 * torch.randn(args.n, args.dim)
    rows = []
    for name, *factories in ENERGIES:
        for temperature, factory in zip(("mild", "sharp"), factories, strict=True):
            energy = eval(factory, namespace)  # noqa: S307 - the fixed table above
            prior = priors.ImplicitPrior(energy)
            a, b = z.clone().requires_grad_(), z2.clone().requires_grad_()

            def now(prior=prior, a=a, b=b):
                loss = -prior.log_ratio(a, b).mean()
                loss.backward()
                return loss

            def before(energy=energy, a=a, b=b):
                matrix = old_energy_matrix(energy, a, b)
                loss = -(torch.diagonal(matrix) - torch.logsumexp(matrix, -1)).mean()
                loss.backward()
                return loss

            with torch.no_grad():
                matrix = energy(z, z2)
                spread = (matrix.amax(1) - matrix.amin(1)).median().item()
            row = {"energy": name, "temperature": temperature, "logit spread": spread,
                   "loss": now().item(), "loss before": before().item(),
                   "now": cpu_seconds(now, args.repeats, args.number),
                   "before": cpu_seconds(before, args.repeats, args.number)}
            rows.append(row)
            print(f"  {name:12s} {temperature:5s} spread {spread:9.3g} nats: now "
                  f"{1e3 * row['now']:7.2f} ms, before {1e3 * row['before']:7.2f} ms", flush=True)
    return rows


def step_worker(setting: str, steps_short: int, steps_long: int, batch: int) -> None:
    """Child process: prints the CPU seconds per step of one setting as JSON."""
    torch.set_num_threads(1)
    from rpm.cli import main

    times = {}
    with tempfile.TemporaryDirectory() as out:
        # a first run pays the one-time costs (imports, caches) that the difference must not see
        for steps in (steps_short, steps_short, steps_long):
            argv = ["identifiability", "--out", f"{out}/run-{steps}", "--overwrite", "--dim", "10",
                    "--steps", str(steps), "--batch-size", str(batch), "--eval-every", str(10 * steps_long),
                    "--checkpoint-every", "0", "--threads", "1", "--no-progress",
                    *SETTINGS[setting]]
            start = time.process_time()
            main(argv)
            times[steps] = time.process_time() - start
    per_step = (times[steps_long] - times[steps_short]) / (steps_long - steps_short)
    print("STEP " + json.dumps({"setting": setting, "seconds_per_step": per_step}))


def step_rows(args, tree: Path) -> dict[str, float]:
    out = {}
    for setting in SETTINGS:
        env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
        result = subprocess.run(
            [sys.executable, __file__, "--step-worker", setting, "--steps-short",
             str(args.steps_short), "--steps-long", str(args.steps_long), "--batch", str(args.batch)],
            env=env, capture_output=True, text=True, check=False,
        )
        lines = [line for line in result.stdout.splitlines() if line.startswith("STEP ")]
        if result.returncode != 0 or not lines:
            raise RuntimeError(f"step worker failed for {setting!r} with {tree}:\n"
                               f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
        out[setting] = json.loads(lines[-1][5:])["seconds_per_step"]
        print(f"  {tree}: {setting}: {1e3 * out[setting]:.2f} ms per step", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=512, help="pairs per batch (default: 512)")
    parser.add_argument("--dim", type=int, default=10, help="latent dimension (default: 10)")
    parser.add_argument("--repeats", type=int, default=5, help="timing rounds (default: 5)")
    parser.add_argument("--number", type=int, default=5, help="calls per round (default: 5)")
    parser.add_argument("--steps-table", action="store_true",
                        help="also measure the identifiability step of the four settings")
    parser.add_argument("--baseline-tree", type=Path, default=None,
                        help="a checkout of an older rpm to measure the steps with as well")
    parser.add_argument("--steps-short", type=int, default=20)
    parser.add_argument("--steps-long", type=int, default=220)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--skip-energies", action="store_true")
    parser.add_argument("--step-worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = parser.parse_args()
    if args.step_worker is not None:
        step_worker(args.step_worker, args.steps_short, args.steps_long, args.batch)
        return
    torch.set_num_threads(1)
    torch.manual_seed(0)
    load = os.getloadavg()
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, one thread, "
          f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    report = {"load_before": load}
    if not args.skip_energies:
        print(f"\n1. InfoNCE term forward + backward, N = {args.n}, D = {args.dim}, CPU time:")
        rows = energy_rows(args)
        base = next(r["now"] for r in rows if r["energy"] == "rbf" and r["temperature"] == "mild")
        print("\n| energy | temperature | logit spread (nats) | ms now | x rbf | ms before | "
              "x before |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['energy']} | {r['temperature']} | {r['logit spread']:.3g} | "
                  f"{1e3 * r['now']:.2f} | {r['now'] / base:.2f} | {1e3 * r['before']:.2f} | "
                  f"{r['before'] / r['now']:.1f} |")
        report["energies"] = rows
    if args.steps_table:
        trees = [("now", ROOT)]
        if args.baseline_tree is not None:
            trees.append(("baseline", args.baseline_tree.resolve()))
        print(f"\n2. rpm identifiability, 10 latents, batch {args.batch}, CPU ms per step "
              f"(steps {args.steps_short} -> {args.steps_long}):")
        steps = {label: step_rows(args, tree) for label, tree in trees}
        labels = [label for label, _ in trees]
        print("\n| setting | " + " | ".join(f"ms per step ({lb}) | x rbf ({lb})" for lb in labels)
              + " |")
        print("|---|" + "---|---|" * len(labels))
        for setting in SETTINGS:
            cells = []
            for label in labels:
                base = steps[label]["unbounded, rbf --tau 2"]
                cells += [f"{1e3 * steps[label][setting]:.1f}",
                          f"{steps[label][setting] / base:.2f}"]
            print(f"| {setting} | " + " | ".join(cells) + " |")
        report["steps"] = steps
    load = os.getloadavg()
    print(f"\nload average after: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    report["load_after"] = load
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
