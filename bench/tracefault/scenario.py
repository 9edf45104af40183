"""GPU scenario files (TOML) for bench/gpu_faults.py: bench/faults.py's format for the ground
truth (``[[expect]]`` / ``[[allow]]``, parsed by bench/faultkit/scenario.py), with a trace set and
trace-level faults instead of a job to run.

    name = "gpu-slow-gpu-r2"
    traces = "../shared/data/dlrm_kineto"   # relative to the repository root (or absolute)
    steps = 4                               # tile the recorded step this many times
    seed = 0                                # optional: gc_pause's choice of ops, the series' jitter
    ranks_per_host = 2                      # optional: hosts of the job (0, default: one host); a
                                            # group that spans hosts uses the NIC (InfiniBand series)
    [[fault]]
    kind = "slow_gpu"                       # see bench/tracefault/faults.py
    ranks = [2]
    factor = 12.0
    [[expect]]
    ranks = [2]
    category = "compute"
    [[allow]]
    ranks = [4, 5]
    category = "python"
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.faultkit.scenario import Scenario, _err, _match, _ranks
from bench.tracefault.faults import GpuFault
from bench.tracefault.traces import trace_files
from perftracker.errors import ConfigError, InputError

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class GpuScenario:
    truth: Scenario  # name, workers, expect and allow, scored by bench/faultkit/scoring.py
    traces: Path
    steps: int
    faults: tuple[GpuFault, ...]
    ranks_per_host: int = 0  # 0: every rank on one host

    @property
    def name(self) -> str:
        return self.truth.name

    @property
    def seed(self) -> int:
        return self.truth.seed


def _world(traces: Path, path: str) -> int:
    try:
        return len(trace_files(traces))
    except InputError as exc:
        raise _err(path, f"traces: {exc}") from None


def parse_gpu_scenario(text: str, path: str = "<string>", traces_override: Path | None = None) -> GpuScenario:
    try:
        d: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _err(path, f"invalid TOML: {exc}") from None
    unknown = set(d) - {"name", "traces", "steps", "seed", "ranks_per_host", "fault", "expect", "allow"}
    if unknown:
        raise _err(path, f"unknown keys {sorted(unknown)}")
    name = d.get("name")
    if not isinstance(name, str) or not name:
        raise _err(path, "name must be a non-empty string")
    if traces_override is not None:
        traces = traces_override
    else:
        t = d.get("traces")
        if not isinstance(t, str) or not t:
            raise _err(path, "traces must name a directory of per-rank Kineto traces")
        traces = Path(t) if Path(t).is_absolute() else (REPO / t).resolve()
    steps, seed, per_host = d.get("steps", 1), d.get("seed", 0), d.get("ranks_per_host", 0)
    for key, val, lo in (("steps", steps, 1), ("seed", seed, 0), ("ranks_per_host", per_host, 0)):
        if not isinstance(val, int) or isinstance(val, bool) or val < lo:
            raise _err(path, f"{key} must be an integer >= {lo}, got {val!r}")
    workers = _world(traces, path)
    faults = []
    for i, f in enumerate(d.get("fault", [])):
        where = f"fault[{i}]"
        if not isinstance(f, dict):
            raise _err(path, f"{where} must be a table")
        ranks = _ranks(f.get("ranks", "*"), workers, path, where, seed, False)
        assert ranks is not None
        try:
            faults.append(GpuFault(str(f.get("kind")), ranks, {k: v for k, v in f.items() if k not in ("kind", "ranks")}))
        except ConfigError as exc:
            raise _err(path, f"{where}: {exc}") from None
    expect = tuple(_match(m, workers, path, f"expect[{i}]", seed) for i, m in enumerate(d.get("expect", [])))
    allow = tuple(_match(m, workers, path, f"allow[{i}]", seed) for i, m in enumerate(d.get("allow", [])))
    truth = Scenario(name=name, path=path, workers=workers, iterations=steps, window_s=0.0, trigger="none",
                     trigger_at_iter=0, seed=seed, faults=(), expect=expect, allow=allow)
    return GpuScenario(truth, traces, steps, tuple(faults), per_host)


def load_gpu_scenario(path: str | Path, traces_override: Path | None = None) -> GpuScenario:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"scenario {p}: cannot read ({exc.strerror})") from None
    return parse_gpu_scenario(text, str(p), traces_override)


def with_traces(sc: GpuScenario, traces: Path) -> GpuScenario:
    return dataclasses.replace(sc, traces=traces)
