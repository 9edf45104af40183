"""When a job's healthy baseline is taken, and how each report is compared with it (issue 49).

The localizer opens one short window per job once the job runs steadily: every rank of its world
has completed ``min_iterations`` (far past the detector's learning, 10 iteration sequences), and
the job's median iteration time of the last ``steady_beats`` heartbeats stays within
``steady_spread``. That window is a session like any other (its reason is ``baseline``, it
reaches the workers the way a ``perftracker trigger`` does, its cost is spent from each rank's
window budget and shown in its report); when it is localized, its pattern sets become the job's
baseline in the store (perftracker.localizer.store.baseline_store), unless a slowdown trigger joined
it (the job was not healthy then: the next steady period is taken instead). Every later slowdown
report of the job is compared with it (perftracker.localizer.diagnose.verdict.since_fast); a
report of a job without one says so.

Kept per job name: a restart under the same name keeps the baseline (the keeper looks in the store
first). ``retake`` drops it; the next steady period is taken.

**[decision]** The automatic window is off unless the localizer runs with ``PERFTRACKER_BASELINE=1``
(issue 49's first cut: every job would otherwise gain one window, which changes what the fault suite,
the system tests and the overhead benchmarks measure; flipping the default is one line here once
they have been rerun with it). A job's baseline can also be taken by hand, whatever the setting:
``perftracker trigger --job JOB --reason baseline`` while the job runs well.
``PERFTRACKER_BASELINE_WINDOW_S`` sets the automatic window's length (default 5 s).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from perftracker.localizer.store.sqlite_store import SessionRecord, Store

from perftracker.model import Report

if TYPE_CHECKING:
    from perftracker.localizer.diagnose.method.arrays import PatternArrays
    from perftracker.localizer.diagnose.verdict.since_fast import JobBaseline

log = logging.getLogger(__name__)

BASELINE_REASON = "baseline"


def is_baseline(reason: str) -> bool:
    """A session opened to take the job's baseline (automatic, or ``perftracker trigger --reason baseline``)."""
    return reason == BASELINE_REASON or reason.startswith(BASELINE_REASON + ":")


def _env_float(name: str, default: float) -> float:
    try:
        v = float(os.environ.get(name, "") or default)
    except ValueError:
        log.warning("%s=%r is not a number; using %s", name, os.environ.get(name), default)
        return default
    return v if 0.5 <= v <= 120 else default


@dataclass(frozen=True)
class BaselineOptions:
    enabled: bool = field(default_factory=lambda: os.environ.get("PERFTRACKER_BASELINE", "") == "1")
    window_s: float = field(default_factory=lambda: _env_float("PERFTRACKER_BASELINE_WINDOW_S", 5.0))
    min_iterations: int = 50  # every rank past it
    steady_beats: int = 3  # heartbeats (2 s apart by default) whose job median iteration time agrees
    steady_spread: float = 0.15  # max / min - 1 of those medians
    max_jobs: int = 10_000  # jobs followed in memory


@dataclass
class _Job:
    ranks: dict[int, tuple[int, float]] = field(default_factory=dict)  # rank -> (iteration, iteration_ms)
    medians: deque[float] = field(default_factory=lambda: deque(maxlen=16))
    session: str = ""  # the baseline session opened and not yet settled


def median(values: Sequence[float]) -> float:
    s = sorted(values)
    n = len(s)
    return 0.0 if n == 0 else (s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2)


class BaselineKeeper:
    """Follows each job's heartbeats, says when to open its baseline window, keeps the window's
    patterns as the job's baseline and compares every other report with it."""

    def __init__(self, store: Store, options: BaselineOptions | None = None,
                 now_ns: Callable[[], int] | None = None) -> None:
        self.store = store
        self.options = options or BaselineOptions()
        self._now_ns = now_ns
        self._jobs: dict[str, _Job] = {}
        self._loaded: dict[str, JobBaseline] = {}  # job -> its baseline as arrays (the store's session)
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- when to take it
    def heard(self, job: str, beats: Sequence[tuple[int, int, float]], world: int) -> bool:
        """A heartbeat's (rank, iteration, iteration_ms) rows. True: open the job's baseline window now."""
        if not self.options.enabled:
            return False
        with self._lock:
            j = self._jobs.get(job)
            if j is None:
                if len(self._jobs) >= self.options.max_jobs:
                    self._jobs.clear()
                j = self._jobs[job] = _Job()
            if j.session:
                return False
        if self.store.baselines.info(job):  # looked up each time: a retake from another process shows at once
            return False
        with self._lock:
            for rank, iteration, ms in beats:
                j.ranks[rank] = (iteration, ms)
            rows = list(j.ranks.values())
            if len(rows) < max(world, 1) or any(it < self.options.min_iterations or ms <= 0 for it, ms in rows):
                j.medians.clear()
                return False
            j.medians.append(median([ms for _, ms in rows]))
            last = list(j.medians)[-self.options.steady_beats:]
            return len(last) >= self.options.steady_beats and max(last) <= min(last) * (1 + self.options.steady_spread)

    def opened(self, job: str, session: str) -> None:
        """The job's baseline session is open (no second one until it settles)."""
        with self._lock:
            self._jobs.setdefault(job, _Job()).session = session

    def settled(self, job: str, session: str) -> None:
        """The baseline session ended (stored or failed): the keeper looks at the store again."""
        with self._lock:
            j = self._jobs.get(job)
            if j is not None and j.session == session:
                j.session = ""
                j.medians.clear()

    def retake(self, job: str) -> int:
        """Drop the job's baseline; the next steady period is taken. Returns the rank rows dropped."""
        n = self.store.baselines.forget(job)
        with self._lock:
            self._loaded.pop(job, None)
            j = self._jobs.get(job)
            if j is not None:
                j.medians.clear()
        log.info("job %s: baseline dropped (%d rank(s)); the next steady window is the new one", job, n)
        return n

    # ---------------------------------------------------------------- each report
    def load(self, job: str) -> JobBaseline | None:
        """The job's baseline as arrays (read once per baseline session), or None."""
        from perftracker.localizer.diagnose.method.arrays import pattern_sets_to_arrays
        from perftracker.localizer.diagnose.verdict.since_fast import JobBaseline

        info = self.store.baselines.info(job)
        if not info:
            return None
        with self._lock:
            cached = self._loaded.get(job)
        if cached is not None and cached.session == info[0].session:
            return cached
        got = self.store.baselines.get(job)
        if got is None:
            return None
        session, taken_ns, sets = got
        base = JobBaseline(session, taken_ns, pattern_sets_to_arrays(sets))
        with self._lock:
            if len(self._loaded) > 64:
                self._loaded.clear()
            self._loaded[job] = base
        return base

    def previous(self, s: SessionRecord) -> Report | None:
        """The job's latest stored slowdown report before ``s`` that predicted a saving (of the last 20
        sessions), for "did the fix pay"; None: none."""
        for prev in self.store.sessions(job=s.job, states=("done",), limit=20, newest_first=True,
                                        before_seq=s.seq or None, with_uploaded=False):
            if prev.kind != "slowdown" or is_baseline(prev.reason):
                continue
            rep = self.store.events.get_report(prev.session)
            if rep is not None and rep.kind == "slowdown" and any(f.saves_share > 0 for f in rep.findings):
                # its age on the sessions' clock (the one ``now`` comes from), not the report's own
                return dataclasses.replace(rep, created_ns=prev.closed_ns or rep.created_ns)
        return None

    def after_localize(self, s: SessionRecord, arr: PatternArrays, report: Report) -> Report:
        """A slowdown report just localized: a baseline session's patterns become the job's baseline;
        any other report is compared with the baseline. Never raises (the report stands without it)."""
        from perftracker.localizer.diagnose.evidence.baseline import median_step_ms
        from perftracker.localizer.diagnose.verdict.since_fast import with_since_fast

        from perftracker.model.since_fast import SinceFast

        now = self._now_ns() if self._now_ns is not None else report.created_ns
        try:
            if is_baseline(s.reason):
                if s.joins:
                    note = ("not kept as the job's baseline: a slowdown trigger joined its window "
                            "(the next steady period is taken)")
                    return _with(report, SinceFast(note=note))
                self.store.baselines.put(s.job, s.session, now, self.store.pattern_sets(s.session))
                with self._lock:
                    self._loaded.pop(s.job, None)
                step = median_step_ms(arr.iteration_ms)
                log.info("job %s: baseline taken from session %s (%d rank(s), step %.1f ms)", s.job, s.session,
                         arr.n_workers, step)
                return _with(report, SinceFast(note="this window is the job's baseline: later reports are "
                                                    "compared with it", baseline_session=s.session,
                                               taken_ns=now, step_ms_then=step, step_ms_now=step))
            return with_since_fast(report, arr, self.load(s.job), now, previous=self.previous(s))
        except Exception:  # noqa: BLE001 - the report is stored without the comparison
            log.exception("session %s: the baseline comparison failed; the report goes without it", s.session)
            return report


def _with(report: Report, line: Any) -> Report:
    return dataclasses.replace(report, since_fast=line)


__all__ = ["BASELINE_REASON", "BaselineKeeper", "BaselineOptions", "is_baseline"]
