r"""The dense InfoNCE terms of the implicit prior, forward and backward, three ways.

The per-pair terms :math:`r_i = F_{ii} - \log \sum_j e^{F_{ij}} + \log N` (Eq. 23-25 of
Aitchison & Ganev) of an (N, N) matrix of logits F, summed and backpropagated:

* **cross_entropy**: ``-cross_entropy(F, arange(N), reduction="sum") + N log N``, what a bare
  PyTorch step computes (the baseline);
* **safe_logsumexp**: ``F.diagonal() - rpm.ops.safe_logsumexp(F, -1) + log N``, the path before
  ``rpm.ops._logsumexp.diagonal_log_softmax`` (a floor against subnormal exponentials, about a dozen
  autograd nodes);
* **log_softmax**: ``rpm.ops._logsumexp.diagonal_log_softmax(F, log N)``, torch's fused ``log_softmax``
  at the diagonal (the path now).

Logits uniform in [-spread, spread] (``--spreads``; a sharp energy spreads a row over hundreds
of nats, where ``torch.exp`` of the shifted logits gives subnormal numbers). Prints the median
CPU time of each (timed in turn, one call at a time) and the ratio to the baseline.
Usage: ``python benchmarks/dense_infonce.py --sizes 16 256 512 --spreads 1 100 1000``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from rpm.ops import safe_logsumexp
from rpm.ops._logsumexp import diagonal_log_softmax


def methods(num: int) -> dict:
    labels = torch.arange(num)
    offset = math.log(num)
    return {
        "cross_entropy": lambda f: -torch.nn.functional.cross_entropy(f, labels, reduction="sum")
        + num * offset,
        "safe_logsumexp": lambda f: (f.diagonal() - safe_logsumexp(f, -1) + offset).sum(),
        "log_softmax": lambda f: diagonal_log_softmax(f, offset).sum(),
    }


def benchmark(num: int, spread: float, repeats: int) -> dict[str, float]:
    logits = (spread * (2 * torch.rand(num, num) - 1)).requires_grad_()
    steps = methods(num)
    values = {name: fn(logits).item() for name, fn in steps.items()}
    reference = values["cross_entropy"]
    for name, value in values.items():  # the three compute the same number
        assert abs(value - reference) <= 1e-4 * max(1.0, abs(reference)), (name, value, reference)
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(3):
        for fn in steps.values():
            fn(logits).backward()
    for _ in range(repeats):
        for name, fn in steps.items():
            start = time.process_time()
            fn(logits).backward()
            times[name].append(time.process_time() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    print(f"threads={torch.get_num_threads()} clock=cpu (forward + backward, median)")
    names = list(methods(2))
    print(f"{'N':>6} {'spread':>7} " + " ".join(f"{n + ' us':>18}" for n in names)
          + " " + " ".join(f"{n + '/ce':>18}" for n in names[1:]))
    for num in args.sizes:
        for spread in args.spreads:
            r = benchmark(num, spread, args.repeats)
            print(f"{num:>6} {spread:>7g} " + " ".join(f"{1e6 * r[n]:>18.1f}" for n in names)
                  + " " + " ".join(f"{r[n] / r['cross_entropy']:>18.2f}" for n in names[1:]))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``argv``: a list for tests, None for ``sys.argv``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 256, 512])
    parser.add_argument("--spreads", type=float, nargs="+", default=[1.0, 100.0, 1000.0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    return parser.parse_args(argv)


if __name__ == "__main__":
    main(parse_args())
