r"""The identifiability results (``docs/theory.md``, *Evaluation*) over several seeds: runs
``rpm identifiability`` for each setting and seed and prints mean +- std.

Settings (n = ``--dim`` latents, an invertible 3-layer leaky-ReLU MLP as the mixing g):

* ``sphere``: uniform marginal on the sphere, vMF(kappa = 1) conditional, cosine energy with
  kappa = 1 (Zimmermann et al., Table 1: R^2 = 99.42 +- 0.05 %).
* ``box``: uniform marginal on the box [-1, 1]^n, Laplace(0.05) conditional, L1 energy
  (``--energy lp --p 1``) with the encoder's outputs squashed into the box and a learned
  temperature starting at 0.1 (it settles near the conditional's scale 0.05; Zimmermann et al.
  learn the box's size instead, which is the same thing), Zimmermann et al., Table 2:
  MCC = 98.62 +- 0.05 %.
* ``aninfonce``: uniform marginal on the sphere, anisotropic Gaussian conditional with
  concentrations 5 (first half) and 25 (second half), cosine against anisotropic energy on the
  same data (Rusak et al.): per-dimension R^2 and the learned ratio of the group concentrations.

Usage (the runs recorded in ``benchmarks/README.md``; 38 and 3 minutes per seed on one CPU
core)::

    python benchmarks/identifiability.py --settings sphere --steps 64000 --batch-size 1024 \
        --lr 2e-3 --eval-every 4000      # R^2 0.992; --steps 48000: 0.989
    python benchmarks/identifiability.py --settings aninfonce --steps 10000 --eval-every 1000
    python benchmarks/identifiability.py --settings sphere --seeds 0 --steps 3000   # a quick look
    python benchmarks/identifiability.py --settings sphere --seeds 0 --device cuda \
        --batch-size 1024 --lr 2e-3 --time-budget 240 --eval-every 2000   # a wall-clock budget

With ``--time-budget SECONDS`` the number of steps is not given but fitted to the budget: a
probe run of ``--probe-steps`` steps (its own folder, ``probe-seed-S``) measures the pairs per
second of this setting on this machine, and the run then takes
``floor(SECONDS * pairs_per_second / batch_size)`` steps (rounded down to a multiple of
``--eval-every``), so that the cosine schedule ends near the budget instead of being cut off.
The summary then also gives the first wall time at which the held-out MCC reached 0.95 and 0.98.

Each run's folder (``--out``/SETTING/seed-S) holds its ``results.json`` and figures; the table is
also written to ``--out``/summary-SETTINGS.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from rpm.cli import main as rpm_main

SETTINGS = {
    "sphere": ["--space", "sphere", "--marginal", "uniform", "--conditional", "vmf",
               "--conditional-param", "1", "--energy", "cosine", "--tau", "1"],
    "box": ["--space", "box", "--marginal", "uniform", "--conditional", "laplace",
            "--conditional-param", "0.05", "--energy", "lp", "--p", "1",
            "--encoder-space", "box", "--tau", "0.1", "--learn-temperature"],
    "aninfonce": ["--space", "sphere", "--marginal", "uniform", "--conditional", "anisotropic",
                  "--concentrations", "5,25", "--compare-energies", "cosine,anisotropic",
                  "--energy-lr", "0.1"],
}


def _mean_std(values: list) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.4f} +- {std:.4f}"


def _summarise(setting: str, results: list) -> dict:
    if setting != "aninfonce":
        results = [next(iter(r["runs"].values())) for r in results]
        return {
            "r2": _mean_std([r["r2"] for r in results]),
            "mcc": _mean_std([r["mcc"] for r in results]),
            "train_seconds": _mean_std([r["train_seconds"] for r in results]),
            "time_to_r2_0.95": _mean_std([r["time_to_r2"]["0.95"] for r in results]),
            "time_to_r2_0.99": _mean_std([r["time_to_r2"]["0.99"] for r in results]),
            "time_to_mcc_0.95": _mean_std([_time_to_mcc(r, 0.95) for r in results]),
            "time_to_mcc_0.98": _mean_std([_time_to_mcc(r, 0.98) for r in results]),
        }
    summary = {}
    for energy in ("cosine", "anisotropic"):
        runs = [r["runs"][energy] for r in results]
        summary[energy] = {
            "r2": _mean_std([r["r2"] for r in runs]),
            "min_r2_per_dimension": _mean_std([min(r["r2_per_dimension"]) for r in runs]),
            "r2_first_half": _mean_std([statistics.mean(r["r2_per_dimension"][:len(
                r["r2_per_dimension"]) // 2]) for r in runs]),
            "r2_second_half": _mean_std([statistics.mean(r["r2_per_dimension"][len(
                r["r2_per_dimension"]) // 2:]) for r in runs]),
            "train_seconds": _mean_std([r["train_seconds"] for r in runs]),
        }
        if energy == "anisotropic":
            summary[energy]["group_ratio_learned"] = _mean_std(
                [r["group_ratio_learned"] for r in runs])
            summary[energy]["group_ratio_error"] = _mean_std(
                [r["group_ratio_error"] for r in runs])
            summary[energy]["group_ratio_oracle"] = _mean_std(
                [r["group_ratio_oracle"] for r in runs])
            summary[energy]["group_ratio_error_oracle"] = _mean_std(
                [r["group_ratio_error_oracle"] for r in runs])
    return summary


def _time_to_mcc(result: dict, level: float) -> float | None:
    """First wall time (s) at which the validation MCC of a run's trajectory reached ``level``."""
    trajectory = result["trajectory"]
    for mcc, seconds in zip(trajectory["mcc"], trajectory["wall_time"], strict=True):
        if mcc is not None and mcc >= level:
            return seconds
    return None


def fitted_steps(budget: float, pairs_per_second: float, batch_size: int, eval_every: int) -> int:
    """Steps of ``batch_size`` pairs that fit ``budget`` seconds at ``pairs_per_second``, rounded
    down to a multiple of ``eval_every`` (at least one evaluation interval, or one step)."""
    steps = int(budget * pairs_per_second / batch_size)
    if eval_every > 0:
        steps = max(eval_every, steps - steps % eval_every)
    return max(steps, 1)


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", nargs="+", choices=tuple(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--dim", type=int, default=10)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--extra", default="", help="further flags for every run, one string")
    parser.add_argument("--out", default="runs/benchmark-identifiability")
    parser.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                        help="fit --steps to this wall-clock budget after a probe run")
    parser.add_argument("--probe-steps", type=int, default=300,
                        help="steps of the probe run that measures pairs per second")
    args = parser.parse_args(argv)
    table = {}
    for setting in args.settings:
        results = []
        for seed in args.seeds:
            out = Path(args.out) / setting / f"seed-{seed}"

            def flags_for(steps, eval_every, folder, seed=seed, setting=setting):
                return [*SETTINGS[setting], "--dim", str(args.dim), "--steps", str(steps),
                        "--batch-size", str(args.batch_size), "--lr", str(args.lr),
                        "--hidden", str(args.hidden), "--eval-every", str(eval_every),
                        "--device", args.device, "--threads", str(args.threads),
                        "--seed", str(seed), "--out", str(folder), "--overwrite",
                        "--no-progress", *(["--compile"] if args.compile else []),
                        *args.extra.split()]

            steps = args.steps
            if args.time_budget is not None:
                probe = Path(args.out) / setting / f"probe-seed-{seed}"
                status = rpm_main(["identifiability", *flags_for(args.probe_steps, 0, probe)])
                if status != 0:
                    return status
                rate = next(iter(json.loads((probe / "results.json").read_text())["runs"]
                                 .values()))["pairs_per_second"]
                steps = fitted_steps(args.time_budget, rate, args.batch_size, args.eval_every)
                print(f"== {setting} seed {seed}: probe {rate:.0f} pairs/s -> {steps} steps for "
                      f"{args.time_budget:.0f} s", flush=True)
            flags = flags_for(steps, args.eval_every, out)
            print(f"== {setting} seed {seed}: rpm identifiability {' '.join(flags)}", flush=True)
            status = rpm_main(["identifiability", *flags])
            if status != 0:
                return status
            results.append(json.loads((out / "results.json").read_text()))
        table[setting] = {"steps": steps, "batch_size": args.batch_size,
                          "seeds": args.seeds, "device": results[0]["environment"]["device"],
                          **_summarise(setting, results)}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    summary = Path(args.out) / f"summary-{'-'.join(args.settings)}.json"
    summary.write_text(json.dumps(table, indent=2) + "\n")
    print(json.dumps(table, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
