"""What each profile window cost this training process, and the budget it spends from (issue 30).

``WindowCostMeter`` (one per process, owned by the agent channel) measures a window online from
the runtime's iteration counter: at ``armed`` it takes the median iteration time of the iterations
before (``Runtime.recent_iteration_ms``), the time and the iteration count; ``after_s`` after the
window was delivered (written, or handed over) it takes them again. The cost is the wall time in
between minus what those iterations would have taken at the median before
(``window_budget.lost_s``): the slowdown while Kineto records, the profiler's stop, the writing and
the settling after it. It spends from a ``CostBudget`` (2 % of the training time in the trailing
hour, with an initial advance; window_budget.py), which accrues from the runtime's first hook
event (``Runtime.training_started_s``), and writes the ledger to ``<run_dir>/budget/<job>-rank<r>.json`` (``perftracker status`` reads it), only
through a run dir that passes ``rundir``'s checks, private (0700 folders, 0600 file). The
detector's automatic triggers ask the budget first; manual windows are never refused, and counted.

A process that ends before a window's after-phase is over (the job finished) has its window
measured at exit (``finish_at_exit``): from its arm to the last iteration boundary, against the
iterations that exist, labelled ``partial`` (no settling after it is counted; the exit's own delay
is not training time).

Never raises into the training loop; runs in the channel thread and a timer thread only.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from perftracker.rundir import RunDirError, write_in_run_dir
from perftracker.runtime.trigger.defer import TriggerDeferral
from perftracker.runtime.window.budget import CostBudget, lost_s, median

log = logging.getLogger(__name__)

AFTER_S = 5.0  # the after-phase: iterations this long after delivery still count (the job settling)
DETECTOR_REASONS = ("slowdown",)  # the reasons of automatic triggers; anything else is manual
# a session a detector's trigger opened reaches the worker (START_WINDOW) with the agent's description
# of that trigger, "rank 2: slowdown at iteration 312 (+18% over 45.1 ms)" (localizer_link.describe_trigger)
_DETECTOR_SESSION = re.compile(r"rank \d+: (?:" + "|".join(map(re.escape, DETECTOR_REASONS)) + r")\b")


def is_manual(reason: str) -> bool:
    """A window (or trigger) not opened by the detector: ``perftracker trigger``, a test, the demo's."""
    return reason not in DETECTOR_REASONS and _DETECTOR_SESSION.match(reason) is None


class _Counting(Protocol):
    @property
    def iteration(self) -> int: ...

    def recent_iteration_ms(self) -> list[float]: ...


def _started_s(runtime: object) -> float | None:
    """When training began, if the runtime can tell (``Runtime.training_started_s``)."""
    fn = getattr(runtime, "training_started_s", None)
    t = fn() if callable(fn) else None
    return float(t) if isinstance(t, (int, float)) else None


def _last_boundary_s(runtime: object) -> float | None:
    fn = getattr(runtime, "last_boundary_s", None)
    t = fn() if callable(fn) else None
    return float(t) if isinstance(t, (int, float)) else None


class WindowCostMeter:
    def __init__(self, runtime: _Counting, ledger: Path | None, budget: CostBudget | None = None,
                 after_s: float = AFTER_S, clock: Callable[[], float] = time.monotonic, hold: bool = True) -> None:
        self.runtime = runtime
        self.ledger = ledger
        self.budget = budget or CostBudget()
        self.after_s = after_s
        self.clock = clock
        self._lock = threading.Lock()
        self._open: dict[str, dict[str, Any]] = {}
        self.costs: list[dict[str, Any]] = []  # one per measured window, newest last
        self.deferral = TriggerDeferral()  # triggers held until worth a window
        self.hold = hold  # False: every trigger the budget allows goes out at once
        self._refused = False  # the ledger's run dir was refused once (logged)

    def _know_start(self) -> None:
        """The budget accrues from when training began: learn it from the runtime once."""
        if self.budget.started_s is None:
            self.budget.started_s = _started_s(self.runtime)

    # ---------------------------------------------------------------- the gate
    def allows_trigger(self, reason: str) -> bool:
        """An automatic trigger (the detector's) may send only when the budget can pay for the next
        window; others always may."""
        self._know_start()
        with self._lock:
            ok = self.budget.ask(self.clock(), manual=is_manual(reason))
        if not ok:
            self._write()
        return ok

    def hold_if_not_worth(self, reason: str, detail: Mapping[str, object]) -> bool:
        """An automatic trigger whose slowdown is not yet worth a window (``window_budget.worth_window``)
        is held (``trigger_defer``): True. Manual ones and those worth it now: False (send them)."""
        if not self.hold or is_manual(reason):
            return False
        self._know_start()
        ratio = detail.get("ratio")
        with self._lock:
            now = self.clock()
            if (not isinstance(ratio, (int, float)) or isinstance(ratio, bool)
                    or self.budget.worth(now, float(ratio))):
                return False  # sent now: its window will cover a held one (armed)
            held = self.deferral.hold(reason, detail, now)
        if held:
            self._write()
        return held

    def due_held_trigger(self) -> tuple[str, dict[str, object]] | None:
        """A held trigger to send now (still slow and now worth a window), or None."""
        self._know_start()
        with self._lock:
            if self.deferral.held is None:
                return None
            now = self.clock()
            # worth it and affordable now: a refused one stays held (the budget refills)
            due = self.deferral.check(now, self.runtime.recent_iteration_ms(),
                                      lambda ratio: self.budget.worth(now, ratio) and self.budget.allows(now))
            settled = self.deferral.held is None  # sent, let go or expired: the counts moved
        if settled:
            self._write()
        return due

    # ---------------------------------------------------------------- one window
    def armed(self, session: str, reason: str) -> None:
        try:
            with self._lock:
                self.deferral.cover()  # this window profiles a held slowdown too
            self._know_start()
            base_s = median(self.runtime.recent_iteration_ms()) / 1e3
            with self._lock:
                self._open[session] = {"t0": self.clock(), "it0": int(self.runtime.iteration), "base_s": base_s,
                                       "manual": is_manual(reason), "reason": reason}
        except Exception:  # noqa: BLE001 - never into training
            log.debug("perftracker: window cost: arm failed", exc_info=True)

    def delivered(self, session: str) -> None:
        """The window is written or handed over: measure its cost ``after_s`` from now."""
        t = threading.Timer(self.after_s, self.measure, args=(session,))
        t.name = "perftracker-window-cost"
        t.daemon = True
        t.start()

    def measure(self, session: str, partial: bool = False) -> dict[str, Any] | None:
        """The window's cost now (its after-phase is over), spent from the budget and written to the
        ledger; once per window. ``partial``: the process is ending before that: measured from the
        arm to the last iteration boundary, with the iterations that exist."""
        try:
            with self._lock:
                w = self._open.pop(session, None)
                if w is None or w["base_s"] <= 0:
                    return None
                now = self.clock()
                iterations = int(self.runtime.iteration) - w["it0"]
                end = now
                if partial:
                    last = _last_boundary_s(self.runtime)
                    end = min(now, max(last, w["t0"])) if last is not None else now
                lost = lost_s(end - w["t0"], iterations, w["base_s"])
                self.budget.spend(now, lost, w["manual"], session)
                cost = {"session": session, "reason": w["reason"], "manual": w["manual"], "lost_s": round(lost, 3),
                        "measured_s": round(end - w["t0"], 3), "iterations": iterations,
                        "baseline_iteration_ms": round(w["base_s"] * 1e3, 3), "partial": partial}
                self.costs = [*self.costs[-19:], cost]
                left = self.budget.left_s(now)
                allowed = self.budget.allowance_s(now)
            log.info("perftracker: window %s cost %.2f s of training over %.1f s%s (budget left %.1f s of %.1f s)",
                     session, lost, cost["measured_s"], " (partial: the process ended)" if partial else "",
                     left, allowed)
            self._write()
            return cost
        except Exception:  # noqa: BLE001
            log.debug("perftracker: window cost: measure failed", exc_info=True)
            return None

    def finish_at_exit(self) -> list[dict[str, Any]]:
        """The process is ending: measure every window not measured yet (partial), so that its cost
        is in the ledger. Never raises."""
        try:
            with self._lock:
                open_sessions = list(self._open)
            return [c for c in (self.measure(s, partial=True) for s in open_sessions) if c is not None]
        except Exception:  # noqa: BLE001 - at exit
            log.debug("perftracker: window cost: exit measure failed", exc_info=True)
            return []

    # ---------------------------------------------------------------- the ledger
    def to_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"budget": self.budget.to_dict(self.clock()), "windows": list(self.costs),
                    "held_triggers": self.deferral.to_dict(), "written_unix_s": time.time()}

    def _write(self) -> None:
        """The ledger, written only through a run dir that passes its checks, as a new private
        file (``rundir.write_in_run_dir``: issue 46); a refused run dir is logged once."""
        if self.ledger is None:
            return
        try:
            write_in_run_dir(self.ledger.parent.parent, self.ledger, json.dumps(self.to_dict()))
        except (OSError, ValueError, RunDirError) as exc:
            if not self._refused:
                self._refused = True
                log.warning("perftracker: window cost ledger not written: %s", exc)
            else:
                log.debug("perftracker: window cost ledger not written: %s", exc)


def report_fields(budget: Mapping[str, Any] | None, window_s: float, blocking_s: float,
                  cost: Mapping[str, Any] | None = None) -> dict[str, float]:
    """What a window's WINDOW_DONE tells the report about its cost (``Report.window_cost``): how long
    it recorded, how long its stop blocked training, and the budget as it stood when the window
    opened (``CostBudget.to_dict`` then). The window's own measured cost normally comes 5 s after it
    was delivered, after the report (``perftracker status`` shows it); a window delivered as its
    process ends is measured then (``cost``, partial: ``cost_s`` and ``cost_partial`` 1)."""
    out = {"window_s": round(max(0.0, float(window_s)), 3), "blocked_s": round(max(0.0, float(blocking_s)), 3)}
    if budget:
        for key, src in (("budget_s", "allowance_s"), ("spent_s", "spent_s"), ("left_s", "left_s"),
                         ("last_cost_s", "last_window_lost_s")):
            v = budget.get(src, budget.get("limit_s") if src == "allowance_s" else None)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                out[key] = round(float(v), 3)
    if cost:
        v = cost.get("lost_s")
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out["cost_s"] = round(max(0.0, float(v)), 3)
            out["cost_partial"] = 1.0 if cost.get("partial") else 0.0
    return out


def ledger_path(run_dir: str | os.PathLike[str], job: str, rank: int) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(job)) or "job"
    return Path(run_dir) / "budget" / f"{safe}-rank{int(rank)}.json"
