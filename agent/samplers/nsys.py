"""The nsys sampler: system-wide GPU metrics at up to 10 kHz through Nsight Systems.

NOT VERIFIED ON HARDWARE: built against nsys's documented command line and its SQLite export
(tables ``GPU_METRICS(timestamp, typeId, metricId, value)`` and
``TARGET_INFO_GPU_METRICS(typeId, metricId, metricName, ...)``), tested with a fixture database.

Run: ``nsys profile --gpu-metrics-devices=<i> --gpu-metrics-frequency=<hz> --trace=none
--sample=none --cpuctxsw=none --duration=<s> -o <tmp>/gm sleep <s>``, stopped with SIGINT if the
window ends first, then ``nsys export --type sqlite``. Metrics (percent of peak in the export):
``sm`` <- "SMs Active" / "SM Active", ``pcie`` <- max of "PCIe RX/TX Throughput", ``nvlink`` <- max
of the "NVLink RX/TX ... User Data" metrics.

Time base: export timestamps are ns since the session start, whose wall time is
``TARGET_INFO_SESSION_START_TIME.utcEpochNs``; we map them to CLOCK_MONOTONIC with the
CLOCK_REALTIME - CLOCK_MONOTONIC offset measured when nsys starts.

GPU counters are exclusive: one nsys (or ncu, or DCGM profiling) per GPU. This sampler takes a
non-blocking flock on ``<lock_dir>/perftracker-gpu-metrics-<i>.lock`` for its whole run, declines
when a DCGM host engine (``nv-hostengine``) runs, and reports unavailable, so that
``build_samplers`` falls back to NVML. Torch's profiler in the worker uses CUPTI activity tracing
(not the metric counters) and the nsys run attaches to no process, so the two do not collide.
"""

from __future__ import annotations

import fcntl
import logging
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

import numpy as np
import psutil
from perftracker.agent.samplers.base import Sampler, WindowBounds

from perftracker.errors import TraceError
from perftracker.model.raw_window import UtilSeries

log = logging.getLogger(__name__)

SM_NAMES = ("SMs Active", "SM Active")
PCIE_NAMES = ("PCIe RX Throughput", "PCIe TX Throughput")
NVLINK_PREFIXES = ("NVLink RX", "NVLink TX")


def dcgm_running() -> bool:
    """Whether DCGM's host engine runs on this node (it holds the GPU metrics that nsys would sample)."""
    try:
        return any(p.info["name"] == "nv-hostengine" for p in psutil.process_iter(["name"]))
    except psutil.Error:
        return False


def _metric_kind(name: str) -> str | None:
    if name.startswith(SM_NAMES):
        return "sm"
    if name.startswith(PCIE_NAMES):
        return "pcie"
    if name.startswith(NVLINK_PREFIXES) and "User Data" in name:
        return "nvlink"
    return None


def read_gpu_metrics(path: str | Path, realtime_offset_ns: int, gpu_type_id: int | None = None) -> dict[str, UtilSeries]:
    """Parse an ``nsys export --type sqlite`` file into utilization series on CLOCK_MONOTONIC."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise TraceError(f"{path}: cannot open nsys export ({exc})") from None
    try:
        tables = {r[0] for r in db.execute("select name from sqlite_master where type='table'")}
        missing = {"GPU_METRICS", "TARGET_INFO_GPU_METRICS"} - tables
        if missing:
            raise TraceError(f"{path}: nsys export has no {', '.join(sorted(missing))} table (no GPU metrics collected)")
        start_utc = 0
        if "TARGET_INFO_SESSION_START_TIME" in tables:
            row = db.execute("select utcEpochNs from TARGET_INFO_SESSION_START_TIME").fetchone()
            start_utc = int(row[0]) if row else 0
        names = {(int(t), int(m)): str(n) for t, m, n in
                 db.execute("select typeId, metricId, metricName from TARGET_INFO_GPU_METRICS")}
        rows = db.execute("select timestamp, typeId, metricId, value from GPU_METRICS order by timestamp").fetchall()
    except sqlite3.Error as exc:
        raise TraceError(f"{path}: bad nsys export ({exc})") from None
    finally:
        db.close()
    per: dict[str, dict[int, float]] = {}
    for ts, type_id, metric_id, value in rows:
        if gpu_type_id is not None and int(type_id) != gpu_type_id:
            continue
        kind = _metric_kind(names.get((int(type_id), int(metric_id)), ""))
        if kind is None:
            continue
        bucket = per.setdefault(kind, {})
        at = int(ts)
        bucket[at] = max(bucket.get(at, 0.0), float(value) / 100.0)  # max over RX/TX (and links)
    out: dict[str, UtilSeries] = {}
    for kind, samples in per.items():
        t = np.array(sorted(samples), np.int64)
        v = np.clip(np.array([samples[x] for x in t.tolist()], np.float32), 0.0, 1.0)
        t_mono = t + start_utc - realtime_offset_ns if start_utc else t
        period = int(np.median(np.diff(t))) if len(t) > 1 else 0
        out[kind] = UtilSeries(kind, t_mono, v, period, "nsys")
    return out


class NsysSampler:
    name = "nsys"

    def __init__(self, gpu_index: int, frequency_hz: int = 10_000, lock_dir: str = "/tmp",
                 nsys: str | None = None, fallback: Sampler | None = None) -> None:
        self.gpu_index = gpu_index
        self.fallback = fallback  # runs for the rest of the window if nsys fails (counters busy)
        self.frequency_hz = frequency_hz
        self.lock_path = Path(lock_dir) / f"perftracker-gpu-metrics-{gpu_index}.lock"
        self.nsys = nsys or shutil.which("nsys")
        self._lock_fh: IO[str] | None = None

    def unavailable_reason(self) -> str | None:
        if not self.nsys:
            return "nsys not found on PATH"
        if self.gpu_index < 0:
            return "no GPU index: NVML could not say which GPU the process uses"
        if dcgm_running():
            return "a DCGM host engine holds the GPU profiling counters"
        try:
            fh = open(self.lock_path, "a+")
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            return f"GPU metrics of GPU {self.gpu_index} are held by another sampler ({exc})"
        self._lock_fh = fh
        return None

    def run(self, bounds: WindowBounds) -> Mapping[str, UtilSeries]:
        try:
            return self._run(bounds)
        finally:
            if self._lock_fh is not None:
                self._lock_fh.close()  # releases the flock
                self._lock_fh = None

    def _run(self, bounds: WindowBounds) -> Mapping[str, UtilSeries]:
        assert self.nsys is not None
        if not bounds.wait_for_start():
            return {}
        with tempfile.TemporaryDirectory(prefix="perftracker-nsys-") as tmp:
            rep = Path(tmp) / "gm"
            duration_s = max(1, int((bounds.end_ns - time.monotonic_ns()) / 1e9) + 2)
            offset = time.time_ns() - time.monotonic_ns()
            cmd = [self.nsys, "profile", f"--gpu-metrics-devices={self.gpu_index}",
                   f"--gpu-metrics-frequency={self.frequency_hz}", "--trace=none", "--sample=none",
                   "--cpuctxsw=none", f"--duration={duration_s}", "--force-overwrite=true",
                   f"--output={rep}", "sleep", str(duration_s)]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            while proc.poll() is None:
                if bounds.done(time.monotonic_ns()):
                    proc.send_signal(signal.SIGINT)  # nsys stops collecting and writes the report
                    break
                time.sleep(0.05)
            out, _ = proc.communicate(timeout=120)
            report = rep.with_suffix(".nsys-rep")
            if proc.returncode not in (0, -signal.SIGINT, 130) or not report.exists():
                log.warning("nsys failed (exit %s): %s", proc.returncode, (out or "").strip()[-500:])
                if self.fallback is not None and not bounds.done(time.monotonic_ns()):
                    log.warning("falling back to %s for the rest of the window", self.fallback.name)
                    return self.fallback.run(bounds)
                return {}
            sqlite_path = rep.with_suffix(".sqlite")
            exp = subprocess.run([self.nsys, "export", "--type", "sqlite", "--force-overwrite", "true",
                                  "--output", str(sqlite_path), str(report)], capture_output=True, text=True,
                                 timeout=300)
            if exp.returncode != 0 or not sqlite_path.exists():
                log.warning("nsys export failed (exit %s): %s", exp.returncode, exp.stderr.strip()[-500:])
                return {}
            series = read_gpu_metrics(sqlite_path, offset)
        return {k: bounds.trim(v) for k, v in series.items()}
