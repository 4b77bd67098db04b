r"""Benchmark of the two O(N^2) parts of an RPM step, forward + backward, in one run.

1. The minibatch-mixture marginal :math:`\log Q(z_m) = \mathrm{LSE}_n \log \mathcal N(z_m;
   \mu_n, \sigma_n^2) - \log N` (Eq. 11 of Aitchison & Ganev), as

   * ``broadcast``: ``Normal(loc[None], scale[None]).log_prob(z[:, None]).sum(-1)``, then
     ``logsumexp`` (the usual implementation; N x N x D memory), where it fits the budget;
   * ``matmul``: :func:`rpm.ops.gaussian_mixture_log_prob`'s dense matrix-product path
     (N x N memory);
   * ``streaming``: :func:`rpm.ops.streaming_gaussian_mixture_log_prob` (blocks, O(N D));
   * ``3 gemms``: the roofline, three float32 products of the mixture's shape
     (N x 2D) (2D x N), (N x N) (N x 2D), (N x N)^T (N x 2D): one forward and two backward
     products, with nothing else.

2. The InfoNCE normaliser :math:`\log \sum_j e^{f(z_i, z'_j)}` of a bilinear/cosine critic, as
   ``cross_entropy``: ``cross_entropy(z1 @ z2.T / tau, arange(N))`` (N x N memory) against
   ``streaming``: :func:`rpm.ops.streaming_matmul_logsumexp` (O(N D)), and ``3 gemms``
   with K = D.

Times are the minimum over ``--repeats`` runs after one warm-up; peak memory is what the call
allocates beyond its inputs (CUDA: the caching allocator's peak; CPU on Linux: the peak
resident set size, reset with /proc/self/clear_refs, after ``malloc_trim``). Data: locations
N(0, I), scales ``--scale`` x U(0.5, 1.5), each point drawn from its own component, float32.

Example: ``python benchmarks/marginal.py --device cpu --max-n 8192 --dims 16,64,128``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import platform
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.distributions import Normal

import rpm.ops.gaussian_mixture as gaussian_mixture
from rpm.marginals import streaming_gaussian_mixture_log_prob, streaming_matmul_logsumexp

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


@contextlib.contextmanager
def dense_mixture_path():
    """Forces gaussian_mixture_log_prob onto its dense matrix-product path at every size."""
    threshold = gaussian_mixture._STREAMING_MIN_PAIRS
    gaussian_mixture._STREAMING_MIN_PAIRS = math.inf
    try:
        yield
    finally:
        gaussian_mixture._STREAMING_MIN_PAIRS = threshold


@contextlib.contextmanager
def ieee_float32():
    allow_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32


# ----------------------------------------------------------------------------- the methods
def mixture_data(num: int, dim: int, scale: float, device: torch.device, seed: int):
    generator = torch.Generator(device="cpu").manual_seed(seed)
    loc = torch.randn(num, dim, generator=generator)
    sigma = scale * (0.5 + torch.rand(num, dim, generator=generator))
    z = loc + sigma * torch.randn(num, dim, generator=generator)
    return [t.to(device).requires_grad_() for t in (z, loc, sigma)]


def broadcast_mixture(z, loc, scale):
    log_components = Normal(loc[None], scale[None]).log_prob(z[:, None]).sum(-1)  # (M, N)
    return torch.logsumexp(log_components, dim=-1) - math.log(loc.shape[0])


def matmul_mixture(z, loc, scale):
    with dense_mixture_path():
        return gaussian_mixture.gaussian_mixture_log_prob(z, loc, scale)


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
def measure(make, device, repeats, budget, estimate) -> dict:
    """Times one method (fwd + bwd) and measures its peak memory; skipped above the budget."""
    if estimate is not None and estimate > budget:
        return {"skipped": f"needs ~{estimate / GIB:.1f} GiB > budget"}
    try:
        fn = make()
        seconds = best_time(fn, device, repeats)
        memory = peak_memory(fn, device)
    except torch.OutOfMemoryError:
        return {"skipped": "out of memory"}
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


def bench_size(num: int, dim: int, device: torch.device, args) -> tuple[dict, dict]:
    """All methods of both parts at one (N, D); returns ({method: row}, {method: row})."""
    budget = memory_budget(device, args)
    element = 4 * num * num  # bytes of one float32 N x N matrix
    inputs = mixture_data(num, dim, args.scale, device, args.seed)

    def streaming(*tensors):
        return streaming_gaussian_mixture_log_prob(*tensors, block_size=args.block_size)

    mixture = {}
    for name, make, estimate in (
        ("broadcast", lambda: fwd_bwd(broadcast_mixture, inputs), 6 * element * dim),
        ("matmul", lambda: fwd_bwd(matmul_mixture, inputs), 12 * element),
        ("streaming", lambda: fwd_bwd(streaming, inputs), None),
        ("3 gemms", lambda: three_gemms(num, 2 * dim, device), 2 * element),
    ):
        mixture[name] = measure(make, device, args.repeats, budget, estimate)
    z1, z2 = (F.normalize(t.detach(), dim=-1).requires_grad_() for t in inputs[:2])

    def cross_entropy(a, b):
        return info_nce_cross_entropy(a, b, 0.1)

    def streamed(a, b):
        return info_nce_streaming(a, b, 0.1, args.block_size)

    info_nce = {}
    for name, make, estimate in (
        ("cross_entropy", lambda: fwd_bwd(cross_entropy, [z1, z2]), 4 * element),
        ("streaming", lambda: fwd_bwd(streamed, [z1, z2]), None),
        ("3 gemms", lambda: three_gemms(num, dim, device), 2 * element),
    ):
        info_nce[name] = measure(make, device, args.repeats, budget, estimate)
    return mixture, info_nce


def run_device(device: torch.device, args) -> dict:
    sizes = [n for n in (1 << k for k in range(6, 19)) if args.min_n <= n <= args.max_n]
    results = {"mixture": {}, "info_nce": {}}
    for dim in args.dims:
        for num in sizes:
            key = f"N={num} D={dim}"
            results["mixture"][key], results["info_nce"][key] = bench_size(num, dim, device, args)
            print_rows(device, key, results)
    return results


def _fmt(entry: dict, field: str, spec: str) -> str:
    value = entry.get(field)
    if "skipped" in entry:
        return "-"
    return "n/a" if value is None else format(value, spec)


def print_rows(device, key, results) -> None:
    for part, reference in (("mixture", "streaming"), ("info_nce", "streaming")):
        rows = results[part][key]
        ref = rows.get(reference, {})
        line = [f"{device.type:4s} {part:8s} {key:16s}"]
        for name, entry in rows.items():
            text = f"{name}: {_fmt(entry, 'ms', '.1f')} ms / {_fmt(entry, 'peak_mb', '.0f')} MB"
            if "ms" in entry and "ms" in ref and name != reference:
                text += f" (x{entry['ms'] / ref['ms']:.2f} time"
                if entry.get("peak_mb") and ref.get("peak_mb"):
                    text += f", x{entry['peak_mb'] / max(ref['peak_mb'], 1e-3):.0f} memory"
                text += ")"
            if "skipped" in entry:
                text = f"{name}: skipped ({entry['skipped']})"
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
    report = {"torch": torch.__version__, "scale": args.scale, "block_size": args.block_size,
              "devices": {}}
    with ieee_float32():
        for device in devices:
            print(f"# {device.type}: {machine_name(device)}, torch {torch.__version__}",
                  flush=True)
            report["devices"][device.type] = {
                "machine": machine_name(device), "results": run_device(device, args)
            }
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=1)
    return report


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda", "all"), default="all",
                        help="cpu, cuda, or all available (default)")
    parser.add_argument("--min-n", type=int, default=1024)
    parser.add_argument("--max-n", type=int, default=262144)
    parser.add_argument("--dims", type=lambda s: [int(d) for d in s.split(",")],
                        default=[16, 128], help="comma-separated latent dimensions")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scale", type=float, default=0.3,
                        help="component scales are scale * U(0.5, 1.5); locations N(0, I)")
    parser.add_argument("--block-size", type=int, default=None,
                        help="block edge of the streamed kernels (default: per device)")
    parser.add_argument("--memory-budget", type=float, default=None,
                        help="GiB; methods whose estimated memory exceeds it are skipped "
                             "(default: 8 on the CPU, 1.5 x the device memory on CUDA)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write the results to this JSON file")
    return parser.parse_args(argv)


if __name__ == "__main__":
    main(parse_args())
