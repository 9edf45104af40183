"""Pattern uploads of a session: checked, committed (before the ack), counted and kept columnar.

``PatternUploads`` is a part of ``perftracker.localizer.service.session.manager.SessionManager``, which owns
it and calls it; it owns the in-memory views of the uploads (which ranks uploaded, which are still
outstanding, the columns). An upload is a ``PatternBatch`` (one node's
ranks, parsed once on arrival: ``perftracker.wire.patterns``). It is checked against its session
(404/409/422), persisted in the writer's transaction, then, once committed, counted and appended
to the session's columns (``perftracker.localizer.service.columns``). Localizing a slowdown session reads those arrays,
or, when the bounded cache let them go or the process restarted, the stored columnar bodies.

Every per-upload step is O(ranks of the upload), not O(ranks of the job): the expected ranks are
ranges cached with the session row (``RankRanges``), and the count of expected ranks uploaded grows
as uploads commit. Nothing here is sized by a claimed world size: an upload's integers are bounded
and its world size must be the job's registered world (perftracker.localizer.service.bounds).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from perftracker.localizer.service.bounds import check_batch as check_bounds
from perftracker.localizer.service.bounds import check_pattern_set, check_world
from perftracker.localizer.service.columns import ColumnCache, SessionColumns, columns_of
from perftracker.localizer.service.validate import RequestError
from perftracker.localizer.store.records import SessionRecord
from perftracker.localizer.store.sqlite_store import Store

from perftracker.clock import Clock
from perftracker.errors import InputError
from perftracker.model import PatternSet, Report
from perftracker.model.kinds import SessionState
from perftracker.wire.patterns import PatternBatch, batch_from_sets, encode_batch

log = logging.getLogger(__name__)

OPEN = SessionState.OPEN


class PatternUploads:
    """The uploads part of the SessionManager (see the module docstring). ``lock`` is the manager's
    (one lock for the manager and its parts); ``dead_ranks(session)`` is the manager's view of the
    ranks that cannot answer."""

    def __init__(self, store: Store, clock: Clock, lock: threading.RLock, max_cached_set_bytes: int,
                 dead_ranks: Callable[[SessionRecord], set[int]]) -> None:
        self.store = store
        self.clock = clock
        self._lock = lock
        self._dead_ranks = dead_ranks
        self.cache = ColumnCache(max_cached_set_bytes)  # uploads as arrays, bounded
        # In-memory views of open sessions, so an upload costs no scan of the store:
        self._uploaded: dict[str, set[int]] = {}  # session -> ranks with patterns or a snapshot
        # session -> [expected, how many of them uploaded]: the outstanding count without a set of them
        self._outstanding: dict[str, list[Any]] = {}
        self.world_of: Callable[[str], int] = lambda job: 0  # the job's registered world (the manager's)

    # ---------------------------------------------------------------- the in-memory views
    def view(self, session: str) -> SessionRecord:
        """The session with its uploaded ranks, from memory (no scan of the store)."""
        s = self.store.get_session(session, with_uploaded=False)
        if s is None:
            raise RequestError(f"unknown session {session!r}", status=404)
        return dataclasses.replace(s, uploaded=tuple(sorted(self.uploaded_of(session))))

    def uploaded_of(self, session: str) -> set[int]:
        """The ranks of ``session`` with patterns or a snapshot (the live set: callers hold the lock)."""
        got = self._uploaded.get(session)
        if got is None:  # first look after a restart
            got = self._uploaded[session] = self.store.uploaded_ranks(session)
        return got

    def count(self, session: str, rank: int) -> None:
        """A committed upload of ``rank`` (a hang snapshot: session_hangs) counts from now on."""
        with self._lock:
            self._add_uploaded(session, (rank,))

    def _add_uploaded(self, session: str, ranks: Sequence[int]) -> None:
        got = self.uploaded_of(session)
        memo = self._outstanding.get(session)
        for r in ranks:
            if r not in got:
                got.add(r)
                if memo is not None and r in memo[0]:
                    memo[1] += 1

    def forget(self, session: str) -> None:
        """The session closed: drop its views and its columns."""
        self._uploaded.pop(session, None)
        self._outstanding.pop(session, None)
        self.cache.forget(session)

    # ---------------------------------------------------------------- checks
    def session_world(self, s: SessionRecord) -> int:
        """The world an upload to ``s`` must name: the job's registered world, or more when the
        session expects more ranks (a Kubernetes job's pods); 0 when nothing says."""
        return max(self.world_of(s.job), s.expected.end)

    def open_session_for(self, session: str, job: str, ranks: Sequence[int]) -> SessionRecord:
        s = self.store.get_session(session, with_uploaded=False)
        if s is None:
            raise RequestError(f"unknown session {session!r}", status=404)
        if s.job != job:  # answered as unknown: a job's token learns nothing of another job's sessions
            raise RequestError(f"unknown session {session!r} for job {job!r}", status=404)
        if s.state != OPEN:
            raise RequestError(f"session {session!r} is already {s.state}; uploads are closed", status=409)
        unknown = [r for r in ranks if r not in s.expected_set]
        if unknown:
            registered = {w.rank for w in self.store.workers(job)}
            bad = [r for r in unknown if r not in registered]
            if bad:
                raise RequestError(f"rank {bad[0]} is not registered for job {job!r} "
                                   f"(register the agent first)", status=422)
        return s

    def check_batch(self, batch: PatternBatch) -> SessionRecord:
        """Validate an upload against its session (RequestError 404/409/422). Stores nothing."""
        check_bounds(batch)
        with self._lock:
            s = self.open_session_for(batch.session, batch.job, batch.ranks)
            check_world(batch, self.store.rank_worlds(batch.job, batch.ranks), self.session_world(s), batch.job)
        cols = self.cache.get(batch.session)
        if cols is not None:
            try:
                cols.check(batch)
            except InputError as exc:
                raise RequestError(str(exc), status=422) from None
        return s

    def check_patterns(self, ps: PatternSet) -> SessionRecord:
        check_pattern_set(ps)
        with self._lock:
            s = self.open_session_for(ps.session, ps.job, [ps.rank])
            check_world(batch_from_sets([ps]), self.store.rank_worlds(ps.job, [ps.rank]), self.session_world(s),
                        ps.job)
            return s

    # ---------------------------------------------------------------- commit
    def commit_batches(self, items: Sequence[tuple[PatternBatch, bytes]]) -> None:
        """Persist checked uploads in one transaction, then count them and keep their arrays.
        Safe to call from the writer thread; counted only once on disk, never before."""
        if not items:
            return
        with self._lock, self.store.transaction():
            for batch, _ in items:  # again, inside the transaction: the session may have closed meanwhile
                s = self.open_session_for(batch.session, batch.job, batch.ranks)
                if not self.cache.knows(batch.session) and self.uploaded_of(batch.session):
                    self.cache.spill(batch.session)  # earlier uploads this process did not see
                extra = [r for r in batch.ranks if r not in s.expected]
                if extra:  # an unregistered-at-open rank that uploads is expected
                    self.store.update_session(batch.session, expected=s.expected | extra)
            self.store.patterns.put_batches(items, self.clock.now_ns())
            self.store.on_commit(lambda: self._count_uploads([b for b, _ in items]))

    def commit_patterns(self, items: Sequence[tuple[PatternSet, bytes | None]]) -> None:
        """``commit_batches`` for PatternSets (each its own batch)."""
        batches = [batch_from_sets([ps]) for ps, _ in items]
        self.commit_batches([(b, encode_batch(b)) for b in batches])

    def _count_uploads(self, batches: Sequence[PatternBatch]) -> None:
        with self._lock:
            for b in batches:
                self._add_uploaded(b.session, b.ranks)
        for b in batches:
            try:
                self.cache.add(b)
            except InputError as exc:  # checked before the commit; a race with another upload
                log.warning("session %s: %s; it is read from the store when localized", b.session, exc)
                self.cache.spill(b.session)

    def accept_patterns(self, ps: PatternSet, body: bytes | None = None) -> SessionRecord:
        """Validate against the session and persist. Returns the session after the upload."""
        with self._lock:
            self.check_patterns(ps)
            self.commit_patterns([(ps, body)])
            return self.view(ps.session)

    # ---------------------------------------------------------------- progress
    def n_outstanding(self, s: SessionRecord) -> int:
        """How many expected ranks of ``s`` have nothing uploaded (kept up to date as uploads commit)."""
        with self._lock:
            memo = self._outstanding.get(s.session)
            if memo is None or memo[0] is not s.expected:
                memo = self._outstanding[s.session] = [s.expected, s.expected.count_in(self.uploaded_of(s.session))]
            return len(s.expected) - int(memo[1])

    def outstanding(self, s: SessionRecord) -> set[int]:
        """Expected ranks of ``s`` with nothing uploaded (O(expected ranks): tests and small sessions)."""
        with self._lock:
            return set(s.expected.without(self.uploaded_of(s.session)))

    def upload_counts(self, session: str) -> tuple[SessionRecord, int]:
        """(the session, how many ranks uploaded) without sorting them (the upload's answer)."""
        s = self.store.get_session(session, with_uploaded=False)
        if s is None:
            raise RequestError(f"unknown session {session!r}", status=404)
        with self._lock:
            return s, len(self.uploaded_of(session))

    def complete_now(self, session: str) -> bool:
        """Whether the session is open and complete (after an upload committed)."""
        s = self.store.get_session(session, with_uploaded=False)
        return s is not None and s.state == OPEN and self.is_complete(s)

    def is_complete(self, s: SessionRecord) -> bool:
        """Every expected rank uploaded or is known not to answer (and at least one uploaded)."""
        if not s.expected:
            return False
        with self._lock:
            uploaded = self.uploaded_of(s.session)
            n_out = self.n_outstanding(s)
            if not n_out:
                return bool(uploaded)
            dead = self._dead_ranks(s)
            if not dead or n_out > len(dead):
                return False
            outstanding = self.outstanding(s)  # at most len(dead) ranks: bounded by the heartbeats received
            if s.kind == "hang" and not outstanding - dead:
                return True  # every rank answered or cannot answer (e.g. all dead after a kill)
            return bool(uploaded) and not outstanding - dead

    # ---------------------------------------------------------------- localizing
    def session_columns(self, s: SessionRecord) -> SessionColumns | None:
        """The session's uploads as columns: from memory, or read back from the store's columnar
        bodies when memory does not hold all of them. None when nothing was uploaded."""
        stored = set(self.store.patterns.pattern_ranks(s.session))
        if not stored:
            return None
        cols = self.cache.get(s.session)
        if cols is not None and cols.ranks() == stored:
            return cols
        log.info("session %s: reading %d rank(s) of patterns back from the store", s.session, len(stored))
        return columns_of(s.job, s.session, self.store.patterns.pattern_batches(s.session))

    def build_slowdown(self, s: SessionRecord, localize_options: object | None = None,
                       after: Callable[[Any, Report], Report] | None = None) -> Report:
        from perftracker.localizer.service.session.reports import build_slowdown_report

        return build_slowdown_report(s, self.session_columns(s), localize_options, after)
