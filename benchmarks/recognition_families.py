r"""Time and memory of the minibatch-mixture marginal for recognition families beyond Normal and
Delta: the generic blocked path over a family's ``log_prob``
(:func:`rpm.ops.distribution_mixture_log_prob`) against the obvious N x N x D broadcast, and
against the Gaussian kernel as the fast path it cannot match.

Methods, forward plus backward of :math:`\sum_m \log Q(z_m)`, Eq. 11 of Aitchison & Ganev:

* ``broadcast``: ``q.log_prob(z[:, None])`` then ``logsumexp`` (an N x N x D temporary, kept
  for the backward pass);
* ``generic``: :func:`rpm.ops.distribution_mixture_log_prob`, row blocks of at most 2^22
  elements, checkpointed (recomputed in the backward pass);
* ``gaussian kernel``: :func:`rpm.ops.gaussian_mixture_log_prob` on Normal components of the
  same shape (matrix products, streamed above 2^18 pairs): the fast path of the Normal family.

Families: ``studentt`` (``StudentT(4, loc, scale).to_event(1)``), ``normal`` (the generic path
on ``Normal(loc, scale).to_event(1)``, to compare with the Gaussian kernel on the same
distribution), ``sphere`` (``ProjectedNormal``, D = 3 only: Pyro implements its density for
D = 2, 3, 4). Times are the best of ``--repeats`` after a warm-up; memory is the call's peak
beyond its inputs (CUDA: the allocator's peak; CPU: the peak resident set size), with the
helpers of ``benchmarks/marginal.py``. Ratios are within one run, so they hold on a busy
machine.

    python benchmarks/recognition_families.py --threads 1 --sizes 1024 2048 --dim 64
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch
from pyro.distributions import Normal, ProjectedNormal, StudentT

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from marginal import best_time, peak_memory  # noqa: E402  (benchmarks/ is not a package)

import rpm.ops._distribution_mixture as generic_path  # noqa: E402
from rpm.ops import distribution_mixture_log_prob, gaussian_mixture_log_prob  # noqa: E402


def make_family(name: str, num: int, dim: int, device: torch.device):
    """(a function of the parameters returning the distribution, the parameters, the points)."""
    generator = torch.Generator().manual_seed(0)
    loc = torch.randn(num, dim, generator=generator).to(device)
    scale = (0.5 + torch.rand(num, dim, generator=generator)).to(device)
    z = (loc + torch.randn(num, dim, generator=generator).to(device) * scale)
    if name == "studentt":
        return (lambda loc, scale: StudentT(4.0, loc, scale).to_event(1)), (loc, scale), z
    if name == "normal":
        return (lambda loc, scale: Normal(loc, scale).to_event(1)), (loc, scale), z
    if name == "sphere":
        concentration = 3.0 * loc
        return (lambda c: ProjectedNormal(c)), (concentration,), ProjectedNormal(
            concentration).sample()
    raise ValueError(f"unknown family {name!r}")


def forward_backward(method: str, build, params, z):
    params = [p.detach().clone().requires_grad_() for p in params]
    z = z.detach().clone().requires_grad_()

    def run():
        q = build(*params)
        if method == "broadcast":
            value = torch.logsumexp(q.log_prob(z[:, None]), -1) - math.log(z.shape[0])
        elif method == "generic":
            value = distribution_mixture_log_prob(q, z)
        else:  # the Gaussian kernel on the same locations and scales
            value = gaussian_mixture_log_prob(z, params[0], params[1])
        value.sum().backward()
    return run


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.block_elements is not None:
        generic_path._BLOCK_ELEMENTS = args.block_elements
    print(f"device {device}, threads {torch.get_num_threads()}, float32, load "
          f"{os.getloadavg()[0]:.1f}, generic blocks of at most "
          f"{generic_path._BLOCK_ELEMENTS} elements")
    print("| family | N | D | broadcast ms / MB | generic ms / MB | gaussian kernel ms / MB | "
          "generic vs broadcast (time, memory) |")
    print("|---|---|---|---|---|---|---|")
    for family in args.families:
        dim = 3 if family == "sphere" else args.dim
        for num in args.sizes:
            build, params, z = make_family(family, num, dim, device)
            row = {}
            methods = ["broadcast", "generic"] + (["gaussian"] if family == "normal" else [])
            for method in methods:
                if method == "broadcast" and num * num * dim * 4 * 3 > args.broadcast_budget * 2**30:
                    row[method] = None
                    continue
                run = forward_backward(method, build, params, z)
                seconds = best_time(run, device, args.repeats)
                memory = peak_memory(run, device)
                row[method] = (1e3 * seconds, None if memory is None else memory / 2**20)

            def cell(entry):
                if entry is None:
                    return "skipped"
                return f"{entry[0]:.0f} / " + ("?" if entry[1] is None else f"{entry[1]:.0f}")

            ratio = "n/a"
            if row.get("broadcast") and row["generic"][1]:
                ratio = (f"{row['broadcast'][0] / row['generic'][0]:.2f}x, "
                         f"{row['broadcast'][1] / max(row['generic'][1], 1e-9):.1f}x less")
            print(f"| {family} | {num} | {dim} | {cell(row.get('broadcast'))} | "
                  f"{cell(row['generic'])} | {cell(row.get('gaussian'))} | {ratio} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--families", nargs="+", default=["studentt", "normal", "sphere"],
                        choices=["studentt", "normal", "sphere"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--block-elements", type=int, default=None,
                        help="override the generic path's block budget (elements per block)")
    parser.add_argument("--broadcast-budget", type=float, default=4.0,
                        help="GiB; the broadcast is skipped above it")
    main(parser.parse_args())
