r"""The parallel (associative-scan) and dense Kalman filters against the sequential one.

One measured step (``--task smoother``, the default) is what training does with a long
sequence: the filter's log-likelihood, the RTS smoother and the gradient of both with respect to
every parameter (A, Q, C, R, m_1, S_1), for N sequences of T frames with D = 4 observed and H = 8
hidden dimensions (the constant-velocity state of ``StateSpacePrior(4)``), in float64 as
``rpm.ops._kalman`` computes. ``--task sample`` times the structured guide's step instead: the
filter's log-likelihood, a backward-sampled draw and their gradients; ``--task log_prob`` the
prior's density alone (``kalman_log_prob``). Each length is timed with every method of
``--methods`` alternately in the same run, and the ratio to the sequential recursions printed;
the target (issue "Sequences 2", item 5) is T = 1000, D = 4 under 1 s on the CPU. The sweep over
shorter T is what sets ``rpm.ops._kalman.PARALLEL_THRESHOLD`` and ``DENSE_THRESHOLD`` (the dense
form is timed up to 4 times the latter; "dense" runs the smoother as ``"auto"`` does).

Usage: ``python benchmarks/kalman.py --threads 1 --clock cpu [--task sample] [--dim 2]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from rpm.ops._kalman import (
    DENSE_THRESHOLD,
    PARALLEL_THRESHOLD,
    backward_sample,
    kalman_filter,
    kalman_log_prob,
    rts_smoother,
)

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


def step(z, params, method: str, task: str) -> None:
    """Filter + smoother (or a backward-sampled draw, or the log-likelihood alone) + the gradient
    of their outputs with respect to every parameter."""
    if task == "log_prob":
        loss = kalman_log_prob(z, **params, method=method).sum()
    else:
        filtered = kalman_filter(z, **params, method=method)
        a, scale_q = params["transition_matrix"], params["transition_scale_tril"]
        if task == "smoother":
            smoothed = rts_smoother(filtered, a, scale_q, method=method)
            loss = filtered.log_prob.sum() + smoothed.loc.square().sum() + smoothed.scale_tril.sum()
        else:
            noise = torch.randn(*filtered.filtered_loc.shape, dtype=z.dtype)
            draw = backward_sample(filtered, a, scale_q, noise, method=method)
            loss = filtered.log_prob.sum() + draw.square().sum()
    torch.autograd.grad(loss, list(params.values()))


def seconds(z, params, method: str, task: str, repeats: int, clock: str) -> float:
    now = CLOCKS[clock]
    step(z, params, method, task)  # warm-up
    times = []
    for _ in range(repeats):
        start = now()
        step(z, params, method, task)
        times.append(now() - start)
    return statistics.median(times)


def main(args: argparse.Namespace) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    load = os.getloadavg()
    print(f"threads={torch.get_num_threads()} clock={args.clock} load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; task={args.task} D={args.dim} "
          f"H={2 * args.dim}; PARALLEL_THRESHOLD={PARALLEL_THRESHOLD} "
          f"DENSE_THRESHOLD={DENSE_THRESHOLD}")
    methods = ["sequential", *(m for m in args.methods if m != "sequential")]
    print(f"{'T':>6} {'N':>4}" + "".join(f" {m:>12}" for m in methods)
          + "".join(f" {'seq / ' + m[:5]:>12}" for m in methods[1:]))
    for num_steps in args.steps:
        for num_sequences in args.sequences:
            z, params = model(num_steps, num_sequences, args.dim)
            repeats = args.repeats if num_steps <= 200 else max(1, args.repeats // 3)
            timed = [m for m in methods
                     if m != "dense" or num_steps * 2 * args.dim <= 4 * DENSE_THRESHOLD]
            best = dict.fromkeys(timed, float("inf"))
            for _ in range(args.rounds):  # interleaved, so that load affects all alike
                for method in best:
                    best[method] = min(best[method], seconds(z, params, method, args.task,
                                                             repeats, args.clock))
            cells = [f"{1e3 * best[m]:>9.2f} ms" if m in best else f"{'-':>12}" for m in methods]
            ratios = [f"{best['sequential'] / best[m]:>11.2f}x" if m in best else f"{'-':>12}"
                      for m in methods[1:]]
            print(f"{num_steps:>6} {num_sequences:>4} " + " ".join(cells) + " " + " ".join(ratios))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[8, 16, 32, 64, 128, 1000])
    parser.add_argument("--sequences", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--dim", type=int, default=4, help="D (H = 2 D)")
    parser.add_argument("--task", choices=["smoother", "sample", "log_prob"], default="smoother")
    parser.add_argument("--methods", nargs="+", default=["sequential", "parallel", "dense"],
                        choices=["sequential", "parallel", "dense"])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: default)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                        help="this process's CPU time (for a shared CPU) or wall time")
    main(parser.parse_args())
