#!/usr/bin/env bash
# The fused Triton kernel of the mixture marginal (rpm.ops._gaussian_mixture.fused_gaussian_mixture_log_prob) on
# one CUDA device, float32 (TF32 off for the other paths' products), in at most TOTAL seconds
# (default 300) of wall time; every step has its own time limit and the script always finishes:
#
#   1. a smoke test: compile the three kernels, compare with float64, print their registers
#      (a compile error is printed, and the later steps then leave the fused path out);
#   2. pytest -m cuda of the fused kernel, and the CUDA marginal tests of tests/test_cuda.py
#      (gaussian_mixture_log_prob now dispatches to the fused kernel on CUDA);
#   3. benchmarks/marginal.py --device cuda, overlapping regime: D = 128 for N = 1024 ... 131072,
#      then D = 16 for N = 1024 ... 262144: fused vs broadcast vs the roofline (3 gemms), the
#      dense and streamed paths where cheap (streamed up to N = 65536);
#   4. the block shapes and warps of the kernels at N = 16384 (which to keep);
#   5. D = 128 at N = 262144, the fused kernel alone (its memory beyond the inputs).
#
# Usage: OUT=folder bash benchmarks/gpu_fused.sh   (installs nothing: Pyro must be importable).
# Logs and JSON go to $OUT: log.txt, pytest.txt, fused_d128.json, fused_d16.json,
# fused_262144.json.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu-fused}
TOTAL=${TOTAL:-300}
mkdir -p "$OUT"
unset TRITON_INTERPRET
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
LOG="$OUT/log.txt"
START=$SECONDS
say() { echo "### $(date +%T) +$((SECONDS - START))s $*" | tee -a "$LOG"; }
# step SECONDS COMMAND...: runs COMMAND with a limit of SECONDS, cut to what is left of TOTAL
# (less 10 s for the rest of the script); its output goes to $STEP_LOG (default the log);
# returns its status.
step() {
    local limit=$1 left log=${STEP_LOG:-$LOG}
    shift
    left=$((TOTAL - (SECONDS - START) - 10))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 10 ]; then
        say "skipped, no time left: $*"
        return 124
    fi
    timeout -k 5 "$limit" "$@" >> "$log" 2>&1
    local status=$?
    say "exit $status (limit ${limit}s)"
    return $status
}

say "device"
step 20 nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,driver_version --format=csv
step 30 python3 -c "import torch, triton, pyro; print('torch', torch.__version__, 'triton',
      triton.__version__, 'pyro', pyro.__version__, 'tf32 matmul',
      torch.backends.cuda.matmul.allow_tf32)"

say "1 smoke test of the fused kernel (compile, float64 check, registers)"
step 75 python3 - <<'EOF'
import math, time, traceback
import torch
import rpm.ops._triton_mixture as kernels
from rpm.ops._gaussian_mixture import fused_gaussian_mixture_log_prob

torch.manual_seed(0)
ok = True  # D = 16 and 128 decide whether the benchmarks include the fused kernel
for num, dim, exclude_self in ((1000, 16, True), (777, 128, False), (300, 1, False)):
    z, loc = torch.randn(num, dim, device="cuda"), torch.randn(num, dim, device="cuda")
    scale = 0.5 + torch.rand(num, dim, device="cuda")
    try:
        start = time.perf_counter()
        leaves = [t.clone().requires_grad_() for t in (z, loc, scale)]
        fused_gaussian_mixture_log_prob(*leaves, exclude_self).sum().backward()
        torch.cuda.synchronize()
        first = time.perf_counter() - start
        exact = [t.double().requires_grad_() for t in (z, loc, scale)]
        diff = exact[0][:, None] - exact[1][None]
        values = (-exact[2].log().sum(-1) - 0.5 * dim * math.log(2 * math.pi)
                  - 0.5 * (diff / exact[2][None]).square().sum(-1))
        if exclude_self:
            values = values.masked_fill(torch.eye(num, dtype=torch.bool, device="cuda"),
                                        -float("inf"))
        want = torch.logsumexp(values, 1) - math.log(num - 1 if exclude_self else num)
        want.sum().backward()
        got = fused_gaussian_mixture_log_prob(*leaves, exclude_self).detach().double()
        grads = [((a.grad.double() - b.grad).abs().max() / b.grad.abs().max()).item()
                 for a, b in zip(leaves, exact)]
        print(f"N={num} D={dim} exclude_self={exclude_self}: first call {first:.1f} s, value "
              f"error {(got - want.detach()).abs().max().item():.1e}, gradient errors "
              + " ".join(f"{g:.1e}" for g in grads), flush=True)
    except Exception:
        ok = ok and dim == 1
        traceback.print_exc()
for kernel in (kernels._forward_kernel, kernels._grad_points_kernel,
               kernels._grad_components_kernel):
    try:
        for cache in kernel.device_caches.values():
            for compiled in cache[0].values():
                print(kernel.fn.__name__, "registers", compiled.n_regs, "spills",
                      compiled.n_spills, flush=True)
    except Exception as error:
        print("no register report:", type(error).__name__, error)
raise SystemExit(0 if ok else 1)
EOF
SMOKE=$?
METHODS=broadcast,dense,streaming,fused
if [ "$SMOKE" -ne 0 ]; then
    say "the fused kernel failed (above): the benchmarks run without it"
    METHODS=broadcast,dense,streaming
fi

say "2 pytest -m cuda (fused kernel; CUDA marginal tests)"
PER_TEST=""
python3 -c "import pytest_timeout" 2> /dev/null && PER_TEST="--timeout 60"
STEP_LOG="$OUT/pytest.txt" step 80 python3 -m pytest -m cuda -q -p no:cacheprovider -rs \
    $PER_TEST --durations 5 tests/ops/test_triton_mixture.py tests/test_cuda.py \
    -k "triton or fused or mixture_marginal"
tail -25 "$OUT/pytest.txt" | tee -a "$LOG"

BENCH="python3 benchmarks/marginal.py --device cuda --regimes overlapping --no-info-nce
       --memory-budget 100 --repeats 2 --streaming-max-n 65536 --methods $METHODS"
say "3a marginal D = 128, N = 1024 ... 131072"
step 75 $BENCH --dims 128 --max-n 131072 --max-check-n 4096 --json "$OUT/fused_d128.json"
say "3b marginal D = 16, N = 1024 ... 262144"
step 55 $BENCH --dims 16 --max-check-n 8192 --json "$OUT/fused_d16.json"

if [ "$SMOKE" -eq 0 ]; then
    say "4 block shapes and warps, N = 16384 (fwd + bwd ms, fwd ms, 3 gemms ms)"
    step 45 python3 - <<'EOF'
import torch
import rpm.ops._triton_mixture as kernels
from rpm.ops._gaussian_mixture import fused_gaussian_mixture_log_prob

def best(fn, repeats=3):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    return min(times)

num = 16384
for dim in (16, 128):
    leaves = [torch.randn(num, dim, device="cuda").requires_grad_() for _ in range(2)]
    leaves.append((0.5 + torch.rand(num, dim, device="cuda")).requires_grad_())
    a, b = torch.randn(num, 2 * dim, device="cuda"), torch.randn(num, 2 * dim, device="cuda")

    def gemms():
        logits = a @ b.T
        logits @ b
        logits.T @ a

    torch.backends.cuda.matmul.allow_tf32 = False
    roofline = best(gemms)
    first = None
    for config in ((64, 64, 4, 1), (64, 64, 8, 1), (128, 64, 8, 1), (64, 128, 8, 1),
                   (128, 128, 8, 1), (64, 64, 4, 2)):
        kernels.BLOCK_M, kernels.BLOCK_N, kernels.NUM_WARPS, kernels.NUM_STAGES = config
        try:
            values = fused_gaussian_mixture_log_prob(*leaves)
            grads = torch.autograd.grad(values.sum(), leaves)
            if first is None:
                first = values, grads
            # the same numbers as the first configuration (a race would show here)
            change = max([(values - first[0]).abs().max().item()]
                         + [((g - f).abs().max() / f.abs().max()).item()
                            for g, f in zip(grads, first[1])])
            both = best(lambda: fused_gaussian_mixture_log_prob(*leaves).sum().backward())
            with torch.no_grad():
                forward = best(lambda: fused_gaussian_mixture_log_prob(*leaves))
            print(f"D={dim} BM,BN,warps,stages={config}: fwd+bwd {both:.2f} ms, fwd "
                  f"{forward:.2f} ms, 3 gemms {roofline:.2f} ms, ratio {both / roofline:.2f}, "
                  f"largest change from the first {change:.1e}", flush=True)
        except Exception as error:
            print(f"D={dim} {config}: {type(error).__name__}: {str(error)[:300]}", flush=True)
EOF
fi

if [ "$SMOKE" -eq 0 ]; then
    say "5 marginal D = 128, N = 262144, fused alone"
    step 60 python3 benchmarks/marginal.py --device cuda --regimes overlapping --no-info-nce \
        --memory-budget 100 --repeats 1 --methods fused --dims 128 --min-n 262144 \
        --json "$OUT/fused_262144.json"
fi
say "done"
