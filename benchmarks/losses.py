r"""The losses of :mod:`rpm.losses` against the same losses written in plain torch, in one run.

Each form of :class:`rpm.losses.NTXentLoss` and :class:`rpm.losses.InfoNCELoss`, forward +
backward on random outputs (N rows of dimension D, float32), against a reference written as the
peers write it (``F.normalize``, one logits matrix, ``F.cross_entropy``): SimCLR's NT-Xent,
MoCo's loss with a bank of K unit rows, SupCon's :math:`L_\text{out}` and :math:`L_\text{in}`
over J views, and info-nce-pytorch's InfoNCE without and with M unpaired negatives. Both sides
compute the same value (checked before timing, float32 tolerance).

Times are CPU seconds of this process (``time.process_time``), the median of ``3 * repeats``
calls timed in turn (so that the load of a shared machine affects both alike), after a warm-up;
``x torch`` is the package's time over the reference's.

Usage: ``PYTHONPATH=. python benchmarks/losses.py --threads 1`` (the header names the package
tree it imported).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

import rpm
from rpm.losses import InfoNCELoss, NTXentLoss


def _ntxent_reference(out0, out1, tau):
    """SimCLR's NT-Xent: the 2N x 2N cosine matrix, the diagonal masked, labels the partners."""
    n = out0.shape[0]
    u = F.normalize(torch.cat([out0, out1]), dim=1)
    logits = (u @ u.T / tau).fill_diagonal_(float("-inf"))
    labels = torch.cat([torch.arange(n, 2 * n), torch.arange(n)])
    return F.cross_entropy(logits, labels)


def _moco_reference(out0, out1, bank, tau):
    """MoCo's loss (lightly's with a memory bank): the positive among itself and the K rows."""
    z, z2 = F.normalize(out0, dim=1), F.normalize(out1, dim=1)
    logits = torch.cat([(z * z2).sum(1, keepdim=True), z @ bank.T], dim=1) / tau
    return F.cross_entropy(logits, torch.zeros(len(z), dtype=torch.long))


def _supcon_reference(views, tau, form):
    """SupCon's L_out (``"out"``) or L_in (``"in"``), pooled candidates: every one of the N J
    outputs an anchor, its positives the J - 1 other views of its image."""
    num, num_views = views[0].shape[0], len(views)
    u = F.normalize(torch.cat(views), dim=1)                       # view-major (J N, D)
    logits = (u @ u.T / tau).fill_diagonal_(float("-inf"))
    log_softmax = logits.log_softmax(dim=1)
    image = torch.arange(num).repeat(num_views)
    positives = (image[:, None] == image[None, :]).fill_diagonal_(False)
    if form == "out":
        return -log_softmax[positives].mean()
    return -log_softmax.masked_fill(~positives, float("-inf")).logsumexp(dim=1).mean()


def _info_nce_reference(query, key, negatives, tau):
    """info-nce-pytorch's InfoNCE: unpaired negatives or, without them, the batch's keys."""
    q, k = F.normalize(query, dim=1), F.normalize(key, dim=1)
    if negatives is None:
        return F.cross_entropy(q @ k.T / tau, torch.arange(len(q)))
    n = F.normalize(negatives, dim=1)
    logits = torch.cat([(q * k).sum(1, keepdim=True), q @ n.T], dim=1) / tau
    return F.cross_entropy(logits, torch.zeros(len(q), dtype=torch.long))


def forms(num: int, dim: int, num_views: int, bank_size: int) -> dict[str, tuple]:
    """``{form: (package loss, reference loss, inputs)}``, each loss a function of the inputs."""
    generator = torch.Generator().manual_seed(0)

    def outputs(count):
        return [torch.randn(num, dim, generator=generator).requires_grad_(True)
                for _ in range(count)]

    moco = NTXentLoss(0.2, memory_bank_size=(bank_size, dim)).float()  # a float32 bank
    moco.eval()  # the bank is read, not written: every timed call sees the same K rows
    bank = moco.bank.latents().clone()
    negatives = torch.randn(bank_size, dim, generator=generator).requires_grad_(True)
    rows = {
        "ntxent": (NTXentLoss(0.5), lambda a, b: _ntxent_reference(a, b, 0.5), outputs(2)),
        "ntxent bank": (lambda a, b: moco(a, b.detach()),
                        lambda a, b: _moco_reference(a, b.detach(), bank, 0.2), outputs(2)),
        f"ntxent J={num_views} out": (NTXentLoss(0.5, form="out"),
                                      lambda *v: _supcon_reference(v, 0.5, "out"),
                                      outputs(num_views)),
        f"ntxent J={num_views} in": (NTXentLoss(0.5, form="in"),
                                     lambda *v: _supcon_reference(v, 0.5, "in"),
                                     outputs(num_views)),
        "infonce": (InfoNCELoss(0.1), lambda a, b: _info_nce_reference(a, b, None, 0.1),
                    outputs(2)),
        "infonce negatives": (lambda a, b: InfoNCELoss(0.1)(a, b, negatives),
                              lambda a, b: _info_nce_reference(a, b, negatives, 0.1), outputs(2)),
    }
    return rows


def _step(loss, inputs):
    def step():
        value = loss(*inputs)
        value.backward()
        return value

    return step


def measure(num: int, dim: int, num_views: int, bank_size: int, warmup: int,
            repeats: int) -> dict[str, tuple[float, float]]:
    """``{form: (package seconds, reference seconds)}`` per forward + backward, after checking
    that both give one value."""
    results = {}
    for name, (loss, reference, inputs) in forms(num, dim, num_views, bank_size).items():
        with torch.no_grad():
            got, expected = float(loss(*inputs)), float(reference(*inputs))
        if abs(got - expected) > 1e-4 * max(1.0, abs(expected)):
            raise AssertionError(f"{name}: rpm.losses gives {got}, the torch reference {expected}")
        steps = {"rpm": _step(loss, inputs), "torch": _step(reference, inputs)}
        for step in steps.values():
            for _ in range(warmup):
                step()
        times: dict[str, list[float]] = {key: [] for key in steps}
        for _ in range(3 * repeats):
            for key, step in steps.items():
                start = time.process_time()
                step()
                times[key].append(time.process_time() - start)
        results[name] = (statistics.median(times["rpm"]), statistics.median(times["torch"]))
    return results


def main(args: argparse.Namespace) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    load = os.getloadavg()
    print(f"threads={torch.get_num_threads()} clock=cpu load average {load[0]:.2f} {load[1]:.2f} "
          f"{load[2]:.2f}; D={args.dim}, J={args.views}, K=M={args.bank}; rpm from "
          f"{os.path.dirname(rpm.__file__)}")
    print(f"{'N':>5} {'form':>18} {'rpm ms':>9} {'torch ms':>9} {'x torch':>8}")
    for num in args.sizes:
        for name, (mine, theirs) in measure(num, args.dim, args.views, args.bank, args.warmup,
                                            args.repeats).items():
            print(f"{num:>5} {name:>18} {1e3 * mine:9.3f} {1e3 * theirs:9.3f} "
                  f"{mine / theirs:7.2f}x")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``argv``: a list for tests, None for ``sys.argv``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 512], help="N")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--views", type=int, default=4, help="J of the SupCon forms")
    parser.add_argument("--bank", type=int, default=4096,
                        help="K (the memory bank) and M (InfoNCE's negatives)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: default)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    main(parse_args())
