#!/usr/bin/env bash
# The GPU device check, in one run (docs/not-verified.md): install perftracker into the machine's
# python, then bench/gpu_check.py (NVML, GPM, nsys, a CUDA window) and bench/gpu_job.py (a CUDA
# job under `perftracker run`: detector, windows with CUDA activities, NVML series, report), the
# second time with the fault near the end so that the window is cut by the exit.
# SKIP_GPU_CHECK=1 skips bench/gpu_check.py. Results go to $OUT (or ./device-out): device.txt, gpu_check.txt, gpu_job.txt, gpu_job_end.txt, logs.tar.gz
set -u
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
{
  date -u; uname -a; nproc; free -g | head -2
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv
  $PY -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
  command -v nsys || echo "nsys not on PATH"
  ls /opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys 2>&1 | head -2
  $PY -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -3 \
    || $PY -m pip install -q --no-deps --no-build-isolation --no-index . 2>&1 | tail -3
  cd /tmp && $PY -c "import perftracker, pynvml; print('perftracker', perftracker.__file__)"; cd - >/dev/null
  $PY -c "import torch; print('KinetoEvent:', [a for a in dir(torch._C._autograd._KinetoEvent) if not a.startswith('_')])"
} > "$OUT/device.txt" 2>&1
# the window's and the Kineto reader's own tests, on this torch and Python (CUDA present)
timeout 60 $PY -m pytest -q -p no:cacheprovider tests/component/test_kineto_activity.py tests/component/test_window.py \
  > "$OUT/pytest.txt" 2>&1
echo "pytest exit $?" >> "$OUT/device.txt"
if [ "${SKIP_GPU_CHECK:-0}" != 1 ]; then
NSYS_DIR=$(dirname "$(ls /opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys 2>/dev/null | head -1)" 2>/dev/null)
PATH="$PATH:${NSYS_DIR:-/nonexistent}" timeout 120 $PY bench/gpu_check.py --seconds 5 > "$OUT/gpu_check.txt" 2>&1
echo "gpu_check exit $?" >> "$OUT/device.txt"
fi
timeout 200 $PY bench/gpu_job.py --out /tmp/gj > "$OUT/gpu_job.txt" 2>&1
echo "gpu_job exit $?" >> "$OUT/device.txt"
timeout 160 $PY bench/gpu_job.py --out /tmp/gj_end --iters 420 --fault-at 330 > "$OUT/gpu_job_end.txt" 2>&1
echo "gpu_job (cut by the exit) exit $?" >> "$OUT/device.txt"
tar czf "$OUT/logs.tar.gz" -C /tmp gj gj_end --exclude='*.sqlite*' 2>/dev/null
tail -3 "$OUT/device.txt"
