r"""The parallel (associative-scan) Kalman filter and smoother against the sequential one.

One measured step is what training does with a long sequence: the filter's log-likelihood, the
RTS smoother and the gradient of both with respect to every parameter (A, Q, C, R, m_1, S_1),
for N sequences of T frames with D = 4 observed and H = 8 hidden dimensions (the constant-velocity
state of ``StateSpacePrior(4)``), in float64 as ``rpm.ops.kalman`` computes. Each length is timed
with ``method="sequential"`` and ``method="parallel"`` alternately in the same run, and the ratio
printed; the target (issue "Sequences 2", item 5) is T = 1000, D = 4 under 1 s on the CPU. The
sweep over shorter T is what sets ``rpm.ops.kalman.PARALLEL_THRESHOLD``.

Usage: ``python benchmarks/kalman.py --threads 1 --clock cpu``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from rpm.ops.kalman import PARALLEL_THRESHOLD, kalman_filter, rts_smoother

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def model(num_steps: int, num_sequences: int, dim: int = 4, seed: int = 0):
    """A constant-velocity chain with friction and a random walk of observations."""
    generator = torch.Generator().manual_seed(seed)
    eye = torch.eye(dim, dtype=torch.float64)
    params = dict(
        init_loc=torch.zeros(2 * dim, dtype=torch.float64),
        init_scale_tril=torch.eye(2 * dim, dtype=torch.float64),
        transition_matrix=torch.cat([torch.cat([eye, eye], 1), torch.cat([0 * eye, 0.9 * eye], 1)]),
        transition_scale_tril=0.1 * torch.eye(2 * dim, dtype=torch.float64),
        observation_matrix=torch.cat([eye, 0 * eye], 1),
        observation_scale_tril=0.1 * eye)
    params = {name: value.requires_grad_() for name, value in params.items()}
    z = 0.1 * torch.randn(num_sequences, num_steps, dim, dtype=torch.float64,
                          generator=generator).cumsum(1)
    return z, params


def step(z, params, method: str) -> None:
    """Filter + smoother + the gradient of their outputs with respect to every parameter."""
    filtered = kalman_filter(z, **params, method=method)
    smoothed = rts_smoother(filtered, params["transition_matrix"], params["transition_scale_tril"],
                            method=method)
    loss = filtered.log_prob.sum() + smoothed.loc.square().sum() + smoothed.scale_tril.sum()
    torch.autograd.grad(loss, list(params.values()))


def seconds(z, params, method: str, repeats: int, clock: str) -> float:
    now = CLOCKS[clock]
    step(z, params, method)  # warm-up
    times = []
    for _ in range(repeats):
        start = now()
        step(z, params, method)
        times.append(now() - start)
    return statistics.median(times)


def main(args: argparse.Namespace) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    load = os.getloadavg()
    print(f"threads={torch.get_num_threads()} clock={args.clock} load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; PARALLEL_THRESHOLD={PARALLEL_THRESHOLD}")
    print(f"{'T':>6} {'N':>4} {'sequential':>12} {'parallel':>12} {'seq / par':>10}")
    for num_steps in args.steps:
        for num_sequences in args.sequences:
            z, params = model(num_steps, num_sequences)
            repeats = args.repeats if num_steps <= 200 else max(1, args.repeats // 3)
            best = {"sequential": float("inf"), "parallel": float("inf")}
            for _ in range(args.rounds):  # interleaved, so that load affects both alike
                for method in best:
                    best[method] = min(best[method], seconds(z, params, method, repeats, args.clock))
            seq, par = best["sequential"], best["parallel"]
            print(f"{num_steps:>6} {num_sequences:>4} {1e3 * seq:>9.1f} ms {1e3 * par:>9.1f} ms "
                  f"{seq / par:>9.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[8, 16, 32, 64, 128, 1000])
    parser.add_argument("--sequences", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: default)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                        help="this process's CPU time (for a shared CPU) or wall time")
    main(parser.parse_args())
