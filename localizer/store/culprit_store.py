"""The store's culprits table: which hosts reports named as the culprit, across sessions and jobs (issue 49).

Each stored report adds one row per (host, cause) it blames: the hosts of the ranks of its findings
that are specific to some ranks (a job-wide finding blames no host) and of a hang's culprit ranks.
A host is *flagged* for draining only when reports of at least ``min_sessions`` different sessions
named it within the window asked about (one bad report never flags a host; the default, 3
sessions in 7 days, is ``FLAG_SESSIONS`` and ``perftracker hosts --min-sessions``). Rows older than
``KEEP_S`` are dropped as new ones arrive. The rank -> host mapping is the job's registration at the
time of the report. A part of ``perftracker.localizer.store.sqlite_store.Store``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from perftracker.localizer.store.access import Query, Transaction
from perftracker.localizer.store.records import STORE_SCHEMA_VERSION

from perftracker.model import Report

CULPRIT_DDL = """
CREATE TABLE IF NOT EXISTS culprits (
    host TEXT NOT NULL, cause TEXT NOT NULL, job TEXT NOT NULL, session TEXT NOT NULL,
    ranks TEXT NOT NULL, named_ns INTEGER NOT NULL, schema_version INTEGER NOT NULL,
    PRIMARY KEY (host, cause, session));
CREATE INDEX IF NOT EXISTS culprits_time ON culprits (named_ns);
"""
FLAG_SESSIONS = 3
WINDOW_S = 7 * 86400.0
KEEP_S = 30 * 86400.0
MAX_RANKS = 64  # ranks of one report looked up


@dataclass(frozen=True)
class HostRecord:
    """How often one host was named as the culprit within a window."""

    host: str
    sessions: int
    jobs: int
    causes: tuple[tuple[str, int], ...]  # (cause, sessions), most first
    last_ns: int
    flagged: bool

    def to_dict(self) -> dict[str, object]:
        return {"host": self.host, "sessions": self.sessions, "jobs": self.jobs,
                "causes": [[c, n] for c, n in self.causes], "last_ns": self.last_ns, "flagged": self.flagged}


def blamed_ranks(report: Report) -> dict[str, set[int]]:
    """cause -> the ranks a report blames: specific findings' ranks (cause: the finding's cause kind,
    else its category) and a hang's culprit ranks (cause "hang")."""
    out: dict[str, set[int]] = {}
    for f in report.findings:
        if f.kind == "common":
            continue
        out.setdefault(f.cause or f.category.value, set()).update(f.ranks[:MAX_RANKS])
    culprits = {s.rank for s in report.hang_states if s.state == "culprit"}
    if culprits:
        out.setdefault(report.kind if report.kind in ("hang", "crash") else "hang", set()).update(culprits)
    return out


class CulpritTables:
    """The Store's culprits (see the module docstring)."""

    def __init__(self, tx: Transaction, query: Query) -> None:
        self._tx = tx
        self._query = query

    def record(self, report: Report, now_ns: int) -> int:
        """Add the hosts ``report`` blames (idempotent per session). Returns the rows added."""
        blamed = blamed_ranks(report)
        if not blamed:
            return 0
        ranks = sorted({r for rs in blamed.values() for r in rs})[:MAX_RANKS]
        rows = self._query(f"SELECT rank, host FROM workers WHERE job=? AND rank IN ({','.join('?' * len(ranks))})",
                           (report.job, *ranks))
        host_of = {int(r): str(h) for r, h in rows if h}
        added = 0
        with self._tx() as db:
            db.execute("DELETE FROM culprits WHERE named_ns < ?", (now_ns - int(KEEP_S * 1e9),))
            for cause, rs in sorted(blamed.items()):
                by_host: dict[str, list[int]] = {}
                for r in sorted(rs):
                    if r in host_of:
                        by_host.setdefault(host_of[r], []).append(r)
                for host, hr in sorted(by_host.items()):
                    cur = db.execute("INSERT OR IGNORE INTO culprits VALUES (?,?,?,?,?,?,?)",
                                     (host, cause, report.job, report.session, ",".join(map(str, hr)), now_ns,
                                      STORE_SCHEMA_VERSION))
                    added += int(cur.rowcount or 0)
        return added

    def hosts(self, now_ns: int, window_s: float = WINDOW_S, min_sessions: int = FLAG_SESSIONS) -> list[HostRecord]:
        """Hosts named within ``window_s`` before ``now_ns``, the most named first."""
        since = now_ns - int(window_s * 1e9)
        rows = self._query("SELECT host, cause, job, session, named_ns FROM culprits WHERE named_ns >= ?", (since,))
        acc: dict[str, tuple[set[str], set[str], dict[str, set[str]], list[int]]] = {}
        for host, cause, job, session, t in rows:
            sessions, jobs, causes, last = acc.setdefault(str(host), (set(), set(), {}, [0]))
            sessions.add(str(session))
            jobs.add(str(job))
            causes.setdefault(str(cause), set()).add(str(session))
            last[0] = max(last[0], int(t))
        out = [HostRecord(h, len(s), len(j), tuple(sorted(((c, len(v)) for c, v in cs.items()), key=lambda x: (-x[1], x[0]))),
                          last[0], len(s) >= min_sessions)
               for h, (s, j, cs, last) in acc.items()]
        return sorted(out, key=lambda x: (-x.sessions, x.host))

    def counts(self, now_ns: int, window_s: float = WINDOW_S) -> dict[tuple[str, str], int]:
        """(host, cause) -> sessions that named it within the window (the localizer's /metrics)."""
        since = now_ns - int(window_s * 1e9)
        return {(str(h), str(c)): int(n) for h, c, n in self._query(
            "SELECT host, cause, COUNT(DISTINCT session) FROM culprits WHERE named_ns >= ? GROUP BY host, cause",
            (since,))}


def flagged(records: Sequence[HostRecord]) -> list[str]:
    return [r.host for r in records if r.flagged]
