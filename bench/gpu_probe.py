"""The device check's probes (issue 43): raw facts, NVML, the live capture path, CUDA graphs.

    python bench/gpu_probe.py --stage facts|nvml|capture|graphs|nccl_meta [--seconds S] [--gpu N]

Each stage prints one JSON line per check, {"check": ..., "status": "PASS"|"FAIL"|"VALUE"|"SKIP",
...}, and exits 0 (2 when the stage could not run at all). ``tools/device_check.sh`` runs each
stage under its own timeout and prints the summary. Nothing changes clocks or power limits. On a
machine without a GPU every GPU check says SKIP with the reason.

- facts: driver, CUDA, NCCL, torch, nvidia-ml-py versions; the ``_ExperimentalConfig`` keywords
  and ``_KinetoEvent`` attributes of this torch; the profiling permission; IB counters as read.
- nvml: link peaks with every raw value read; each call's cost; GPM at 20/50/100/200 ms under a
  GEMM load (shares of zero, NaN and clipped values); throttle masks idle and under load; instant
  against averaged power.
- capture: perftracker's own KinetoCapture + kineto_rows (not the offline reader): kernels against
  launches, kernel start against launch start (the time base), a second window right after the
  first, iteration time before, after and 10 s after (residual CUPTI cost), a kernel-dense load.
- graphs: CUDA graphs replayed under three windows, in a child process that may crash.
- nccl_meta: what NCCL metadata (``record_param_comms`` and kernel ``extra_meta`` / ``metadata_json``)
  the live capture reads, on a one-rank NCCL group (item 7: not used yet, this prints what is there).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def emit(check: str, status: str, **fields: Any) -> None:
    print(json.dumps({"check": check, "status": status, **fields}, default=str), flush=True)


def _cuda() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _nvml() -> Any:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # noqa: BLE001
        return None


# ------------------------------------------------------------------------------------ facts
def stage_facts() -> None:
    import torch

    from perftracker.runtime.profiler import _accepted_keywords

    emit("torch", "VALUE", version=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
    emit("experimental_config_keywords", "VALUE", keywords=sorted(_accepted_keywords() or []))
    emit("kineto_event_attributes", "VALUE",
         attributes=[a for a in dir(torch._C._autograd._KinetoEvent) if not a.startswith("_")])
    nccl = None
    if torch.cuda.is_available():
        try:
            nccl = torch.cuda.nccl.version()
        except Exception as exc:  # noqa: BLE001
            nccl = f"{type(exc).__name__}: {exc}"
    emit("nccl", "VALUE" if nccl else "SKIP", version=nccl, reason=None if nccl else "no CUDA")
    nv = _nvml()
    if nv is None:
        emit("driver", "SKIP", reason="NVML unavailable (no driver or no nvidia-ml-py)")
    else:
        from importlib.metadata import PackageNotFoundError, version

        try:
            pyver = version("nvidia-ml-py")
        except PackageNotFoundError:
            pyver = None
        emit("driver", "VALUE", driver=nv.nvmlSystemGetDriverVersion(), nvml=nv.nvmlSystemGetNVMLVersion(),
             cuda_driver=nv.nvmlSystemGetCudaDriverVersion(), nvidia_ml_py=pyver)
    params = Path("/proc/driver/nvidia/params")
    perm = [ln for ln in params.read_text().splitlines() if "RmProfilingAdminOnly" in ln] if params.exists() else []
    emit("profiling_permission", "VALUE" if perm else "SKIP", params=perm,
         reason=None if perm else "no /proc/driver/nvidia/params")
    from perftracker.agent.samplers.rdma import COUNTER_BITS, SYSFS_ROOT, find_ports, saturated

    ports = find_ports(SYSFS_ROOT)
    if not ports:
        emit("ib_counters", "SKIP", reason=f"no active port under {SYSFS_ROOT}")
    for p in ports:
        raw: dict[str, Any] = {}
        for name in COUNTER_BITS:
            try:
                v = int((p.path / "counters" / name).read_text().split()[0])
                raw[name] = {"value": v, "saturated": saturated(name, float(v))}
            except (OSError, ValueError, IndexError) as exc:
                raw[name] = f"{type(exc).__name__}"
        hw = sorted(x.name for x in (p.path / "hw_counters").iterdir()) if (p.path / "hw_counters").is_dir() else []
        device = (SYSFS_ROOT / p.hca / "device").resolve() if (SYSFS_ROOT / p.hca / "device").exists() else None
        emit("ib_counters", "VALUE", port=p.name, rate_bytes_per_s=p.peak_bytes_per_s, counters=raw,
             hw_counters=hw, pci=str(device))


# ------------------------------------------------------------------------------------ nvml
def _gemm(stop: threading.Event, torch: Any, gpu: int, n: int = 8192) -> None:
    dev = torch.device(f"cuda:{gpu}")
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    while not stop.is_set():
        for _ in range(16):
            a = (a @ b) * 1e-3
        torch.cuda.synchronize(dev)


def _cost_us(fn: Any, n: int = 50) -> float | str:
    try:
        fn()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return round((time.perf_counter() - t0) / n * 1e6, 1)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"


def _gpm_at(nv: Any, h: Any, interval_ms: float, seconds: float) -> dict[str, Any]:
    """GPM read every ``interval_ms`` for ``seconds``: shares of zero, NaN and clipped (>100 %) values."""
    from perftracker.agent.samplers.nvml_health import GPM_METRICS

    prev = nv.nvmlGpmSampleGet(h, nv.nvmlGpmSampleAlloc())
    spare = nv.nvmlGpmSampleAlloc()
    vals: dict[int, list[float]] = {m: [] for m in GPM_METRICS}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(interval_ms / 1000)
        cur = nv.nvmlGpmSampleGet(h, spare)
        mg = nv.c_nvmlGpmMetricsGet_t()
        mg.version, mg.numMetrics, mg.sample1, mg.sample2 = 1, len(GPM_METRICS), prev, cur
        for i, mid in enumerate(GPM_METRICS):
            mg.metrics[i].metricId = mid
        nv.nvmlGpmMetricsGet(mg)
        for i in range(len(GPM_METRICS)):
            if int(mg.metrics[i].nvmlReturn) == 0:
                vals[int(mg.metrics[i].metricId)].append(float(mg.metrics[i].value))
        prev, spare = cur, prev
    nv.nvmlGpmSampleFree(prev)
    nv.nvmlGpmSampleFree(spare)
    out = {}
    for m, v in vals.items():
        if not v:
            continue
        finite = [x for x in v if math.isfinite(x)]
        out[str(m)] = {"n": len(v), "zero": round(sum(x == 0 for x in v) / len(v), 3),
                       "nan": round(sum(not math.isfinite(x) for x in v) / len(v), 3),
                       "over_100": round(sum(x > 100 for x in finite) / len(v), 3),
                       "median": sorted(finite)[len(finite) // 2] if finite else None}
    return out


def stage_nvml(gpu: int, seconds: float) -> None:
    torch, nv = _cuda(), _nvml()
    if torch is None or nv is None:
        emit("nvml", "SKIP", reason="no CUDA GPU" if torch is None else "NVML unavailable")
        return
    from perftracker.agent.samplers.nvml_health import NVML_FI_DEV_POWER_INSTANT, ClockReader
    from perftracker.agent.samplers.nvml_links import link_peaks

    h = nv.nvmlDeviceGetHandleByIndex(gpu)
    peaks = link_peaks(nv, h)
    emit("link_peaks", "VALUE", pcie_bytes_per_s=peaks.pcie_bytes_per_s, pcie_source=peaks.pcie_source,
         nvlink_bytes_per_s=peaks.nvlink_bytes_per_s, nvlink_source=peaks.nvlink_source, raw=peaks.raw)
    emit("uuid", "VALUE", nvml=nv.nvmlDeviceGetUUID(h), torch=str(getattr(torch.cuda.get_device_properties(gpu), "uuid", None)))

    def masks() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for fn in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons",
                   "nvmlDeviceGetSupportedClocksEventReasons"):
            try:
                out[fn] = hex(int(getattr(nv, fn)(h)))
            except Exception as exc:  # noqa: BLE001
                out[fn] = f"{type(exc).__name__}"
        try:
            v = nv.nvmlDeviceGetFieldValues(h, [NVML_FI_DEV_POWER_INSTANT])[0]
            out["power_instant_mw"] = (int(v.nvmlReturn), int(v.value.uiVal))
        except Exception as exc:  # noqa: BLE001
            out["power_instant_mw"] = f"{type(exc).__name__}"
        out["power_usage_mw"] = int(nv.nvmlDeviceGetPowerUsage(h))  # a 1 s mean on Ampere (but GA100) and later
        out["sm_clock_mhz"] = int(nv.nvmlDeviceGetClockInfo(h, 1))
        return out

    emit("throttle_idle", "VALUE", **masks())
    costs = {
        "samples": _cost_us(lambda: nv.nvmlDeviceGetSamples(h, nv.NVML_GPU_UTILIZATION_SAMPLES, 0)),
        "clock": _cost_us(lambda: nv.nvmlDeviceGetClockInfo(h, 1)),
        "reasons": _cost_us(lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h)),
        "power_usage": _cost_us(lambda: nv.nvmlDeviceGetPowerUsage(h)),
        "power_instant": _cost_us(lambda: nv.nvmlDeviceGetFieldValues(h, [NVML_FI_DEV_POWER_INSTANT])),
        "pcie_throughput": _cost_us(lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES), 5),
        "nvlink_fields": _cost_us(lambda: nv.nvmlDeviceGetFieldValues(
            h, [(nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0xFFFFFFFF)])),
        "gpm_sample": _cost_us(lambda: nv.nvmlGpmSampleGet(h, nv.nvmlGpmSampleAlloc()), 5),
    }
    emit("call_cost_us", "VALUE", **costs)
    stop = threading.Event()
    load = threading.Thread(target=_gemm, args=(stop, torch, gpu), daemon=True)
    load.start()
    try:
        time.sleep(1.0)
        emit("throttle_load", "VALUE", **masks())
        try:
            supported = bool(nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
        except Exception as exc:  # noqa: BLE001
            supported = False
            emit("gpm", "SKIP", reason=f"{type(exc).__name__}: {exc}")
        if supported:
            for ms in (20, 50, 100, 200):
                got = _gpm_at(nv, h, ms, min(seconds, 4.0))
                sm = got.get("2", {})
                bad = (sm.get("zero", 1) > 0.2 or sm.get("nan", 1) > 0) if sm else True
                emit(f"gpm_{ms}ms", ("FAIL" if bad else "PASS") if ms >= 110 else "VALUE", metrics=got)
        reader = ClockReader(nv, h)
        emit("clock_reader_load", "VALUE", sample=reader.read().__dict__)
    finally:
        stop.set()
        load.join(timeout=30)


# ------------------------------------------------------------------------------------ capture
def _iter_ms(torch: Any, step: Any, n: int = 20) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e3


def _window(torch: Any, step: Any, iters: int) -> dict[str, Any]:
    import numpy as np

    from perftracker.model.raw_window import EventKind
    from perftracker.runtime.profiler import KinetoCapture, gpu_events_lost, kineto_rows

    cap = KinetoCapture(cuda=True)
    t_start = time.monotonic_ns()
    cap.start()
    for _ in range(iters):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    result = cap.stop()
    stop_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    rows = kineto_rows(result, cap.offset_ns, 0, t_start - 10**9, time.monotonic_ns() + 10**9)
    convert_s = time.perf_counter() - t0
    kern = rows.kind == int(EventKind.KERNEL)
    names = rows.name
    launch = np.array([n.startswith(("cudaLaunch", "cuLaunch")) for n in names], bool)
    lag_us = None
    if kern.any() and launch.any():  # the first kernel must start after the first launch, on one time base
        lag_us = round(float(rows.start_ns[kern].min() - rows.start_ns[launch].min()) / 1e3, 1)
    return {"events": len(rows), "kernels": int(kern.sum()), "launches": rows.launches, "gpu_events": rows.gpu_events,
            "lost": gpu_events_lost(rows), "first_kernel_after_first_launch_us": lag_us,
            "stop_s": round(stop_s, 3), "convert_s": round(convert_s, 3)}


def stage_capture(gpu: int) -> None:
    torch = _cuda()
    if torch is None:
        emit("capture", "SKIP", reason="no CUDA GPU")
        return
    dev = torch.device(f"cuda:{gpu}")
    torch.cuda.set_device(dev)
    x = torch.randn(4096, 4096, device=dev)

    def step() -> None:
        y = x
        for _ in range(8):
            y = torch.relu(y @ x) * 1e-3

    before = _iter_ms(torch, step)
    first = _window(torch, step, 20)
    emit("window_1", "PASS" if first["kernels"] > 0 and not first["lost"] else "FAIL", **first)
    second = _window(torch, step, 20)
    emit("window_2_soon_after", "PASS" if second["kernels"] > 0 and not second["lost"] else "FAIL", **second)
    after = _iter_ms(torch, step)
    time.sleep(10)
    later = _iter_ms(torch, step)
    emit("residual_overhead", "VALUE", iter_ms_before=round(before, 3), iter_ms_after=round(after, 3),
         iter_ms_10s_after=round(later, 3), ratio_10s_after=round(later / before, 3))
    small = torch.randn(64, device=dev)

    def dense() -> None:
        y = small
        for _ in range(2000):
            y = y + 1
    t0 = time.perf_counter()
    d = _window(torch, dense, 50)
    d["seconds"] = round(time.perf_counter() - t0, 3)
    emit("kernel_dense_window", "PASS" if d["kernels"] >= 0.9 * d["launches"] and not d["lost"] else "FAIL", **d)


NCCL_META_CHILD = r"""
import json, os, sys, torch, torch.distributed as dist
sys.path.insert(0, sys.argv[1])
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29571")
torch.cuda.set_device(int(sys.argv[2]))
dist.init_process_group("nccl", rank=0, world_size=1)
from perftracker.runtime.profiler import KinetoCapture
t = torch.ones(1 << 20, device="cuda")
dist.all_reduce(t); torch.cuda.synchronize()
cap = KinetoCapture(cuda=True); cap.start()
for _ in range(3):
    dist.all_reduce(t)
torch.cuda.synchronize()
out = []
for e in cap.stop().events():
    n = e.name()
    if "param_comms" in n or "nccl" in n.lower():
        out.append({"name": n[:80], "extra_meta": dict(e.extra_meta()) if hasattr(e, "extra_meta") else None,
                    "metadata_json": e.metadata_json()[:400] if hasattr(e, "metadata_json") else None})
print(json.dumps(out[:8]))
dist.destroy_process_group()
"""


def stage_nccl_meta(gpu: int) -> None:
    """What NCCL metadata the live capture path can read (item 7: the group of a reducer's collective)."""
    if _cuda() is None:
        emit("nccl_meta_live", "SKIP", reason="no CUDA GPU")
        return
    p = subprocess.run([sys.executable, "-c", NCCL_META_CHILD, str(REPO), str(gpu)], capture_output=True, text=True,
                       timeout=90, env={**os.environ, "PERFTRACKER_DISABLE": "1"})
    emit("nccl_meta_live", "VALUE" if p.returncode == 0 else "FAIL", returncode=p.returncode,
         events=p.stdout.strip().splitlines()[-1:] or None, stderr=p.stderr[-400:])


# ------------------------------------------------------------------------------------ graphs
GRAPH_CHILD = r"""
import sys, torch
sys.path.insert(0, sys.argv[1])
from perftracker.runtime.profiler import KinetoCapture, kineto_rows
dev = torch.device("cuda", int(sys.argv[2]))
x = torch.randn(1024, 1024, device=dev)
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        y = (x @ x).relu()
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    y = (x @ x).relu()
for w in range(3):
    cap = KinetoCapture(cuda=True)
    cap.start()
    for _ in range(10):
        g.replay()
    torch.cuda.synchronize()
    r = kineto_rows(cap.stop(), cap.offset_ns, 0, 0, 2**62)
    print("window", w, "kernels", int((r.kind == 2).sum()), "launches", r.launches, flush=True)
"""


def stage_graphs(gpu: int) -> None:
    if _cuda() is None:
        emit("cuda_graphs", "SKIP", reason="no CUDA GPU")
        return
    for graphs_env in ("0", "1"):  # as perftracker sees a job it cannot tell uses graphs, and one it can
        env = {**os.environ, "PERFTRACKER_CUDA_GRAPHS": graphs_env}
        p = subprocess.run([sys.executable, "-c", GRAPH_CHILD, str(REPO), str(gpu)], capture_output=True, text=True,
                           timeout=120, env=env)
        emit(f"cuda_graphs_env{graphs_env}", "PASS" if p.returncode == 0 else "FAIL", returncode=p.returncode,
             stdout=p.stdout[-600:], stderr=p.stderr[-600:])


def summarize(paths: list[str]) -> int:
    """The summary the device check prints last: one line per check, the counts, and one JSON line."""
    counts = {"PASS": 0, "FAIL": 0, "VALUE": 0, "SKIP": 0}
    checks = []
    for path in paths:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as exc:
            lines = [json.dumps({"check": Path(path).stem, "status": "FAIL", "error": f"no output: {exc}"})]
        got = 0
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict) or "check" not in rec or rec.get("status") not in counts:
                continue
            got += 1
            counts[rec["status"]] += 1
            checks.append((rec["status"], rec["check"]))
            print(f"{rec['status']:5s} {rec['check']}" + (f" ({rec['reason']})" if rec.get("reason") else ""))
        if not got:  # a stage killed by its timeout or a crash printed nothing to count
            counts["FAIL"] += 1
            checks.append(("FAIL", Path(path).stem))
            print(f"FAIL  {Path(path).stem} (no check line: timed out or crashed)")
    print(json.dumps({"summary": counts, "fail": [c for s, c in checks if s == "FAIL"],
                      "skip": [c for s, c in checks if s == "SKIP"]}))
    return 1 if counts["FAIL"] else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--summarize", nargs="+", metavar="FILE", help="print the summary of the stages' outputs")
    ap.add_argument("--stage", choices=("facts", "nvml", "capture", "graphs", "nccl_meta"))
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--gpu", type=int, default=0)
    a = ap.parse_args(argv)
    if a.summarize:
        return summarize(a.summarize)
    if not a.stage:
        ap.error("--stage or --summarize")
    try:
        {"facts": stage_facts, "nvml": lambda: stage_nvml(a.gpu, a.seconds), "capture": lambda: stage_capture(a.gpu),
         "graphs": lambda: stage_graphs(a.gpu), "nccl_meta": lambda: stage_nccl_meta(a.gpu)}[a.stage]()
    except Exception as exc:  # noqa: BLE001 - the stage's failure is its line
        emit(a.stage, "FAIL", error=f"{type(exc).__name__}: {exc}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
