"""Sessions: the state machine from a trigger to a stored report.

A trigger opens a session for its job; triggers that arrive while that session's window may still
be running join it. A slowdown trigger that comes later (the window is over, the session still
collecting uploads) opens the next session instead: the window may have missed that slowdown, and
the agents run the job's sessions one after another. The expected workers are the job's registered ranks (plus every rank below the largest registered
world size, so that a node whose agent never registered is named as missing). A session is *due*
when every expected rank has uploaded (patterns or a hang snapshot) or is known dead, or when its
deadline passes; it is then localized and ends ``done`` with a report whose ``ranks_missing``
names who did not upload (status "partial"), or ``failed`` with an error.

States: ``open`` -> ``localizing`` -> ``done`` | ``failed``. A restart puts ``localizing`` sessions
back to ``open`` so that they are localized again; nothing acknowledged is lost because it is in
the store.

The manager does no networking and no waiting; time comes from an injected Clock (wall-clock ns,
so deadlines survive a restart). ``build_report`` is the CPU-heavy step the service runs in an
executor; the reports themselves are built in perftracker.localizer.service.session.reports.

The manager owns two parts and calls them: ``uploads`` (``PatternUploads``,
perftracker.localizer.service.session.uploads: checks, commits and counts uploads, and holds their
columns) and ``hangs`` (``HangSessions``, perftracker.localizer.service.session.hangs: hang
snapshots, paused and unresolved hangs, crashes). All three share the manager's lock.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from perftracker.localizer.service.columns import ColumnCache
from perftracker.localizer.service.job_limits import TriggerQuota, check_open_sessions
from perftracker.localizer.service.ownership import Ownership, hash_key
from perftracker.localizer.service.session.baseline import (
    BASELINE_REASON,
    BaselineKeeper,
    is_baseline,
)
from perftracker.localizer.service.session.first_look import FirstLookPhases
from perftracker.localizer.service.session.hangs import HangSessions
from perftracker.localizer.service.session.options import SessionOptions
from perftracker.localizer.service.session.reports import (
    HANG,
    PAUSE,
    RESUMED,
    SLOWDOWN,
    build_hang_report,
)
from perftracker.localizer.service.session.uploads import PatternUploads
from perftracker.localizer.service.validate import Heartbeat, Registration, RequestError
from perftracker.localizer.store.rank_ranges import RankRanges
from perftracker.localizer.store.sqlite_store import (
    HeartbeatRecord,
    SessionRecord,
    Store,
    WorkerRecord,
)

from perftracker.clock import Clock
from perftracker.model import HangSnapshot, PatternSet, Report
from perftracker.model.kinds import SessionState
from perftracker.model.trigger import Detection
from perftracker.wire.patterns import PatternBatch

log = logging.getLogger(__name__)

OPEN, LOCALIZING, DONE, FAILED = SessionState.OPEN, SessionState.LOCALIZING, SessionState.DONE, SessionState.FAILED
TRUSTED = object()  # an in-process caller (no HTTP request): no agent-key checks


class WallClock:
    """Wall-clock ns. Sessions use it because their times are stored and shown to people."""

    def now_ns(self) -> int:
        return time.time_ns()


@dataclass(frozen=True)
class Trigger:
    """What a long-polling agent receives."""

    session: str
    window_s: float
    reason: str
    kind: str

    def to_dict(self) -> dict[str, Any]:
        return {"session": self.session, "window_s": self.window_s, "reason": self.reason, "kind": self.kind}


def _new_session_id(now_ns: int) -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(now_ns / 1e9)) + "-" + secrets.token_hex(3)


def expected_ranks(workers: Sequence[WorkerRecord], limit: int) -> RankRanges:
    """Registered ranks plus every rank below the largest registered world size (at most ``limit``),
    as ranges: O(registrations) memory, not O(the world size they claim)."""
    world = max((w.world_size for w in workers), default=0)
    return RankRanges.span(min(world, limit)) | RankRanges.of(w.rank for w in workers)


class SessionManager:
    """Opens, joins, fills and closes sessions over a Store (see the module docstring for its parts)."""

    def __init__(self, store: Store, clock: Clock | None = None, options: SessionOptions | None = None) -> None:
        self.store = store
        self.clock: Clock = clock or WallClock()
        self.options = options or SessionOptions()
        self.first_look = FirstLookPhases()  # the heartbeats' phase times (issue 30)
        self._lock = threading.RLock()  # the service's loop and the executor both call in
        self._extended: set[str] = set()  # sessions kept open for a busy rank (logged once each)
        self.uploads = PatternUploads(store, self.clock, self._lock, self.options.max_cached_set_bytes,
                                      self.dead_ranks)
        self.hangs = HangSessions(store, self.clock, self.options, self._lock, self.uploads, self.trigger)
        self.ownership = Ownership(store, self.options.agent_dead_s, lambda job: set(self._dead_of(job)))
        self.issued_key: str | None = None
        self._dead: dict[str, dict[int, int]] = {}  # job -> rank -> received_ns of a "never answers" beat
        self._quota = TriggerQuota(self.options.triggers_per_minute)  # sessions opened per token, per minute
        self._world: dict[str, int] = {}  # job -> registered world (world_of), dropped on registration
        self.uploads.world_of = self.world_of
        self.baseline = BaselineKeeper(store, now_ns=self.clock.now_ns)  # each job's healthy baseline (issue 49)

    @property
    def cache(self) -> ColumnCache:
        """The uploads as arrays (bounded), held by the uploads part."""
        return self.uploads.cache

    # ---------------------------------------------------------------- startup
    def recover(self) -> list[str]:
        """After a restart: sessions caught mid-localization go back to open. Returns their ids."""
        back = []
        for s in list(self.store.iter_sessions(states=(LOCALIZING,), with_uploaded=False)):
            self.store.update_session(s.session, state=OPEN)
            back.append(s.session)
        if back:
            log.info("re-opened %d session(s) interrupted while localizing: %s", len(back), back)
        return back

    # ---------------------------------------------------------------- agents
    def register(self, reg: Registration, agent_key: str | None | object = TRUSTED) -> list[str]:
        """Store a registration (409 when another live agent owns a rank: perftracker.localizer.service.ownership). Open
        sessions of the job now also expect its ranks; returns them. A newly issued agent key is
        left in ``self.issued_key``. ``agent_key`` is what the request presented (None: nothing);
        TRUSTED (in-process callers) skips the ownership checks."""
        now = self.clock.now_ns()
        records = [WorkerRecord(reg.job, w.rank, reg.agent_id, w.local_rank, w.world_size, w.pid, w.tid,
                                w.host or reg.host) for w in reg.workers]
        with self._lock:
            new_key = None
            if agent_key is not TRUSTED:
                new_key = self.ownership.check_register(reg.job, reg.agent_id, [w.rank for w in reg.workers],
                                                        agent_key if isinstance(agent_key, str) else None, now)
            self.store.register(reg.job, reg.agent_id, reg.host, records, now,
                                key_hash=hash_key(new_key) if new_key else None)
            self.issued_key = new_key
            grown = []
            self._world.pop(reg.job, None)
            for s in list(self.store.iter_sessions(job=reg.job, states=(OPEN,), with_uploaded=False)):
                exp = s.expected | expected_ranks(records, self.options.max_expected_ranks)
                if exp != s.expected:
                    self.store.update_session(s.session, expected=exp)
                    grown.append(s.session)
            return grown

    def world_of(self, job: str) -> int:
        """The job's registered world: the largest world size its registrations name (0: none).
        Uploads and hang snapshots must carry it (perftracker.localizer.service.bounds)."""
        with self._lock:
            world = self._world.get(job)
            if world is None:
                world = self._world[job] = self.store.world_size(job)
            return world

    def register_agent(self, reg: Registration, agent_key: str | None) -> tuple[list[str], str | None]:
        """``register``, returning (sessions grown, the agent key issued now or None)."""
        with self._lock:
            grown = self.register(reg, agent_key)
            return grown, self.issued_key

    def heartbeat(self, hb: Heartbeat, agent_key: str | None | object = TRUSTED) -> None:
        now = self.clock.now_ns()
        if agent_key is not TRUSTED:
            self.ownership.check_agent(hb.job, hb.agent_id, agent_key if isinstance(agent_key, str) else None)
        mine = (self.ownership.owned_ranks(hb.job, hb.agent_id, [r.rank for r in hb.ranks], now)
                if agent_key is not TRUSTED else {r.rank for r in hb.ranks})
        if len(mine) < len(hb.ranks):  # another live agent's ranks: not this agent's to report on
            log.warning("heartbeat of agent %s (job %s): dropped rank(s) %s owned by another agent", hb.agent_id,
                        hb.job, sorted({r.rank for r in hb.ranks} - mine))
            hb = dataclasses.replace(hb, ranks=tuple(r for r in hb.ranks if r.rank in mine))
        self.first_look.heard(hb.job, hb.ranks, now)
        self.store.events.put_heartbeats([HeartbeatRecord(hb.job, r.rank, hb.agent_id, r.iteration, r.phase,
                                                   r.last_event_age_s, r.alive, r.iteration_ms, now)
                                   for r in hb.ranks])
        self.store.touch_agent(hb.job, hb.agent_id, now)
        from perftracker.localizer.diagnose.incidents.hang import (
            never_answers,  # lazy: owned by the hangs stage
        )

        with self._lock:
            dead = self._dead_of(hb.job)
            for r in hb.ranks:
                if never_answers(r.alive, r.phase):
                    dead[r.rank] = now
                else:
                    dead.pop(r.rank, None)
        if self.hangs.has_unresolved(hb.job):
            with self._lock:
                self.hangs.resolve_hangs(hb.job)
        busy: dict[str, set[int]] = {}
        for r in hb.ranks:
            if r.working_on and r.alive:
                busy.setdefault(r.working_on, set()).add(r.rank)
        if busy:
            self._extend_for_busy(hb.job, busy, now)
        if self.baseline.heard(hb.job, [(r.rank, r.iteration, r.iteration_ms) for r in hb.ranks if r.alive],
                               self.world_of(hb.job)):
            self._take_baseline(hb.job)

    def _take_baseline(self, job: str) -> None:
        """Open the job's baseline window (perftracker.localizer.service.session.baseline), unless a
        session of the job is open (the next steady heartbeat asks again)."""
        with self._lock:
            if self.store.open_count(job):
                return
            try:
                rec, joined = self.trigger(job, BASELINE_REASON, self.baseline.options.window_s)
            except RequestError as exc:
                log.info("job %s: no baseline window now (%s)", job, exc)
                return
            if not joined:
                self.baseline.opened(job, rec.session)

    def _extend_for_busy(self, job: str, busy: dict[str, set[int]], now: int) -> None:
        """Keep a slowdown session open while an agent still works on a rank's window (see
        ``SessionOptions.busy_extend_s``)."""
        with self._lock:
            for session, ranks in busy.items():
                s = self.store.get_session(session, with_uploaded=False)
                if s is None or s.job != job or s.state != OPEN or s.kind == HANG:
                    continue
                pending = sorted(ranks - self.uploads.uploaded_of(session))
                if not pending:
                    continue
                cap = s.opened_ns + int((s.window_s + self.options.max_collect_s) * 1e9)
                want = min(now + int(self.options.busy_extend_s * 1e9), cap)
                if want <= s.deadline_ns:
                    continue
                self.store.update_session(session, deadline_ns=want)
                if session not in self._extended:
                    self._extended.add(session)
                    log.info("session %s: rank(s) %s still being profiled or summarized; keeping the session "
                             "open for them (at most %.0f s after the window)", session, pending,
                             self.options.max_collect_s)

    # ---------------------------------------------------------------- triggers
    def trigger(self, job: str, reason: str, window_s: float | None = None,
                kind: str = SLOWDOWN, quota_key: str | None = None,
                detection: Detection | None = None) -> tuple[SessionRecord, bool]:
        """Open a session for the job, or join the open one. Returns (session, joined). A trigger
        that would open one past the job's limits gets 429 (perftracker.localizer.service.job_limits;
        ``quota_key``: whose triggers per minute it counts against, by default the job's).
        ``detection``: the worker's typed detection, kept with a session it opens (its report's
        ``trigger``)."""
        now = self.clock.now_ns()
        key = quota_key or f"job {job!r}"
        with self._lock:
            open_ = self.store.sessions(job=job, states=(OPEN,), limit=1, newest_first=True, with_uploaded=False)
            if open_ and self._joins(open_[0], kind, now):
                s = open_[0]
                self.store.update_session(s.session, joins=s.joins + 1)
                log.info("trigger %r joined open session %s of job %s", reason, s.session, job)
                return dataclasses.replace(s, joins=s.joins + 1), True
            if open_ and kind == HANG and open_[0].kind != HANG:
                # a hang or a death during a slowdown session: a hang session of its own, linked to it
                # (its reason names the slowdown session); the slowdown session keeps what its window
                # gathered and is reported from what came by its deadline (issue 19)
                reason = f"{reason} (during slowdown session {open_[0].session})"
            check_open_sessions(job, self.store.open_count(job), self.options.max_open_sessions_per_job)
            self._quota.check(key, now)
            window = float(window_s if window_s is not None else self.options.default_window_s)
            wait_s = self.options.hang_collect_s if kind == HANG else window + self.options.collect_grace_s
            rec = SessionRecord(
                seq=0, session=_new_session_id(now), job=job, kind=kind, reason=reason, window_s=window,
                state=OPEN, opened_ns=now, deadline_ns=now + int(wait_s * 1e9),
                expected=expected_ranks(self.store.workers(job), self.options.max_expected_ranks),
                detection=detection if kind == SLOWDOWN else None)
            look = self._first_look(rec, now) if kind == SLOWDOWN and not is_baseline(reason) else None
            if look is not None:  # settled without a window: no agent ever sees the session open
                rec = dataclasses.replace(rec, state=DONE, closed_ns=now)
                look = dataclasses.replace(look, trigger=rec.detection)
            rec = self.store.insert_session(rec)
            if look is not None:
                self.store.events.put_report(look)
                self._quota.opened(key, now)
                log.info("session %s for job %s settled by the first look: %s", rec.session, job, look.headline)
                return rec, False
            self._quota.opened(key, now)
            log.info("opened session %s for job %s (%s, %s, %d expected rank(s))", rec.session, job, kind,
                     reason, len(rec.expected))
            return rec, False

    def _first_look(self, rec: SessionRecord, now_ns: int) -> Report | None:
        """The first look's report for a new slowdown session, or None (the window runs)."""
        if not self.options.first_look or len(rec.expected) > 4096:
            return None
        try:
            return self.first_look.look(rec.job, rec.session, rec.reason, list(rec.expected), now_ns, now_ns)
        except Exception:  # noqa: BLE001 - the window is the fallback
            log.exception("first look for session %s failed; the window runs", rec.session)
            return None

    def _joins(self, s: SessionRecord, kind: str, now_ns: int) -> bool:
        """Whether a trigger of ``kind`` at ``now_ns`` belongs to the open session ``s``."""
        if s.kind == HANG:
            return True  # a hang session gathers every later trigger's snapshots
        if kind == HANG:
            return False  # a hang during a slowdown session opens a hang session of its own
        window_end_ns = s.opened_ns + int((s.window_s + self.options.join_slack_s) * 1e9)
        return now_ns <= window_end_ns

    def next_trigger(self, job: str, after: str | None = None) -> Trigger | None:
        """The open session an agent that last saw ``after`` should act on, or None."""
        after_seq = 0
        if after:
            prev = self.store.get_session(after, with_uploaded=False)
            after_seq = prev.seq if prev is not None and prev.job == job else 0
        found = self.store.next_open(job, after_seq)
        return Trigger(*found) if found is not None else None

    # ---------------------------------------------------------------- uploads (the uploads and hangs parts)
    def view(self, session: str) -> SessionRecord:
        """The session with its uploaded ranks, from memory (no scan of the store)."""
        return self.uploads.view(session)

    def accept_patterns(self, ps: PatternSet, body: bytes | None = None) -> SessionRecord:
        """Validate against the session and persist. Returns the session after the upload."""
        return self.uploads.accept_patterns(ps, body)

    def check_batch(self, batch: PatternBatch) -> SessionRecord:
        """Validate an upload against its session (RequestError 404/409/422). Stores nothing."""
        return self.uploads.check_batch(batch)

    def commit_batches(self, items: Sequence[tuple[PatternBatch, bytes]]) -> None:
        """Persist checked uploads in one transaction, then count them (PatternUploads.commit_batches)."""
        self.uploads.commit_batches(items)

    def upload_counts(self, session: str) -> tuple[SessionRecord, int]:
        """(the session, how many ranks uploaded) without sorting them (the upload's answer)."""
        return self.uploads.upload_counts(session)

    def is_complete(self, s: SessionRecord) -> bool:
        """Every expected rank uploaded or is known not to answer (and at least one uploaded)."""
        return self.uploads.is_complete(s)

    def complete_now(self, session: str) -> bool:
        """Whether the session is open and complete (after an upload committed)."""
        return self.uploads.complete_now(session)

    def accept_hang_snapshot(self, snap: HangSnapshot, quota_key: str | None = None) -> SessionRecord:
        """Attach a snapshot to its session, or to the job's open session, or open a hang session
        (counted against ``quota_key`` as a trigger is)."""
        return self.hangs.accept_hang_snapshot(snap, quota_key)

    def _dead_of(self, job: str) -> dict[int, int]:
        dead = self._dead.get(job)
        if dead is None:
            from perftracker.localizer.diagnose.incidents.hang import (
                never_answers,  # lazy: owned by the hangs stage
            )

            dead = self._dead[job] = {h.rank: h.received_ns for h in self.store.events.heartbeats(job)
                                      if never_answers(h.alive, h.phase)}
        return dead

    def _forget(self, session: str) -> None:
        self._extended.discard(session)
        self.uploads.forget(session)

    # ---------------------------------------------------------------- closing
    def dead_ranks(self, s: SessionRecord) -> set[int]:
        """Ranks whose latest heartbeat, received after the session opened, says the process is dead
        (or SIGSTOPped: it cannot answer either)."""
        with self._lock:
            return {r for r, t in self._dead_of(s.job).items() if t >= s.opened_ns}

    def due(self) -> list[SessionRecord]:
        """Open sessions that are complete or past their deadline."""
        now = self.clock.now_ns()
        return [s for s in self.store.iter_sessions(states=(OPEN,), with_uploaded=False)
                if now >= s.deadline_ns or (not self.hangs.is_paused(s.session) and self.is_complete(s))]

    def next_deadline_ns(self) -> int | None:
        return min((s.deadline_ns for s in self.store.iter_sessions(states=(OPEN,), with_uploaded=False)),
                   default=None)

    def begin_localizing(self, session: str) -> SessionRecord | None:
        """open -> localizing, once. None if the session is not open (another caller took it)."""
        with self._lock:
            s = self.store.get_session(session)
            if s is None or s.state != OPEN:
                return None
            self.store.update_session(session, state=LOCALIZING)
            return dataclasses.replace(s, state=LOCALIZING)

    def build_report(self, s: SessionRecord, localize_options: object | None = None) -> Report:
        """The CPU-heavy step (run it in an executor): localize the stored uploads of a session."""
        if s.kind == HANG:
            return build_hang_report(s, self.store.events.hang_snapshots(s.session), self.store.events.heartbeats(s.job),
                                     self.clock.now_ns())
        return self.uploads.build_slowdown(s, localize_options,
                                           lambda arr, report: self.baseline.after_localize(s, arr, report))

    def finish(self, session: str, report: Report) -> bool:
        """Store the report and close the session. Returns False when nothing was stored: a hang
        session whose ranks all pause (not a hang yet) goes back to open for another look, and one
        whose job resumed from such a pause closes with no report."""
        now = self.clock.now_ns()
        if report.kind == HANG and report.status in (PAUSE, RESUMED):
            with self._lock:
                if report.status == PAUSE:
                    self.hangs.pause(session)  # due again at the deadline or on a new snapshot
                    self.store.update_session(session, state=OPEN,
                                              deadline_ns=now + int(self.options.hang_recheck_s * 1e9))
                else:
                    self.hangs.unpause(session)
                    self.store.update_session(session, state=DONE, closed_ns=now,
                                              error="no hang: every rank paused in user code, then resumed")
                    self._forget(session)
            log.info("session %s: all ranks pause in user code; %s", session,
                     "looking again later" if report.status == PAUSE else "the job resumed: no hang report")
            return False
        with self._lock:
            self.hangs.unpause(session)
            self.store.events.put_report(report)
            self.store.update_session(session, state=DONE, closed_ns=now)
            self._forget(session)
            self.hangs.stored(report, now)
            self.baseline.settled(report.job, session)
            try:  # the hosts it blames (perftracker hosts); the report stands without them
                self.store.culprits.record(report, now)
            except Exception:  # noqa: BLE001
                log.exception("session %s: the culprit hosts were not recorded", session)
        log.info("session %s localized: %s report, %d finding(s), missing ranks %s", session,
                 report.status, len(report.findings), list(report.ranks_missing))
        return True

    def fail(self, session: str, error: str) -> None:
        with self._lock:
            self.store.update_session(session, state=FAILED, closed_ns=self.clock.now_ns(), error=error[:2000])
            self._forget(session)
            s = self.store.get_session(session, with_uploaded=False)
            if s is not None:
                self.baseline.settled(s.job, session)
        log.error("session %s failed: %s", session, error)

    def localize_now(self, session: str, localize_options: object | None = None) -> SessionRecord | None:
        """Synchronously localize one due session (tests and single-threaded callers)."""
        s = self.begin_localizing(session)
        if s is None:
            return None
        try:
            self.finish(session, self.build_report(s, localize_options))
        except Exception as exc:  # noqa: BLE001 - a failed localization must not kill the service
            self.fail(session, f"{type(exc).__name__}: {exc}")
        return self.store.get_session(session)

