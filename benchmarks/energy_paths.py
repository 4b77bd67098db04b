"""Time and memory of the implicit prior's InfoNCE term on its three paths (rpm.priors._energy_paths).

For one batch of N pairs, forward plus backward of ``ImplicitPrior(energy).log_ratio(z, z2).sum()``
in float32:

* ``factorised``: ``RBFEnergy``, streamed through its matrix-product factors
  (``streaming_matmul_logsumexp``, O((N + M) D) memory);
* ``generic``: a subclass that overrides ``forward`` only (``3 * RBF``), so the factors are
  ignored and ``forward`` runs on checkpointed tiles of ``--block-size`` rows and columns
  (O(N M / block) memory plus one tile);
* ``dense``: the same subclass's full (N, N) matrix, ``diagonal_log_softmax(energy(z, z2), log N)``, the
  baseline (what the ELBO computes below 2**18 pairs).

Every path runs in one process on the same data, so the ratios are comparable on a noisy
machine. Memory: the peak resident set size beyond the inputs (see benchmarks/marginal.py).

```
python benchmarks/energy_paths.py --threads 1 --sizes 2048 8192
```
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from marginal import best_time, peak_memory  # noqa: E402

from rpm.ops._logsumexp import diagonal_log_softmax  # noqa: E402
from rpm.priors import ImplicitPrior, RBFEnergy  # noqa: E402


class ScaledRBF(RBFEnergy):
    """f = 3 x the RBF energy, written as a user would: ``forward`` overridden, nothing else."""

    def forward(self, z, z2):
        return 3 * super().forward(z, z2)


def paths(size: int, dim: int, block_size: int | None):
    """The three steps (forward + backward) on one batch of ``size`` pairs."""
    generator = torch.Generator().manual_seed(0)
    z = torch.randn(size, dim, generator=generator).requires_grad_()
    z2 = (z.detach() + 0.3 * torch.randn(size, dim, generator=generator)).requires_grad_()
    factorised = ImplicitPrior(RBFEnergy(3.0 ** -0.5, learn_lengthscale=False))
    generic = ImplicitPrior(ScaledRBF(1.0, learn_lengthscale=False))
    dense_energy = ScaledRBF(1.0, learn_lengthscale=False)

    def run(fn):
        def step():
            z.grad = z2.grad = None
            fn().sum().backward()
        return step

    return {
        "factorised": run(lambda: factorised.log_ratio(z, z2, block_size=block_size)),
        "generic": run(lambda: generic.log_ratio(z, z2, block_size=block_size)),
        "dense": run(lambda: diagonal_log_softmax(dense_energy(z, z2), math.log(z.shape[0]))),
    }


def main(args: argparse.Namespace) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"threads={torch.get_num_threads()} dim={args.dim} block_size={args.block_size}")
    names = ("factorised", "generic", "dense")
    print(f"{'N':>7} " + " ".join(f"{n + ' ms':>14} {n + ' MB':>14}" for n in names)
          + f" {'generic/fact. time':>19} {'dense/generic mem':>18}")
    device = torch.device("cpu")
    for size in args.sizes:
        steps = paths(size, args.dim, args.block_size)
        times, memory = {}, {}
        for name in names:
            memory[name] = peak_memory(steps[name], device) / 2**20
            times[name] = best_time(steps[name], device, args.repeats) * 1e3
        print(f"{size:>7} " + " ".join(f"{times[n]:>14.1f} {memory[n]:>14.1f}" for n in names)
              + f" {times['generic'] / times['factorised']:>19.2f}"
              + f" {memory['dense'] / max(memory['generic'], 1.0):>18.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--block-size", type=int, default=None,
                        help="tile edge (default: rpm's, 1024 on the CPU; N > 512 streams)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    main(parser.parse_args())
