"""Retention (issue 33): closed sessions and their reports expire by age and by total size.

Every ``interval_s`` the service sweeps, off the event loop: it weighs every session (its stored
rows: patterns, hang snapshots, report; plus its report file), then picks the closed sessions
(``done`` or ``failed``) that closed more than ``max_age_s`` ago, and after them the oldest closed
ones until what is left fits ``max_bytes``, per tenant (issue 46: one global bound let a tenant
with large sessions evict another's reports): each eviction takes the oldest closed session of
the tenant that holds the most bytes then, so a tenant is evicted only while it holds at least as
much as every other (a tenant: the job-scoped token that names the job, ``tenant_of``; all jobs
one tenant when there is none). Their rows are deleted through the store's writer (in
chunks, so uploads keep flowing) and their report files are removed. Open and localizing sessions
are never deleted; a report file with no session left in the store is removed once older than
``max_age_s``.

Defaults fit a small PVC: 30 days and 1 GiB. ``perftracker localizer --retention-days
--retention-max-mb`` (or ``PERFTRACKER_RETENTION_DAYS``, ``PERFTRACKER_RETENTION_MAX_MB``, also read by
the embedded localizer); ``0`` turns a bound off.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from perftracker.localizer.store.sqlite_store import Store

from perftracker.errors import ConfigError
from perftracker.model.names import is_name

log = logging.getLogger(__name__)

DAY_S = 86_400.0
MIB = 1024 * 1024


@dataclass(frozen=True)
class RetentionOptions:
    max_age_s: float = 30 * DAY_S  # a closed session older than this is deleted (0: never by age)
    max_bytes: int = 1024 * MIB  # stored sessions and report files together (0: no size bound)
    interval_s: float = 600.0  # how often the service sweeps
    chunk: int = 200  # sessions deleted per write transaction

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, base: RetentionOptions | None = None) -> RetentionOptions:
        """``base`` (the defaults) with ``PERFTRACKER_RETENTION_DAYS`` and ``PERFTRACKER_RETENTION_MAX_MB``
        where they are set; ConfigError naming the variable for a bad value."""
        env = os.environ if env is None else env
        out = base or cls()
        days = _number(env, "PERFTRACKER_RETENTION_DAYS")
        mb = _number(env, "PERFTRACKER_RETENTION_MAX_MB")
        from dataclasses import replace

        if days is not None:
            out = replace(out, max_age_s=days * DAY_S)
        if mb is not None:
            out = replace(out, max_bytes=int(mb * MIB))
        return out


def _number(env: Mapping[str, str], name: str) -> float | None:
    text = env.get(name, "").strip()
    if not text:
        return None
    try:
        v = float(text)
    except ValueError:
        raise ConfigError(f"{name}={text[:40]!r}: not a number") from None
    if not v >= 0 or v == float("inf"):
        raise ConfigError(f"{name}={text[:40]!r}: must be a finite number >= 0 (0: no bound)")
    return v


@dataclass(frozen=True)
class Plan:
    """What one sweep deletes, and what it weighed."""

    expired: tuple[str, ...]  # by age
    evicted: tuple[str, ...]  # by size, oldest first
    total_bytes: int  # before
    kept_bytes: int  # after
    orphan_files: tuple[Path, ...] = ()

    @property
    def sessions(self) -> tuple[str, ...]:
        return self.expired + self.evicted


class Retention:
    """Plans and carries out the sweeps for one store and its report directory."""

    def __init__(self, store: Store, report_dir: str | Path | None, options: RetentionOptions,
                 tenant_of: Callable[[str], str] | None = None) -> None:
        self.store = store
        self.report_dir = Path(report_dir) if report_dir else None
        self.options = options
        self.tenant_of = tenant_of or (lambda job: "")

    def _file(self, session: str) -> Path | None:
        if self.report_dir is None or not is_name(session):
            return None
        return self.report_dir / f"{session}.json"

    def plan(self, now_ns: int) -> Plan:
        """Weigh the store and the report files (reads only: run it on a worker thread)."""
        o = self.options
        rows = self.store.session_sizes()
        sizes: dict[str, int] = {}
        known: set[str] = set()
        for session, _, _, nbytes, _ in rows:
            known.add(session)
            f = self._file(session)
            extra = 0
            if f is not None:
                with contextlib.suppress(OSError):
                    extra = os.lstat(f).st_size
            sizes[session] = nbytes + extra
        total = sum(sizes.values())
        cutoff = now_ns - int(o.max_age_s * 1e9) if o.max_age_s > 0 else None
        closed = [(s, t) for s, state, t, _, _ in rows if state in ("done", "failed")]  # oldest first (seq)
        expired = [s for s, t in closed if cutoff is not None and t < cutoff]
        kept = total - sum(sizes[s] for s in expired)
        evicted: list[str] = []
        if o.max_bytes > 0 and kept > o.max_bytes:
            evicted = self._evict(rows, sizes, set(expired), kept, o.max_bytes)
            kept -= sum(sizes[s] for s in evicted)
        orphans: list[Path] = []
        if self.report_dir is not None and cutoff is not None:
            with contextlib.suppress(OSError), os.scandir(self.report_dir) as it:
                for e in it:
                    if (e.name.endswith(".json") and e.name[:-5] not in known and e.is_file(follow_symlinks=False)
                            and e.stat(follow_symlinks=False).st_mtime_ns < cutoff):
                        orphans.append(Path(e.path))
        return Plan(tuple(expired), tuple(evicted), total, kept, tuple(orphans))

    def _evict(self, rows: list[tuple[str, str, int, int, str]], sizes: dict[str, int], gone: set[str], kept: int,
               max_bytes: int) -> list[str]:
        """Closed sessions to delete until ``kept`` fits ``max_bytes``: each time the oldest closed
        session of the tenant holding the most bytes (open ones count towards it, never deleted)."""
        tenants: dict[str, str] = {}
        held: dict[str, int] = {}
        queues: dict[str, list[tuple[int, str]]] = {}
        for s, state, t, _, job in rows:
            if s in gone:
                continue
            tenant = tenants.setdefault(job, self.tenant_of(job))
            held[tenant] = held.get(tenant, 0) + sizes[s]
            if state in ("done", "failed"):
                queues.setdefault(tenant, []).append((t, s))
        for q in queues.values():
            q.sort(reverse=True)  # oldest last: pop()
        out: list[str] = []
        while kept > max_bytes and queues:
            tenant = max(queues, key=lambda k: (held[k], k))
            _, s = queues[tenant].pop()
            if not queues[tenant]:
                del queues[tenant]
            out.append(s)
            held[tenant] -= sizes[s]
            kept -= sizes[s]
        return out

    def remove_files(self, sessions: tuple[str, ...], orphans: tuple[Path, ...] = ()) -> int:
        """Unlink the sessions' report files and the orphans (a worker thread); returns how many."""
        n = 0
        for p in [*(self._file(s) for s in sessions), *orphans]:
            if p is None:
                continue
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                n += 1
        return n

    def sweep(self, now_ns: int) -> Plan:
        """Plan and delete in this thread (tests, and callers without a writer thread)."""
        plan = self.plan(now_ns)
        for i in range(0, len(plan.sessions), self.options.chunk):
            self.store.delete_sessions(plan.sessions[i:i + self.options.chunk])
        self.remove_files(plan.sessions, plan.orphan_files)
        return plan
