"""Scenario files (TOML): the documented format of bench/scenarios/*.toml, parsed and validated.

    name = "slow-compute-rank2"
    workers = 4
    iterations = 800          # upper bound; the run ends after the report
    window_s = 5
    trigger = "detector"      # "detector" | "cli" | "none"
    trigger_at_iter = 200     # for trigger = "cli"
    seed = 0                  # optional
    [[fault]]
    kind = "cpu_quota"
    ranks = [2]               # or "*" for all ranks, or "random"
    start_iter = 0
    fraction = 0.3
    [[expect]]                # must be found
    ranks = [2]
    category = "compute"      # compute | memory | collective | python | hang | crash
    kind = "specific"         # specific | common (optional)
    name = ""                 # optional substring of the function name
    [[allow]]                 # may be reported without counting as a false positive
    ranks = "*"
    category = "collective"
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perftracker.errors import ConfigError

FAULT_PARAMS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "cpu_quota": {"fraction": (int, float)},
    "net_rate": {"mbit": (int, float)},
    "sleep": {"where": str, "ms": (int, float), "every": int},
    "compute": {"where": str, "frac": (int, float), "ms": (int, float)},
    "busy_python": {"where": str, "ms": (int, float)},
    "copy": {"mb": (int, float)},
    "competitor": {},
    "gc_stall": {"probability": (int, float), "ms": (int, float)},
    "hang": {"at_iter": int},
    "stop": {"at_iter": int},
    "kill": {"at_iter": int},
    "raise": {"at_iter": int},
    "exit": {"at_iter": int, "code": int},
    "oom": {"at_iter": int, "mb": int, "limit_mb": int},
}
REQUIRED: dict[str, tuple[str, ...]] = {
    "cpu_quota": ("fraction",),
    "net_rate": ("mbit",),
    "sleep": ("where", "ms"),
    "compute": (),
    "busy_python": ("where", "ms"),
    "copy": ("mb",),
    "competitor": (),
    "gc_stall": ("probability", "ms"),
    "hang": ("at_iter",),
    "stop": ("at_iter",),
    "kill": ("at_iter",),
    "raise": ("at_iter",),
    "exit": ("at_iter", "code"),
    "oom": ("at_iter",),
}
WHERE = ("dataloader", "forward", "backward", "optimizer")
CATEGORIES = ("compute", "memory", "collective", "python", "hang", "crash")
TRIGGERS = ("detector", "cli", "none")
# faults the training script applies itself (perftracker/examples/train.py --fault); the rest the harness applies
IN_SCRIPT = ("sleep", "compute", "busy_python", "copy", "gc_stall", "hang", "raise", "exit", "oom")
# faults the harness applies (out of process); "oom" is both: the harness sets the memory cgroup limit
# on that rank at its first iteration, the script allocates from at_iter on until the OOM killer ends it
HARNESS = ("cpu_quota", "net_rate", "competitor", "stop", "kill", "oom")
AT_ITER = ("hang", "stop", "kill", "raise", "exit", "oom")  # faults that happen once, at at_iter


@dataclass(frozen=True)
class Fault:
    kind: str
    ranks: tuple[int, ...]  # resolved ranks
    start_iter: int
    params: dict[str, Any] = field(default_factory=dict)

    def script_arg(self) -> str:
        """The perftracker/examples/train.py --fault value for in-script faults."""
        kv = ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.kind}:{kv}" if kv else self.kind


@dataclass(frozen=True)
class Match:
    ranks: tuple[int, ...] | None  # None: any rank ("*")
    category: str
    kind: str = ""
    name: str = ""


@dataclass(frozen=True)
class Scenario:
    name: str
    path: str
    workers: int
    iterations: int
    window_s: float
    trigger: str
    trigger_at_iter: int
    seed: int
    faults: tuple[Fault, ...]
    expect: tuple[Match, ...]
    allow: tuple[Match, ...]
    baseline: bool = False  # the localizer takes the job's healthy baseline (PERFTRACKER_BASELINE=1, issue 49)

    @property
    def network(self) -> bool:
        return any(f.kind == "net_rate" for f in self.faults)

    @property
    def onset_iter(self) -> int | None:
        starts = [f.start_iter for f in self.faults if f.kind not in AT_ITER]
        hangs = [int(f.params["at_iter"]) for f in self.faults if f.kind in AT_ITER]
        allv = starts + hangs
        return min(allv) if allv else None


def _err(path: str, msg: str) -> ConfigError:
    return ConfigError(f"scenario {path}: {msg}")


def _ranks(value: Any, workers: int, path: str, where: str, seed: int, allow_star: bool) -> tuple[int, ...] | None:
    if value == "*":
        if not allow_star:
            return tuple(range(workers))
        return None
    if value == "random":
        import random

        return (random.Random(seed).randrange(workers),)
    if not isinstance(value, list) or not all(isinstance(r, int) for r in value):
        raise _err(path, f"{where}.ranks must be a list of integers, \"*\" or \"random\", got {value!r}")
    bad = [r for r in value if not 0 <= r < workers]
    if bad:
        raise _err(path, f"{where}.ranks {bad} outside 0..{workers - 1}")
    return tuple(value)


def _match(d: Any, workers: int, path: str, where: str, seed: int) -> Match:
    if not isinstance(d, dict):
        raise _err(path, f"{where} must be a table")
    unknown = set(d) - {"ranks", "category", "kind", "name"}
    if unknown:
        raise _err(path, f"{where}: unknown keys {sorted(unknown)}")
    cat = d.get("category")
    if cat not in CATEGORIES:
        raise _err(path, f"{where}.category must be one of {CATEGORIES}, got {cat!r}")
    kind = d.get("kind", "")
    if kind not in ("", "specific", "common"):
        raise _err(path, f"{where}.kind must be specific or common, got {kind!r}")
    return Match(_ranks(d.get("ranks", "*"), workers, path, where, seed, True), cat, kind, str(d.get("name", "")))


def parse_scenario(text: str, path: str = "<string>", workers_override: int | None = None) -> Scenario:
    try:
        d = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _err(path, f"invalid TOML: {exc}") from None
    known = {"name", "workers", "iterations", "window_s", "trigger", "trigger_at_iter", "seed", "fault", "expect", "allow",
             "baseline"}
    unknown = set(d) - known
    if unknown:
        raise _err(path, f"unknown keys {sorted(unknown)}")
    name = d.get("name")
    if not isinstance(name, str) or not name:
        raise _err(path, "name must be a non-empty string")
    workers = workers_override or d.get("workers", 4)
    if not isinstance(workers, int) or workers < 2:
        raise _err(path, f"workers must be an integer >= 2, got {workers!r}")
    iterations = d.get("iterations", 800)
    window_s = d.get("window_s", 5)
    trigger = d.get("trigger", "detector")
    if trigger not in TRIGGERS:
        raise _err(path, f"trigger must be one of {TRIGGERS}, got {trigger!r}")
    trigger_at = d.get("trigger_at_iter", 200)
    seed = d.get("seed", 0)
    for key, val in (("iterations", iterations), ("trigger_at_iter", trigger_at), ("seed", seed)):
        if not isinstance(val, int) or val < 0:
            raise _err(path, f"{key} must be a non-negative integer, got {val!r}")
    if not isinstance(window_s, (int, float)) or window_s <= 0:
        raise _err(path, f"window_s must be a positive number, got {window_s!r}")
    faults = []
    for i, f in enumerate(d.get("fault", [])):
        where = f"fault[{i}]"
        kind = f.get("kind")
        if kind not in FAULT_PARAMS:
            raise _err(path, f"{where}.kind must be one of {sorted(FAULT_PARAMS)}, got {kind!r}")
        params = {k: v for k, v in f.items() if k not in ("kind", "ranks", "start_iter")}
        for k, v in params.items():
            if k not in FAULT_PARAMS[kind]:
                raise _err(path, f"{where}: {kind} takes {sorted(FAULT_PARAMS[kind]) or 'no parameters'}, not {k!r}")
            if not isinstance(v, FAULT_PARAMS[kind][k]) or isinstance(v, bool):
                raise _err(path, f"{where}.{k}: bad value {v!r}")
        missing = [k for k in REQUIRED[kind] if k not in params]
        if missing:
            raise _err(path, f"{where}: {kind} needs {missing}")
        if "where" in params and params["where"] not in WHERE:
            raise _err(path, f"{where}.where must be one of {WHERE}")
        if kind == "cpu_quota" and not 0 < params["fraction"] <= 1:
            raise _err(path, f"{where}.fraction must be in (0, 1]")
        start = f.get("start_iter", 0)
        if not isinstance(start, int) or start < 0:
            raise _err(path, f"{where}.start_iter must be a non-negative integer")
        ranks = _ranks(f.get("ranks", "*"), workers, path, where, seed, False)
        assert ranks is not None
        faults.append(Fault(kind, ranks, start, params))
    expect = tuple(_match(m, workers, path, f"expect[{i}]", seed) for i, m in enumerate(d.get("expect", [])))
    allow = tuple(_match(m, workers, path, f"allow[{i}]", seed) for i, m in enumerate(d.get("allow", [])))
    baseline = d.get("baseline", False)
    if not isinstance(baseline, bool):
        raise _err(path, f"baseline must be true or false, got {baseline!r}")
    return Scenario(name, path, workers, iterations, float(window_s), trigger, trigger_at, seed, tuple(faults), expect, allow,
                    baseline)


def load_scenario(path: str | Path, workers_override: int | None = None) -> Scenario:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"scenario {p}: cannot read ({exc.strerror})") from None
    return parse_scenario(text, str(p), workers_override)
