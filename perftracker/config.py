"""One frozen configuration for the in-process side, read from PERFTRACKER_* environment variables.

Each field maps to the environment variable PERFTRACKER_<FIELD NAME IN UPPER CASE>, for example
``window_s`` <- ``PERFTRACKER_WINDOW_S``. Values are parsed by the field's type; a bad value raises
ConfigError naming the variable.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from perftracker.errors import ConfigError
from perftracker.model.window_length import DEFAULT_WINDOW_S, window_s_error


def _default_run_dir() -> str:
    return os.path.join(tempfile.gettempdir(), f"perftracker-{os.getuid()}")


WINDOW_STACKS = ("sample", "remote", "tracer", "off")
WINDOW_WRITERS = ("fork", "thread")


@dataclass(frozen=True)
class Config:
    # --- switches -------------------------------------------------------------------------------
    disable: bool = False  # PERFTRACKER_DISABLE=1 opts out entirely
    log_level: str = "WARNING"

    # --- detection (docs/design.md section 3) ---------------------------------------------------
    detector_mode: str = "changepoint"  # "paper" | "changepoint"; default chosen by bench/detector.py
    learn_sequences: int = 10  # N: identical consecutive sequences before the sequence is learned
    slowdown_window_iters: int = 50  # W: iterations in the slowdown mean
    slowdown_threshold: float = 0.05  # mean of last W > (1 + threshold) * recent shortest
    redetect_events: int = 200  # M: unmatched consecutive events before re-detection
    blocked_factor: float = 5.0  # blocked when idle >= factor * mean iteration duration ...
    blocked_min_s: float = 5.0  # ... and at least this long
    hang_pause_s: float = 60.0  # a pause of all ranks in user code shorter than this is not a hang
    # automatic triggers: at most trigger_burst close together, one per trigger_cooldown_s over
    # time; detections within window_s of a trigger are absorbed by its window (trigger_gate.py)
    trigger_cooldown_s: float = 120.0
    trigger_burst: int = 2
    changepoint_z: float = 5.0  # changepoint mode: noise standard errors a window must exceed
    changepoint_ref_iters: int = 300  # changepoint mode: reference window (iterations)

    # --- profile window (docs/design.md section 4) ----------------------------------------------
    window_s: float = DEFAULT_WINDOW_S  # perftracker/model/window_length.py
    # Python stacks in a window: "sample" (a 1 ms sampler thread, the default), "tracer" (torch's
    # Python tracer: exact, much slower) or "off". See docs/profile-window.md, "Known risk".
    window_stacks: str = "sample"
    window_stack_period_us: int = 1000  # the stack sampler's period (thread or sampler process)
    # who converts the profiler result into the raw file: "fork" (a forked child, SCHED_IDLE; the
    # training process converts it itself if the child fails, and in a thread where RDMA memory is
    # not fork-protected: perftracker/runtime/fork_safety.py) or "thread" (a throttled thread)
    window_writer: str = "fork"
    # at exit, the longest wait to hand an open or unwritten window to the agent (window_exit.py)
    exit_delay_s: float = 7.0
    # end a window once its phases converged (>= 20 iterations and 5 s, each phase's share of the
    # time within window_tolerance between its two halves; convergence.py); window_s is the upper bound.
    # On by default since the quiet fault suites with 20 s windows found as much with it as without
    # (docs/profile-window.md, "How long a window lasts"); PERFTRACKER_WINDOW_CONVERGE=0: always window_s
    window_converge: bool = True
    window_tolerance: float = 0.10
    # the detector's windows spend at most this fraction of training time over any hour (measured
    # loss, window_cost.py); manual triggers are counted, never refused
    window_budget: float = 0.02
    # ... and an advance on that 2 % for a job's first window, paid back by the training after it:
    # the allowance is max(this, window_budget x training time in the trailing hour) (window_budget.py)
    window_budget_initial_s: float = 10.0
    # hold a detector's trigger until its slowdown is worth a window: (1 - 1/ratio) x training time >=
    # the window's expected cost (window_budget.worth_window, trigger_defer.py); 0: send it at once
    window_hold: bool = True

    # --- wiring (docs/design.md section 7) -----------------------------------------------------
    run_dir: str = field(default_factory=_default_run_dir)  # unix socket + raw windows live here
    job_id: str = ""  # empty: derived from TORCHELASTIC_RUN_ID or the script name
    localizer_url: str = ""  # empty: the embedded localizer of the node agent
    token: str = ""  # bearer token for the localizer
    autostart_agent: bool = True  # start a node agent on first import when none is running

    def __post_init__(self) -> None:
        if self.trigger_burst < 1:
            raise ConfigError(f"PERFTRACKER_TRIGGER_BURST={self.trigger_burst}: expected at least 1")
        if not 0.0 <= self.exit_delay_s <= 60.0:
            raise ConfigError(f"PERFTRACKER_EXIT_DELAY_S={self.exit_delay_s}: expected 0 to 60 seconds")
        if self.window_writer not in WINDOW_WRITERS:
            raise ConfigError(f"PERFTRACKER_WINDOW_WRITER={self.window_writer!r}: expected one of {', '.join(WINDOW_WRITERS)}")
        if not 0.0 <= self.window_budget <= 1.0:
            raise ConfigError(f"PERFTRACKER_WINDOW_BUDGET={self.window_budget}: expected a fraction in [0, 1]")
        if not 0.0 <= self.window_budget_initial_s <= 3600.0:
            raise ConfigError(f"PERFTRACKER_WINDOW_BUDGET_INITIAL_S={self.window_budget_initial_s}: "
                              "expected 0 to 3600 seconds")
        if not 0.0 < self.window_tolerance <= 1.0:
            raise ConfigError(f"PERFTRACKER_WINDOW_TOLERANCE={self.window_tolerance}: expected a fraction in (0, 1]")
        if window_s_error(self.window_s):
            raise ConfigError(f"PERFTRACKER_WINDOW_S={self.window_s}: {window_s_error(self.window_s)}")
        if not 100 <= self.window_stack_period_us <= 100_000:
            raise ConfigError(f"PERFTRACKER_WINDOW_STACK_PERIOD_US={self.window_stack_period_us}: expected 100 to 100000")
        if self.window_stacks not in WINDOW_STACKS:
            raise ConfigError(f"PERFTRACKER_WINDOW_STACKS={self.window_stacks!r}: expected one of {', '.join(WINDOW_STACKS)}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Config:
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            var = "PERFTRACKER_" + f.name.upper()
            if var in env:
                values[f.name] = _parse(var, env[var], f.type)
        values.update(overrides)
        return cls(**values)


def _parse(var: str, raw: str, type_name: Any) -> Any:
    t = type_name if isinstance(type_name, str) else getattr(type_name, "__name__", str(type_name))
    try:
        if t == "bool":
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
        if t == "int":
            return int(raw)
        if t == "float":
            return float(raw)
        return raw
    except ValueError:
        raise ConfigError(f"{var}={raw!r} is not a valid {t}") from None
