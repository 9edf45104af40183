"""The device check: what only a GPU machine can confirm of the GPU paths (issue 34).

    python bench/gpu_check.py [--seconds S] [--gpu N]

On one GPU, under a matmul load it starts itself, in under 5 minutes:

1. NVML: the sampler's series (agent/samplers/nvml.py): SM clock against its maximum, throttle
   reasons, power, GPM metrics where the GPU has them (Hopper and later), PCIe/NVLink.
2. nsys: the GPU-metrics capture and its SQLite export parsed (agent/samplers/nsys.py).
3. A CUDA window: torch.profiler's CUDA activities exported as a Kineto trace, read and summarized
   by the same code as `perftracker analyze` (kernels, memcpys, their β).
4. The clock under load, from (1).

stdout: progress lines, then ONE JSON object on the last line:
{"ok", "gpu", "nvml": {...}, "gpm": {...}, "nsys": {...}, "cuda_window": {...}, "clock_under_load": {...},
 "errors": [...], "wall_s"}
Exit status 0 when every part worked, 1 when some failed (the JSON says which), 2 with no CUDA GPU
(the JSON says so: "no CUDA GPU"). Nothing here is asserted against a timing.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _load(stop: threading.Event, gpu: int) -> None:
    import torch

    dev = torch.device(f"cuda:{gpu}")
    a = torch.randn(4096, 4096, device=dev)
    b = torch.randn(4096, 4096, device=dev)
    while not stop.is_set():
        for _ in range(8):
            a = (a @ b) * 1e-3
        torch.cuda.synchronize(dev)


def _series_summary(out: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    return {k: {"n": len(v.t_ns), "mean": round(float(np.mean(v.value)), 4) if len(v.t_ns) else None,
                "source": v.source} for k, v in out.items()}


def _sample(sampler: Any, seconds: float) -> dict[str, Any]:
    from perftracker.agent.samplers.base import WindowBounds

    now = time.monotonic_ns()
    return dict(sampler.run(WindowBounds(now + 100_000_000, now + int(seconds * 1e9))))


def check_nvml(gpu: int, seconds: float) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    from perftracker.agent.samplers.nvml import NvmlSampler
    from perftracker.agent.samplers.nvml_health import GpmReader

    from perftracker.model.hardware import SM_CLOCK, THROTTLE_SERIES, max_mhz_of

    s = NvmlSampler(gpu)
    reason = s.unavailable_reason()
    if reason is not None:
        raise RuntimeError(reason)
    gpm = GpmReader(s._nvml, s._handle)
    gpm_supported = gpm.supported
    gpm.close()
    out = _sample(s, seconds)
    summary = _series_summary(out)
    clock = out.get(SM_CLOCK)
    under_load: dict[str, Any] = {}
    if clock is not None and len(clock.t_ns):
        max_ghz = max_mhz_of(clock.source) / 1000.0
        under_load = {"clock_ghz_median": round(float(sorted(clock.value)[len(clock.value) // 2]) * max_ghz, 3),
                      "max_clock_ghz": round(max_ghz, 3),
                      "throttled_share": {k: round(float(out[k].value.mean()), 3) for k in THROTTLE_SERIES if k in out}}
    gpm_part = {"supported": gpm_supported,
                "series": {k: summary[k] for k in ("sm_active", "sm_occupancy", "mem", "gpm_pcie", "gpm_nvlink") if k in summary
                           and summary[k]["source"] == "nvml gpm"}}
    return summary, gpm_part, under_load


def check_nsys(gpu: int, seconds: float) -> dict[str, Any]:
    from perftracker.agent.samplers.nsys import NsysSampler

    s = NsysSampler(gpu, 10_000, tempfile.gettempdir())
    reason = s.unavailable_reason()
    if reason is not None:
        raise RuntimeError(reason)
    return _series_summary(_sample(s, seconds))


def check_cuda_window(gpu: int) -> dict[str, Any]:
    import torch
    from perftracker.agent.kineto import read_kineto_trace
    from perftracker.agent.summarize.summarizer import summarize_window
    from torch.profiler import ProfilerActivity, profile

    dev = torch.device(f"cuda:{gpu}")
    x = torch.randn(2048, 2048)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            y = x.to(dev, non_blocking=False)
            z = (y @ y).relu()
            z.cpu()
        torch.cuda.synchronize(dev)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rank0.pt.trace.json"
        prof.export_chrome_trace(str(path))
        ps = summarize_window(read_kineto_trace(path, rank=0))
    by_cat: dict[str, int] = {}
    for p in ps.patterns:
        by_cat[p.category.value] = by_cat.get(p.category.value, 0) + 1
    memcpy = [p for p in ps.patterns if "memcpy" in p.key.lower()]
    return {"gpu_window": ps.gpu, "functions": len(ps.patterns), "by_category": by_cat,
            "memcpy_functions": len(memcpy), "top": [[p.label[:60], p.category.value, round(p.beta, 4)]
                                                     for p in ps.patterns[:5]]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=8.0, help="sampling window of each sampler under load (default 8)")
    p.add_argument("--gpu", type=int, default=0)
    args = p.parse_args(argv)
    t0 = time.monotonic()
    result: dict[str, Any] = {"ok": False, "gpu": None, "errors": []}
    try:
        import torch
    except ImportError as exc:  # noqa: BLE001 - reported in the JSON
        result["errors"].append(f"torch: {exc}")
        print(json.dumps(result))
        return 2
    if not torch.cuda.is_available():
        result["errors"].append("no CUDA GPU: torch.cuda.is_available() is False (this check needs a GPU machine)")
        result["wall_s"] = round(time.monotonic() - t0, 2)
        print(json.dumps(result))
        return 2
    result["gpu"] = torch.cuda.get_device_name(args.gpu)
    stop = threading.Event()
    load = threading.Thread(target=_load, args=(stop, args.gpu), daemon=True)
    load.start()
    parts = (("nvml", lambda: check_nvml(args.gpu, args.seconds)), ("nsys", lambda: check_nsys(args.gpu, args.seconds)))
    try:
        for name, fn in parts:
            print(f"[gpu_check] {name} under load for {args.seconds:.0f} s", flush=True)
            try:
                got = fn()
                if name == "nvml":
                    result["nvml"], result["gpm"], result["clock_under_load"] = got
                else:
                    result[name] = got
            except Exception as exc:  # noqa: BLE001 - one part's failure is reported, the others go on
                result["errors"].append(f"{name}: {type(exc).__name__}: {exc}")
    finally:
        stop.set()
        load.join(timeout=30)
    print("[gpu_check] CUDA window", flush=True)
    try:
        result["cuda_window"] = check_cuda_window(args.gpu)
    except Exception as exc:  # noqa: BLE001
        result["errors"].append(f"cuda_window: {type(exc).__name__}: {exc}")
    result["ok"] = not result["errors"]
    result["wall_s"] = round(time.monotonic() - t0, 2)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
