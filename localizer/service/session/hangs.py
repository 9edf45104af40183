"""Hang snapshots of a session: ``HangSessions`` is a part of
``perftracker.localizer.service.session.manager.SessionManager``, which owns it and calls it.

A snapshot attaches to its session, or to the job's open session, or opens a hang session; a
rank's report of a hang that is already reported opens none, nor does a failure snapshot (a
survivor that failed late) after the job's crash session closed (issue 22). A stored hang report becomes
"resolved" once the job's heartbeats show it moved on. The part owns what it remembers for that:
the hang sessions whose ranks all pause, the unresolved hang reports and each job's crash session.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Protocol

from perftracker.localizer.service.bounds import check_hang_snapshot
from perftracker.localizer.service.session.options import SessionOptions
from perftracker.localizer.service.session.reports import CRASH, HANG
from perftracker.localizer.service.session.uploads import PatternUploads
from perftracker.localizer.store.records import SessionRecord
from perftracker.localizer.store.sqlite_store import Store

from perftracker.clock import Clock
from perftracker.model import HangSnapshot, Report

log = logging.getLogger(__name__)


class _Trigger(Protocol):
    """Opens or joins a session of a job (``SessionManager.trigger``)."""

    def __call__(self, job: str, reason: str, window_s: float | None = None,
                 kind: str = ..., quota_key: str | None = ...) -> tuple[SessionRecord, bool]: ...


class HangSessions:
    """The hang part of the SessionManager. ``lock`` is the manager's; ``uploads`` its uploads part
    (a snapshot is an upload of its rank); ``trigger`` opens a hang session."""

    def __init__(self, store: Store, clock: Clock, options: SessionOptions, lock: threading.RLock,
                 uploads: PatternUploads, trigger: _Trigger) -> None:
        self.store = store
        self.clock = clock
        self.options = options
        self._lock = lock
        self._uploads = uploads
        self._trigger = trigger
        self._paused: set[str] = set()  # hang sessions whose ranks all pause: not due until the recheck
        self._unresolved_hangs: dict[str, str] = {}  # session -> job: hang reports until the job resumes
        self._crashes: dict[str, tuple[str, int]] = {}  # job -> (session, stored ns) of its crash session (issue 22)

    # ---------------------------------------------------------------- what the manager asks
    def is_paused(self, session: str) -> bool:
        return session in self._paused

    def pause(self, session: str) -> None:
        """Every rank of the hang session pauses: not due until its deadline or a new snapshot."""
        self._paused.add(session)

    def unpause(self, session: str) -> None:
        self._paused.discard(session)

    def has_unresolved(self, job: str) -> bool:
        """Whether a stored hang report of ``job`` waits for the job to resume."""
        return job in self._unresolved_hangs.values()

    def stored(self, report: Report, now_ns: int) -> None:
        """A report was stored: a hang report waits to be resolved, a crash report takes late failures."""
        if report.kind == HANG and report.status in ("complete", "partial"):
            self._unresolved_hangs[report.session] = report.job
        if report.kind == CRASH:
            self._crashes[report.job] = (report.session, now_ns)  # late failures: no new session

    # ---------------------------------------------------------------- snapshots
    def accept_hang_snapshot(self, snap: HangSnapshot, quota_key: str | None = None) -> SessionRecord:
        """Attach a snapshot to its session, or to the job's open session, or open a hang session
        (which counts against ``quota_key``'s triggers per minute, as a trigger does: issue 46)."""
        now = self.clock.now_ns()
        check_hang_snapshot(snap, self._uploads.world_of(snap.job))
        with self._lock:
            if snap.session:
                s = self._uploads.open_session_for(snap.session, snap.job, [snap.rank])
            else:
                seen = self._reported_hang_of(snap)
                if seen is not None:  # this rank's stop is in a stored hang report already
                    log.info("hang snapshot of rank %d (job %s, iteration %d) belongs to reported hang session "
                             "%s; no new session", snap.rank, snap.job, snap.last_iteration, seen)
                    return self._uploads.view(seen)
                crash = self._crashes.get(snap.job)
                if (snap.end or snap.error) and crash is not None \
                        and now - crash[1] < self.options.crash_follow_s * 1e9:
                    prev = self.store.get_session(crash[0], with_uploaded=False)
                    if prev is not None and prev.state != "open":  # (an open one is joined below)
                        log.info("failure snapshot of rank %d (job %s) came after crash session %s closed; "
                                 "no new session", snap.rank, snap.job, crash[0])
                        return self._uploads.view(crash[0])
                reason = (f"crash: rank {snap.rank} {(snap.error or snap.end)[:80]}" if snap.end or snap.error
                          else f"hang: rank {snap.rank} blocked {snap.idle_s:.0f} s")
                s, _ = self._trigger(snap.job, reason, kind=HANG, quota_key=quota_key)
                self._uploads.open_session_for(s.session, snap.job, [snap.rank])
            if s.kind != HANG:  # asked for by a slowdown session's id: converted explicitly, and said so
                log.info("slowdown session %s converted to a hang session: rank %d sent a hang snapshot for it",
                         s.session, snap.rank)
                deadline = min(s.deadline_ns, now + int(self.options.hang_collect_s * 1e9))
                self.store.update_session(s.session, kind=HANG, deadline_ns=deadline)
            if snap.end or snap.error:  # later failures of the job's ranks belong to this crash (issue 22)
                first = self._crashes.get(snap.job)
                if first is None or (first[0] != s.session
                                     and now - first[1] >= self.options.crash_follow_s * 1e9):
                    self._crashes[snap.job] = (s.session, now)
            uploaded = self._uploads.uploaded_of(s.session)
            self.store.events.put_hang_snapshot(snap, s.session, now)
            self._paused.discard(s.session)
            self.store.on_commit(lambda: self._uploads.count(s.session, snap.rank))
            return dataclasses.replace(self._uploads.view(s.session), uploaded=tuple(sorted({*uploaded, snap.rank})))

    def _reported_hang_of(self, snap: HangSnapshot) -> str | None:
        """The unresolved hang session whose report already has this rank stopped at this iteration.

        Every rank's detector reports the same hang, a few hundred ms apart; when the session the
        first one opened is complete and reported before a slower rank's own report arrives, that
        report is the same hang, not a new one (seen in the fault bench: two hang sessions)."""
        for session, job in self._unresolved_hangs.items():
            if job != snap.job:
                continue
            if any(h.rank == snap.rank and h.last_iteration == snap.last_iteration
                   for h in self.store.events.hang_snapshots(session)):
                return session
        return None

    def resolve_hangs(self, job: str) -> None:
        """Recovery: a stored hang report of this job becomes "resolved" once the job moves on."""
        from perftracker.localizer.diagnose.incidents.hang import (
            job_resumed,  # lazy: owned by the hangs stage
        )

        beats = [(h.rank, h.iteration, h.received_ns) for h in self.store.events.heartbeats(job)]
        for session in [k for k, j in self._unresolved_hangs.items() if j == job]:
            report = self.store.events.get_report(session)
            if report is None or not job_resumed(self.store.events.hang_snapshots(session), beats):
                continue
            top = max(it for _, it, _ in beats)
            self.store.events.put_report(dataclasses.replace(
                report, status="resolved", summary=f"{report.summary} (resolved: the job resumed, iteration {top})"))
            del self._unresolved_hangs[session]
            log.info("hang session %s resolved: job %s resumed", session, job)
