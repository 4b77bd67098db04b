#!/usr/bin/env bash
# The GPU measurements of benchmarks/README.md ("GPU") in one call, on one CUDA device, float32
# with TF32 off (torch's default for matrix products; the marginal benchmark also sets it):
#
#   A. alone on the device, for clean timings:
#      1. benchmarks/step_overhead.py at batch 256 and 6144 (with the generic path, SVI's floor
#         and a profile of the two RPM steps);
#      2. benchmarks/marginal.py, N = 1024 ... 262144, D = 16 and 128 (overlapping regime, with
#         the InfoNCE normaliser), then the separated and tight regimes up to N = 8192;
#   B. together: pytest -m cuda, and the identifiability runs at a wall-clock budget
#      (benchmarks/identifiability.py --time-budget): sphere / vMF(1) / cosine at batch 1024 and
#      4096, box / Laplace(0.05) / L1 at batch 4096.
#
# Usage: OUT=folder bash benchmarks/gpu.sh [BUDGET_SECONDS]  (default 220). Logs and JSON go to
# $OUT (seven files); run folders to $RUNS (default /tmp/rpm-gpu-runs).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu}
RUNS=${RUNS:-/tmp/rpm-gpu-runs}
BUDGET=${1:-220}
mkdir -p "$OUT" "$RUNS"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
LOG="$OUT/log.txt"
say() { echo "### $(date +%T) $*" | tee -a "$LOG"; }

say "device"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,driver_version --format=csv \
    2>&1 | tee -a "$LOG"
python3 -c "import torch, pyro; print('torch', torch.__version__, 'pyro', pyro.__version__,
      'tf32 matmul', torch.backends.cuda.matmul.allow_tf32, 'precision',
      torch.get_float32_matmul_precision())" 2>&1 | tee -a "$LOG"

say "A1 step overhead"
timeout 90 python3 benchmarks/step_overhead.py --device cuda --batch-sizes 256 6144 --generic \
    --svi-floor --profile 12 2>&1 | tee -a "$LOG"

say "A2 marginal, overlapping, N = 1024 ... 262144"
timeout 180 python3 benchmarks/marginal.py --device cuda --regimes overlapping \
    --memory-budget 100 --json "$OUT/marginal.json" 2>&1 | tee -a "$LOG"
say "A2 marginal, separated and tight, N <= 8192"
timeout 60 python3 benchmarks/marginal.py --device cuda --regimes separated,tight --max-n 8192 \
    --no-info-nce --json "$OUT/marginal_regimes.json" 2>&1 | tee -a "$LOG"

say "B identifiability (budget $BUDGET s each, three runs sharing the device) and pytest -m cuda"
summarise() {  # RESULTS.json: the scores, time to each R^2 level and the trajectory
    python3 - "$1" <<'EOF'
import json, sys
result = json.load(open(sys.argv[1]))
run = next(iter(result["runs"].values()))
t = run["trajectory"]
print(f"{result['environment']['device_name']}: r2 {run['r2']:.4f} mcc {run['mcc']:.4f} "
      f"steps {run['steps']} in {run['train_seconds']:.0f} s ({run['pairs_per_second']:.0f} "
      f"pairs/s), time to r2 {run['time_to_r2']}, energy {run['energy_parameters']}")
print("step / r2 / mcc / s:", [(s, round(r, 4), round(m, 4), round(w)) for s, r, m, w in
                               zip(t["step"], t["r2"], t["mcc"], t["wall_time"])])
EOF
}
identifiability() {  # NAME SETTING BATCH LR: log and summary in $OUT/ident-NAME.log
    local log="$OUT/ident-$1.log"
    timeout $((BUDGET + 150)) python3 benchmarks/identifiability.py --settings "$2" --seeds 0 \
        --device cuda --batch-size "$3" --lr "$4" --time-budget "$BUDGET" --probe-steps 1000 --eval-every 2000 \
        --out "$RUNS/$1" > "$log" 2>&1
    echo "exit $?" >> "$log"
    [ -f "$RUNS/$1/$2/seed-0/results.json" ] && summarise "$RUNS/$1/$2/seed-0/results.json" >> "$log" 2>&1
}
identifiability sphere-1024 sphere 1024 2e-3 &
identifiability sphere-4096 sphere 4096 3e-3 &
identifiability box-4096 box 4096 3e-3 &
timeout $((BUDGET + 120)) python3 -m pytest -m cuda -q -p no:cacheprovider -rs --ignore=tests/test_notebooks.py \
    > "$OUT/pytest.txt" 2>&1
echo "pytest exit $?" >> "$OUT/pytest.txt"
tail -5 "$OUT/pytest.txt" | tee -a "$LOG"
wait
for name in sphere-1024 sphere-4096 box-4096; do
    say "identifiability $name"
    grep -E "^== |^exit|: r2 |^step / r2" "$OUT/ident-$name.log" | cut -c1-3000 | tee -a "$LOG"
done
say "done"
