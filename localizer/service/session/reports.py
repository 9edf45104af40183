"""The reports that close a session, built from its stored uploads (the CPU-heavy step).

``build_slowdown_report`` runs the localizer over the session's uploads, held as arrays
(``perftracker.localizer.service.columns``: no Python object per pattern); ``build_hang_report``
hands its hang snapshots and the ranks' liveness (from heartbeats) to ``perftracker.localizer.diagnose.incidents.hang``. Both
stages are imported lazily (numpy/statsmodels). The session state machine is perftracker.localizer.service.session.manager.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from perftracker.localizer.service.columns import SessionColumns
from perftracker.localizer.store.rank_ranges import RankRanges
from perftracker.localizer.store.sqlite_store import HeartbeatRecord, SessionRecord

from perftracker.model import HangSnapshot, Report
from perftracker.model.kinds import ReportKind

SLOWDOWN, HANG, CRASH = ReportKind.SLOWDOWN, ReportKind.HANG, ReportKind.CRASH
PAUSE, RESUMED = "pause", "resumed"  # statuses of a hang "report" that is never stored (see SessionManager.finish)


def build_slowdown_report(s: SessionRecord, columns: SessionColumns | None,
                          localize_options: object | None = None,
                          after: Callable[[Any, Report], Report] | None = None) -> Report:
    """Localize a slowdown session's uploads (held as arrays); ranks without one are ``ranks_missing``.
    ``after(arrays, report)``: what the report becomes then (the baseline's comparison, issue 49)."""
    arr = columns.to_arrays() if columns is not None else None
    if arr is None or arr.n_workers == 0:
        return Report(job=s.job, session=s.session, kind=SLOWDOWN, created_ns=time.time_ns(),
                      trigger_reason=s.reason, trigger=s.detection, window_s=s.window_s, ranks_reported=(),
                      ranks_missing=tuple(s.expected), status="partial",
                      summary="no worker uploaded patterns before the deadline")
    from perftracker.localizer.diagnose.localize import (
        localize_arrays,  # lazy: the numpy/statsmodels stage
    )
    from perftracker.localizer.diagnose.words.headline import with_slowdown_bound

    missing = tuple(s.expected.without(arr.ranks.tolist()))
    report = localize_arrays(arr, localize_options)  # type: ignore[arg-type]
    report = dataclasses.replace(
        report, job=s.job, session=s.session, trigger_reason=s.reason, trigger=s.detection, window_s=s.window_s,
        ranks_missing=missing, status="partial" if missing else report.status)
    report = with_slowdown_bound(report)  # a saving past what the detected slowdown cost says why (issue 47)
    return after(arr, report) if after is not None else report


def silent_ranks(expected: Iterable[int], got: set[int], heartbeats: Sequence[HeartbeatRecord],
                 now_ns: int) -> dict[int, Any]:
    """Expected ranks without a snapshot, each with what its latest heartbeat says."""
    from perftracker.localizer.diagnose.incidents.hang import (  # lazy: owned by the hangs stage
        SilentRank,
        silent_detail,
    )

    beats = {h.rank: h for h in heartbeats}
    out: dict[int, Any] = {}
    for r in expected:
        if r in got:
            continue
        h = beats.get(r)
        if h is None:
            out[r] = SilentRank(r, "no heartbeat from its agent")
            continue
        age_s = max(0.0, (now_ns - h.received_ns) / 1e9)
        detail = silent_detail(h.alive, h.phase)
        out[r] = SilentRank(r, detail, silent_s=h.last_event_age_s + age_s, last_iteration=h.iteration)
    return out


def build_hang_report(s: SessionRecord, snapshots: Sequence[HangSnapshot],
                      heartbeats: Sequence[HeartbeatRecord], now_ns: int,
                      options: object | None = None) -> Report:
    """The hang seam: snapshots + liveness -> a Report of kind "crash" when a snapshot reports a
    failure (perftracker.localizer.diagnose.incidents.crash.localize_crash), else of kind "hang" (perftracker.localizer.diagnose.incidents.hang.localize_hang)."""
    from perftracker.localizer.diagnose.incidents.crash import localize_crash
    from perftracker.localizer.diagnose.incidents.hang import (  # lazy: hangs stage
        HangOptions,
        job_resumed,
        localize_hang,
    )

    got = {snap.rank for snap in snapshots}
    expected, unheard = diagnosed_ranks(s.expected, got, heartbeats)
    silent = silent_ranks(expected, got, heartbeats, now_ns)
    crash = localize_crash(list(snapshots), silent, expected, now_ns=now_ns)
    if crash is not None:
        return _with_unheard(dataclasses.replace(crash, job=s.job, session=s.session, trigger_reason=s.reason), unheard)
    if options is None:
        options = HangOptions.from_env()
    report = localize_hang(list(snapshots), silent, expected, options, now_ns=now_ns)
    if report is None:
        # every rank pauses in user code (a checkpoint save, an evaluation): not a hang (yet).
        # "pause" re-opens the session for a later look; "resumed" closes it with no report.
        resumed = job_resumed(snapshots, [(h.rank, h.iteration, h.received_ns) for h in heartbeats])
        return Report(job=s.job, session=s.session, kind=HANG, created_ns=time.time_ns(),
                      trigger_reason=s.reason, window_s=0.0, ranks_reported=tuple(sorted(got)),
                      ranks_missing=tuple(sorted(silent)), status=RESUMED if resumed else PAUSE,
                      summary="the snapshots show no hang: the ranks were pausing, not blocked")
    return _with_unheard(dataclasses.replace(report, job=s.job, session=s.session, trigger_reason=s.reason), unheard)


MAX_UNHEARD = 1024  # expected ranks that sent nothing at all, diagnosed one by one; the rest only listed


def diagnosed_ranks(expected: RankRanges, got: set[int], heartbeats: Sequence[HeartbeatRecord],
                    max_unheard: int = MAX_UNHEARD) -> tuple[list[int], RankRanges]:
    """The expected ranks a hang diagnosis looks at one by one: those with a snapshot or a
    heartbeat (data received), and at most ``max_unheard`` of those that sent nothing; and the
    other silent ones, as ranges. A claimed world of 1,000,000 ranks of which one registered
    costs ~1,000 SilentRanks, not a million (issue 33)."""
    missing = expected.without(got)
    heard = [h.rank for h in heartbeats if h.rank in missing]
    listed = [r for r in missing.without(heard).head(max_unheard)]
    rest = missing.without(heard + listed)
    return sorted({*got, *heard, *listed}), rest


def _with_unheard(report: Report, unheard: RankRanges) -> Report:
    """The report, with the expected ranks that sent nothing and were not diagnosed one by one
    listed as missing (and said so in the summary)."""
    if not unheard:
        return report
    return dataclasses.replace(report, ranks_missing=tuple(unheard | report.ranks_missing),
                               summary=f"{report.summary} ({len(unheard)} more expected rank(s) sent nothing, "
                                       "not even a heartbeat: listed as missing only)")
