r"""Benchmark of the two O(N^2) parts of an RPM step, forward + backward, in one run.

1. The minibatch-mixture marginal :math:`\log Q(z_m) = \mathrm{LSE}_n \log \mathcal N(z_m;
   \mu_n, \sigma_n^2) - \log N` (Eq. 11 of Aitchison & Ganev), as

   * ``broadcast``: ``Normal(loc[None], scale[None]).log_prob(z[:, None]).sum(-1)``, then
     ``logsumexp`` (the obvious implementation: an N x N x D difference tensor), where it fits
     the memory budget;
   * ``dense``: :func:`rpm.ops._gaussian_mixture.dense_gaussian_mixture_log_prob`, the dense
     matrix-product path of :func:`rpm.ops.gaussian_mixture_log_prob` (N x N memory);
   * ``streaming``: :func:`rpm.ops._streaming.streaming_gaussian_mixture_log_prob` (blocks, O(N D));
   * ``fused``: :func:`rpm.ops._gaussian_mixture.fused_gaussian_mixture_log_prob`, the Triton
     kernels (CUDA, or the CPU under ``TRITON_INTERPRET=1``; O(N D));
   * ``3 gemms``: the roofline, three float32 products of the mixture's shape
     (N x 2D) (2D x N), (N x N) (N x 2D), (N x N)^T (N x 2D), with nothing else;

   in three data regimes (float32; ``--regimes``):

   * ``overlapping``: locations and points independent N(0, I_D), scales U(0.5, 1.5) (the
     usual situation of a marginal during training: most pairs near their row maximum);
   * ``separated``: locations N(0, I_D), scales 0.3 x U(0.5, 1.5), point m drawn from
     component m (each row dominated by its own component);
   * ``tight``: 8 cluster centres at distance 1e3 from the origin (uniform directions),
     component n in cluster n mod 8 with location centre + 1e-2 N(0, I_D), scales
     1e-2 x U(0.5, 1.5), point m drawn from component m (|z| ~ 1e3: around a single centre
     the float32 expansion of the quadratic form cancels catastrophically).

   Values and gradients (of the sum, with respect to z, loc and scale) are compared with
   float64: the broadcast in float64 over checkpointed row chunks (its memory is one chunk),
   up to ``--max-check-n``. ``value err`` is the largest absolute error of log Q(z_m);
   ``grad err`` the largest absolute error of a gradient relative to that gradient's largest
   entry; ``x broadcast`` the broadcast's time over the method's and ``x 3 gemms`` the
   method's time over the roofline's (the JSON's ``x_broadcast``, ``x_roofline``), measured in
   the same run. ``--methods`` picks the methods (the roofline always runs) and
   ``--streaming-max-n`` leaves the streamed kernel out above a size.

2. The InfoNCE normaliser :math:`\log \sum_j e^{f(z_i, z'_j)}` of a bilinear/cosine critic, as
   ``cross_entropy``: ``cross_entropy(z1 @ z2.T / tau, arange(N))`` (N x N memory) against
   ``streaming``: :func:`rpm.ops.streaming_matmul_logsumexp` (O(N D)), and ``3 gemms`` with
   K = D (on the first regime's z and loc, normalised).

Times are the minimum over ``--repeats`` runs after one warm-up; peak memory is what the call
allocates beyond its inputs (CUDA: the caching allocator's peak; CPU on Linux: the peak
resident set size, reset with /proc/self/clear_refs, after ``malloc_trim``).

Examples: ``python benchmarks/marginal.py --device cpu --threads 1 --min-n 2048 --max-n 2048
--dims 64`` (the three-regime table of benchmarks/README.md); ``python benchmarks/marginal.py
--device cuda`` (N = 1024 ... 262144, D = 16 and 128); ``benchmarks/gpu_fused.sh`` (the fused
kernel on CUDA against the broadcast and the roofline).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.distributions import Normal
from torch.utils.checkpoint import checkpoint

from rpm.ops import streaming_matmul_logsumexp
from rpm.ops._dispatch import ieee_float32_matmul, triton_available
from rpm.ops._gaussian_mixture import (
    dense_gaussian_mixture_log_prob,
    fused_gaussian_mixture_log_prob,
)
from rpm.ops._streaming import streaming_gaussian_mixture_log_prob

GIB = 1 << 30


# ----------------------------------------------------------------------------- measurement
def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rss_status(key: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def _trim_heap() -> None:
    """Returns freed heap memory to the system, so that the peak RSS measures new use."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def peak_memory(fn: Callable[[], None], device: torch.device) -> int | None:
    """Bytes allocated by ``fn()`` at its peak, beyond what was allocated before."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    if not sys.platform.startswith("linux"):
        return None
    _trim_heap()
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # resets the peak resident set size to the current one
    base = _rss_status("VmRSS:")
    fn()
    return max(_rss_status("VmHWM:") - base, 0)


def best_time(fn: Callable[[], None], device: torch.device, repeats: int) -> float:
    """Minimum wall time of ``fn()`` in seconds over ``repeats`` runs, after one warm-up."""
    fn()
    _synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _synchronize(device)
        times.append(time.perf_counter() - start)
    return min(times)


# ----------------------------------------------------------------------------- the data
REGIMES = ("overlapping", "separated", "tight")
METHODS = ("broadcast", "dense", "streaming", "fused")
_CLUSTERS = 8


def mixture_data(regime: str, num: int, dim: int, device: torch.device, seed: int):
    """(z, loc, scale) of one regime (see the module docstring), float32 leaves on device."""
    generator = torch.Generator(device="cpu").manual_seed(seed)

    def normal(*shape):
        return torch.randn(*shape, generator=generator)

    def uniform(*shape):
        return 0.5 + torch.rand(*shape, generator=generator)

    if regime == "overlapping":
        loc, scale, z = normal(num, dim), uniform(num, dim), normal(num, dim)
    elif regime == "separated":
        loc, scale = normal(num, dim), 0.3 * uniform(num, dim)
        z = loc + scale * normal(num, dim)
    elif regime == "tight":
        centres = normal(_CLUSTERS, dim)
        centres = 1e3 * centres / centres.norm(dim=1, keepdim=True)
        loc = centres[torch.arange(num) % _CLUSTERS] + 1e-2 * normal(num, dim)
        scale = 1e-2 * uniform(num, dim)
        z = loc + scale * normal(num, dim)
    else:
        raise ValueError(f"unknown regime {regime!r}; choose from {', '.join(REGIMES)}")
    return [t.to(device).requires_grad_() for t in (z, loc, scale)]


# ----------------------------------------------------------------------------- the methods
def broadcast_mixture(z, loc, scale):
    log_components = Normal(loc[None], scale[None]).log_prob(z[:, None]).sum(-1)  # (M, N)
    return torch.logsumexp(log_components, dim=-1) - math.log(loc.shape[0])


def float64_reference(inputs, chunk: int = 32):
    """Values and gradients of the sum in float64: the broadcast over checkpointed row chunks."""
    leaves = [t.detach().double().requires_grad_() for t in inputs]
    z, loc, scale = leaves
    values = torch.cat([
        checkpoint(broadcast_mixture, z[s:s + chunk], loc, scale, use_reentrant=False)
        for s in range(0, z.shape[0], chunk)
    ])
    values.sum().backward()
    return values.detach(), [leaf.grad for leaf in leaves]


def errors(fn, inputs, reference) -> dict:
    """Largest value error and largest relative gradient error against the float64 reference."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    values = fn(*leaves)
    values.sum().backward()
    want_values, want_grads = reference
    grad_err = max(
        ((leaf.grad.double() - want).abs().max() / want.abs().max()).item()
        for leaf, want in zip(leaves, want_grads, strict=True)
    )
    return {"value_err": (values.detach().double() - want_values).abs().max().item(),
            "grad_err": grad_err}


def fwd_bwd(fn, inputs) -> Callable[[], None]:
    def run():
        for tensor in inputs:
            tensor.grad = None
        fn(*inputs).sum().backward()
        for tensor in inputs:
            tensor.grad = None

    return run


def three_gemms(num: int, inner: int, device: torch.device) -> Callable[[], None]:
    a = torch.randn(num, inner, device=device)
    b = torch.randn(num, inner, device=device)

    def run():
        logits = a @ b.T  # (N, N): forward
        logits @ b  # (N, K): gradient of the rows
        logits.T @ a  # (N, K): gradient of the columns

    return run


def info_nce_cross_entropy(z1, z2, tau: float):
    return F.cross_entropy(z1 @ z2.T / tau, torch.arange(z1.shape[0], device=z1.device))


def info_nce_streaming(z1, z2, tau: float, block_size: int | None):
    positive = (z1 * z2).sum(-1) / tau  # (N,)
    return (streaming_matmul_logsumexp(z1 / tau, z2, block_size) - positive).mean()


# ----------------------------------------------------------------------------- the run
def _failure(error: Exception) -> dict:
    """A row for a method that raised (printed in full: a kernel that fails to compile must
    not stop the other methods)."""
    traceback.print_exception(error, file=sys.stdout)
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return {"skipped": f"error {type(error).__name__}: {first[:200]}"}


def measure(make, device, repeats, budget, estimate, catch=False) -> dict:
    """Times one method (fwd + bwd) and measures its peak memory; skipped above the budget
    (and, with ``catch``, reported instead of raised when it fails)."""
    if estimate is not None and estimate > budget:
        return {"skipped": f"needs ~{estimate / GIB:.1f} GiB > budget"}
    try:
        fn = make()
        seconds = best_time(fn, device, repeats)
        memory = peak_memory(fn, device)
    except torch.OutOfMemoryError:
        return {"skipped": "out of memory"}
    except Exception as error:
        if not catch:
            raise
        return _failure(error)
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"ms": 1e3 * seconds, "peak_mb": None if memory is None else memory / 2**20}


def memory_budget(device: torch.device, args) -> float:
    """Bytes a method may be estimated to need before it is skipped.

    On the CPU the estimates must be safe (running out of memory kills the process); on CUDA
    they only skip hopeless sizes, and an out-of-memory error is caught and reported.
    """
    if args.memory_budget is not None:
        return args.memory_budget * GIB
    if device.type == "cuda":
        return 1.5 * torch.cuda.get_device_properties(device).total_memory
    return 8.0 * GIB


def fused_unavailable(device: torch.device) -> str | None:
    """Why the fused kernel cannot run on this device, or None."""
    if not triton_available():
        return "triton is not installed"
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return "needs CUDA (or TRITON_INTERPRET=1)"
    return None


def bench_mixture(regime: str, num: int, dim: int, device: torch.device, args) -> dict:
    """The mixture methods at one (regime, N, D): {method: row}."""
    budget = memory_budget(device, args)
    element = 4 * num * num  # bytes of one float32 N x N matrix
    inputs = mixture_data(regime, num, dim, device, args.seed)
    reference = float64_reference(inputs) if num <= args.max_check_n else None

    def streaming(*tensors):
        return streaming_gaussian_mixture_log_prob(*tensors, block_size=args.block_size)

    rows = {}
    for name, fn, estimate in (
        ("broadcast", broadcast_mixture, 6 * element * dim),
        ("dense", dense_gaussian_mixture_log_prob, 12 * element),
        ("streaming", streaming, None),
        ("fused", fused_gaussian_mixture_log_prob, None),
    ):
        if name not in args.methods:
            continue
        if name == "streaming" and args.streaming_max_n and num > args.streaming_max_n:
            rows[name] = {"skipped": f"N > --streaming-max-n {args.streaming_max_n}"}
            continue
        why = fused_unavailable(device) if name == "fused" else None
        if why is not None:
            rows[name] = {"skipped": why}
            continue
        catch = name == "fused"
        rows[name] = measure(lambda fn=fn: fwd_bwd(fn, inputs), device, args.repeats, budget,
                             estimate, catch)
        if reference is not None and "skipped" not in rows[name]:
            try:
                rows[name].update(errors(fn, inputs, reference))
            except Exception as error:
                if not catch:
                    raise
                rows[name] = _failure(error)
    rows["3 gemms"] = measure(lambda: three_gemms(num, 2 * dim, device), device, args.repeats,
                              budget, 2 * element)
    base = rows.get("broadcast", {}).get("ms")
    roofline = rows["3 gemms"].get("ms")
    for row in rows.values():
        if base is not None and "ms" in row:
            row["x_broadcast"] = base / row["ms"]
        if roofline is not None and "ms" in row:
            row["x_roofline"] = row["ms"] / roofline
    return rows


def bench_info_nce(num: int, dim: int, device: torch.device, args) -> dict:
    """The InfoNCE normaliser methods at one (N, D): {method: row}."""
    budget = memory_budget(device, args)
    element = 4 * num * num
    z, loc, _ = mixture_data(args.regimes[0], num, dim, device, args.seed)
    z1, z2 = (F.normalize(t.detach(), dim=-1).requires_grad_() for t in (z, loc))

    def cross_entropy(a, b):
        return info_nce_cross_entropy(a, b, 0.1)

    def streamed(a, b):
        return info_nce_streaming(a, b, 0.1, args.block_size)

    rows = {}
    for name, make, estimate in (
        ("cross_entropy", lambda: fwd_bwd(cross_entropy, [z1, z2]), 4 * element),
        ("streaming", lambda: fwd_bwd(streamed, [z1, z2]), None),
        ("3 gemms", lambda: three_gemms(num, dim, device), 2 * element),
    ):
        rows[name] = measure(make, device, args.repeats, budget, estimate)
    return rows


def run_device(device: torch.device, args, results: dict, save: Callable[[], None]) -> dict:
    """Fills ``results`` size by size, calling ``save()`` after each row (a run cut short by
    a time limit keeps what it measured)."""
    sizes = [n for n in (1 << k for k in range(6, 19)) if args.min_n <= n <= args.max_n]
    results.update({"mixture": {regime: {} for regime in args.regimes}, "info_nce": {}})
    for dim in args.dims:
        for num in sizes:
            key = f"N={num} D={dim}"
            for regime in args.regimes:
                rows = bench_mixture(regime, num, dim, device, args)
                results["mixture"][regime][key] = rows
                print_rows(device, f"mixture {regime}", key, rows, "broadcast")
                save()
            if args.info_nce:
                rows = bench_info_nce(num, dim, device, args)
                results["info_nce"][key] = rows
                print_rows(device, "info_nce", key, rows, "cross_entropy")
                save()
    return results


def _fmt(entry: dict, field: str, spec: str) -> str:
    value = entry.get(field)
    return "n/a" if value is None else format(value, spec)


def print_rows(device, part: str, key: str, rows: dict, reference: str) -> None:
    line = [f"{device.type:4s} {part:21s} {key:16s}"]
    ref = rows.get(reference, {})
    for name, entry in rows.items():
        if "skipped" in entry:
            line.append(f"{name}: skipped ({entry['skipped']})")
            continue
        text = f"{name}: {_fmt(entry, 'ms', '.1f')} ms / {_fmt(entry, 'peak_mb', '.0f')} MB"
        if name != reference and "ms" in ref:
            text += f" (x{ref['ms'] / entry['ms']:.1f} faster than {reference})"
        if name != "3 gemms" and "x_roofline" in entry:
            text += f" ({entry['x_roofline']:.2f}x 3 gemms)"
        if "value_err" in entry:
            text += f" err {entry['value_err']:.1e} / grad {entry['grad_err']:.1e}"
        line.append(text)
    print(" | ".join(line), flush=True)


def machine_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    return f"{model}, {torch.get_num_threads()} threads"


def main(args) -> dict:
    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = []
    if args.device in ("cpu", "all"):
        devices.append(torch.device("cpu"))
    if args.device in ("cuda", "all") and torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    report = {"torch": torch.__version__, "block_size": args.block_size,
              "regimes": list(args.regimes), "devices": {}}

    def save() -> None:
        if args.json:
            with open(args.json, "w") as out:
                json.dump(report, out, indent=1)

    with ieee_float32_matmul():
        for device in devices:
            print(f"# {device.type}: {machine_name(device)}, torch {torch.__version__}",
                  flush=True)
            results = {}
            report["devices"][device.type] = {"machine": machine_name(device),
                                              "results": results}
            run_device(device, args, results, save)
    save()
    return report


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda", "all"), default="all",
                        help="cpu, cuda, or all available (default)")
    parser.add_argument("--min-n", type=int, default=1024)
    parser.add_argument("--max-n", type=int, default=262144)
    parser.add_argument("--dims", type=lambda s: [int(d) for d in s.split(",")],
                        default=[16, 128], help="comma-separated latent dimensions")
    parser.add_argument("--regimes", type=lambda s: s.split(","), default=list(REGIMES),
                        help=f"comma-separated data regimes (default: {','.join(REGIMES)})")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-check-n", type=int, default=8192,
                        help="largest N whose errors are measured against float64")
    parser.add_argument("--methods", type=lambda s: s.split(","), default=list(METHODS),
                        help=f"comma-separated mixture methods (default: {','.join(METHODS)}; "
                             "the roofline always runs)")
    parser.add_argument("--streaming-max-n", type=int, default=0,
                        help="leave the streamed mixture kernel out above this N (0: never)")
    parser.add_argument("--no-info-nce", dest="info_nce", action="store_false",
                        help="skip the InfoNCE normaliser part")
    parser.add_argument("--block-size", type=int, default=None,
                        help="block edge of the streamed kernels (default: per device)")
    parser.add_argument("--memory-budget", type=float, default=None,
                        help="GiB; methods whose estimated memory exceeds it are skipped "
                             "(default: 8 on the CPU, 1.5 x the device memory on CUDA)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write the results to this JSON file")
    args = parser.parse_args(argv)
    unknown = set(args.regimes) - set(REGIMES)
    if unknown:
        parser.error(f"unknown regimes {sorted(unknown)}; choose from {', '.join(REGIMES)}")
    unknown = set(args.methods) - set(METHODS)
    if unknown:
        parser.error(f"unknown methods {sorted(unknown)}; choose from {', '.join(METHODS)}")
    return args


if __name__ == "__main__":
    main(parse_args())
