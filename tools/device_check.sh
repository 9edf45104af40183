#!/usr/bin/env bash
# The GPU device check (issue 43): the first thing to run on a GPU machine, under 8 minutes on one
# GPU; it never changes clocks or power limits. Each stage runs under its own timeout and prints one
# JSON line per check (bench/gpu_probe.py); the summary comes last: PASS/FAIL/VALUE/SKIP per check
# and one JSON line. On a machine without a GPU every GPU stage says SKIP and why.
#   facts    versions, _ExperimentalConfig keywords, _KinetoEvent attributes, profiling permission, IB counters
#   nvml     link peaks with their raw values, call costs, GPM at 20/50/100/200 ms under load, throttle masks
#   capture  perftracker's own capture path: kernels vs launches, time base, a second window, residual cost
#   graphs   CUDA graphs under repeated windows, in a child that may crash
#   nccl_meta  the NCCL metadata the live capture can read (a one-rank NCCL group)
#   window tests  test_kineto_activity + test_window on this torch
#   job      a 2-rank job on the one GPU (bench/gpu_job.py: gloo across ranks, NCCL refuses 2 ranks on 1 GPU)
# Output goes to $OUT (or ./device-out). Record the summary in docs/not-verified.md.
set -u
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
T0=$(date +%s)
{
  date -u; uname -a; nproc
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv
  command -v nsys || echo "nsys not on PATH"
  (cd /tmp && $PY -c "import perftracker" 2>/dev/null) \
    || $PY -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -3
} > "$OUT/device.txt" 2>&1
HAS_GPU=$($PY -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
timeout 60 $PY bench/gpu_probe.py --stage facts > "$OUT/facts.jsonl" 2> "$OUT/facts.err"
timeout 120 $PY bench/gpu_probe.py --stage nvml --seconds 4 > "$OUT/nvml.jsonl" 2> "$OUT/nvml.err"
timeout 120 $PY bench/gpu_probe.py --stage capture > "$OUT/capture.jsonl" 2> "$OUT/capture.err"
timeout 150 $PY bench/gpu_probe.py --stage graphs > "$OUT/graphs.jsonl" 2> "$OUT/graphs.err"
timeout 100 $PY bench/gpu_probe.py --stage nccl_meta > "$OUT/nccl_meta.jsonl" 2> "$OUT/nccl_meta.err"
timeout 120 $PY -m pytest -q -p no:cacheprovider tests/component/test_kineto_activity.py tests/component/test_window.py \
  > "$OUT/window_tests.txt" 2>&1
RC=$?
if [ $RC -eq 0 ]; then S=PASS; else S=FAIL; fi
echo "{\"check\": \"window_tests\", \"status\": \"$S\", \"pytest_exit\": $RC, \"tail\": \"$(tail -1 "$OUT/window_tests.txt" | tr -d '"\\')\"}" \
  > "$OUT/window_tests.jsonl"
if [ "$HAS_GPU" = 1 ]; then
  timeout 200 $PY bench/gpu_job.py --out /tmp/gj > "$OUT/gpu_job.txt" 2>&1
  RC=$?
  LAST=$(tail -1 "$OUT/gpu_job.txt")
  $PY - "$RC" "$LAST" > "$OUT/job.jsonl" <<'EOF'
import json, sys
rc, last = int(sys.argv[1]), sys.argv[2]
try:
    got = json.loads(last)
except ValueError:
    got = {}
ok = rc == 0 and bool(got.get("named_rank1"))
print(json.dumps({"check": "job_2_ranks", "status": "PASS" if ok else "FAIL", "exit": rc,
                  "named_rank1": got.get("named_rank1"), "errors": got.get("errors")}))
EOF
else
  echo '{"check": "job_2_ranks", "status": "SKIP", "reason": "no CUDA GPU"}' > "$OUT/job.jsonl"
fi
echo "wall_s $(( $(date +%s) - T0 ))" >> "$OUT/device.txt"
$PY bench/gpu_probe.py --summarize "$OUT/facts.jsonl" "$OUT/nvml.jsonl" "$OUT/capture.jsonl" "$OUT/graphs.jsonl" \
  "$OUT/nccl_meta.jsonl" "$OUT/window_tests.jsonl" "$OUT/job.jsonl" | tee "$OUT/summary.txt"
