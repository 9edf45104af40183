"""Crash localization: the first rank that failed, how it ended, where, and what the others did. Pure.

A *failure* is a snapshot with ``end`` set (perftracker/runtime/exit_capture.py in the worker: an uncaught
exception; agent/daemon/worker_exits.py in the node agent: a nonzero exit status, a signal, the OOM killer, a
death of unseen status), or an older exit snapshot with only ``error`` set (an exception).

The first failing rank, in order:

1. among the failures that are not *peer losses*, the earliest by ``failed_ns`` (wall clock). A peer
   loss is an exception raised inside a collective whose message says that a peer went away
   ("Connection reset by peer", "Connection closed by peer", "Broken pipe", a NCCL abort): gloo fails
   the pending collective on every survivor when one rank dies, so such a failure is a consequence,
   never the cause, whenever another failure exists;
2. if every failure is a peer loss: a rank without a snapshot whose process has exited or died (its
   status unseen), else the earliest peer loss.

The other ranks are described as of that moment and folded under the one crash (``RankState``):
peer losses as *waiting* in their collective ("failed 0.02 s after rank 3"), live ranks blocked in a
collective as *waiting*, live ranks elsewhere as *running*, later independent failures as *failed*,
ranks that exited or that the launcher stopped as *exited*, ranks nothing is known of as *silent*.

A single-process job is "the only rank": never a collective hang.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from perftracker.localizer.diagnose.incidents.hang import SilentRank, _user_callers, place
from perftracker.localizer.diagnose.incidents.rank_groups import (
    Group,
    culprit_clause,
    hops_clause,
    job_groups,
)
from perftracker.localizer.diagnose.words.headline import fit_incident

from perftracker.model import HangSnapshot, RankState, Report, compress_ranks
from perftracker.model.frames import SELF_PREFIX, innermost_user_frame, is_collective, is_user_frame
from perftracker.model.kinds import RankStateName, ReportKind

CRASH = ReportKind.CRASH
CULPRIT, WAITING, FAILED = RankStateName.CULPRIT, RankStateName.WAITING, RankStateName.FAILED
RUNNING, EXITED, SILENT = RankStateName.RUNNING, RankStateName.EXITED, RankStateName.SILENT
PEER_LOSS = re.compile(
    r"Connection (?:reset|closed|refused)(?: by peer)?|Broken pipe|closed by peer|peer (?:closed|disconnected)|"
    r"NCCL communicator was aborted|ncclRemoteError|remote process exited|DistNetworkError|"
    r"Socket Timeout|Timed out waiting for (?:peer|recv)", re.IGNORECASE)
_END_ORDER = {"exception": 0, "oom": 1, "signal": 2, "exit": 3, "dead": 4}
_GONE = ("process exited", "process dead")  # silent details of a rank whose process ended


def is_failure(snap: HangSnapshot) -> bool:
    return bool(snap.end or snap.error)


def end_of(snap: HangSnapshot) -> str:
    return snap.end or ("exception" if snap.error else "")


def is_peer_loss(snap: HangSnapshot) -> bool:
    """An exception raised in a collective because a peer went away (see the module doc)."""
    if end_of(snap) != "exception" or not PEER_LOSS.search(snap.error):
        return False
    return is_collective(snap.current_op) or any(f.file.startswith("<lib>/torch/distributed/") for f in snap.stack)


@dataclass(frozen=True)
class _Failure:
    rank: int
    snap: HangSnapshot
    end: str
    failed_ns: int
    peer_loss: bool


def _merge(snaps: Sequence[HangSnapshot]) -> HangSnapshot:
    """One rank's failure snapshots (its own exception, the agent's exit status) as one: the most
    telling end (an exception over an exit status), the earliest failure time."""
    best = min(snaps, key=lambda s: (_END_ORDER.get(end_of(s), 9), not s.stack))
    times = [s.failed_ns for s in snaps if s.failed_ns > 0]
    if times and best.failed_ns != min(times):
        from dataclasses import replace

        best = replace(best, failed_ns=min(times))
    return best


def localize_crash(
    snapshots: Sequence[HangSnapshot],
    silent: Mapping[int, SilentRank | str],
    expected_ranks: Sequence[int],
    now_ns: int | None = None,
) -> Report | None:
    """A Report of kind "crash", or None when no snapshot reports a failure (then it is a hang or
    nothing, see perftracker.localizer.diagnose.incidents.hang)."""
    by_rank: dict[int, list[HangSnapshot]] = defaultdict(list)
    for s in snapshots:
        by_rank[s.rank].append(s)
    failures: dict[int, _Failure] = {}
    live: dict[int, HangSnapshot] = {}
    for r, snaps in by_rank.items():
        bad = [s for s in snaps if is_failure(s)]
        if bad:
            m = _merge(bad)
            failures[r] = _Failure(r, m, end_of(m), m.failed_ns or m.taken_ns, is_peer_loss(m))
        else:
            live[r] = max(snaps, key=lambda x: (bool(x.stack), x.taken_ns))
    if not failures:
        return None
    quiet: dict[int, SilentRank] = {}
    for r in sorted({*expected_ranks, *silent}):
        if r in by_rank:
            continue
        v = silent.get(r, "")
        quiet[r] = v if isinstance(v, SilentRank) else SilentRank(r, str(v))

    causes = [f for f in failures.values() if not f.peer_loss]
    first: _Failure | None = min(causes, key=lambda f: (f.failed_ns, f.rank)) if causes else None
    gone = [q for q in quiet.values() if q.detail in _GONE]
    first_quiet: SilentRank | None = None
    if first is None and gone:
        first_quiet = max(gone, key=lambda q: (q.silent_s, -q.rank))
    elif first is None:
        first = min(failures.values(), key=lambda f: (f.failed_ns, f.rank))
    everyone = sorted({*failures, *live, *quiet, *expected_ranks})
    single = len(everyone) == 1 and max([s.world_size for s in snapshots] or [1]) <= 1

    states: list[RankState] = []
    t0 = first.failed_ns if first is not None else 0
    first_rank = first.rank if first is not None else (first_quiet.rank if first_quiet else -1)
    for r in everyone:
        if r == first_rank:
            states.append(_culprit_state(first) if first is not None else RankState(
                rank=r, state=CULPRIT, where="", idle_s=first_quiet.silent_s if first_quiet else 0.0,
                last_iteration=first_quiet.last_iteration if first_quiet else -1,
                detail=f"{first_quiet.detail if first_quiet else 'process ended'} (exit status not seen)"))
        elif r in failures:
            states.append(_other_failure_state(failures[r], first_rank, t0))
        elif r in live:
            p = place(live[r], None, now_ns)
            states.append(RankState(rank=r, state=WAITING if p.waiting else RUNNING, where=p.where,
                                    signature=p.signature, idle_s=live[r].idle_s,
                                    last_iteration=live[r].last_iteration, detail=live[r].kernel_state))
        else:
            q = quiet[r]
            st = EXITED if q.detail.startswith(_GONE) else (RUNNING if q.detail.startswith("process") else SILENT)
            states.append(RankState(rank=r, state=st, where="", idle_s=round(q.silent_s, 3),
                                    last_iteration=q.last_iteration, detail=q.detail or "no snapshot"))
    summary = _summary(states, first, first_quiet, single, job_groups(snapshots),
                       max(s.world_size for s in snapshots))
    any_snap = next(iter(snapshots))
    return Report(
        job=any_snap.job, session=any_snap.session, kind=CRASH,
        created_ns=max(s.taken_ns for s in snapshots) if now_ns is None else now_ns,
        trigger_reason="crash", window_s=0.0, ranks_reported=tuple(sorted(by_rank)),
        ranks_missing=tuple(sorted(quiet)), hang_states=tuple(states), summary=summary,
        headline=fit_incident(summary))


# --------------------------------------------------------------------------------------------
# one rank
# --------------------------------------------------------------------------------------------


def _user_place(snap: HangSnapshot) -> str:
    """The innermost user frame and the call in progress there, e.g. "train.py:22 in main
    (TrainingArguments)"; the innermost frame when no user frame is on the stack."""
    frames = [f for f in snap.stack if not f.file.startswith(SELF_PREFIX)]
    anchor = innermost_user_frame(frames) or (frames[-1] if frames else None)
    if anchor is None:
        return ""
    where = str(anchor)
    call = snap.current_op
    if call and not is_collective(call):
        where += f" ({call})"
    callers = _user_callers(frames, anchor, 3)
    if callers:
        where += " via " + " > ".join(callers)
    return where


def _raised_in(snap: HangSnapshot) -> str:
    """The frame that raised, when it is not the user's own (a library call failed under it)."""
    if not snap.stack or is_user_frame(snap.stack[-1]):
        return ""
    return str(snap.stack[-1])


def how(f: _Failure) -> str:
    """How a rank ended, in words."""
    s = f.snap
    if f.end == "exception":
        return s.error or "an uncaught exception"
    if f.end == "exit":
        return s.error or f"exit status {s.exit_code}"
    if f.end in ("signal", "oom"):
        return s.error or f"killed by signal {s.exit_code}"
    return s.error or "process died (exit status not seen)"


def _culprit_state(f: _Failure) -> RankState:
    s = f.snap
    where = _user_place(s)
    if is_collective(s.current_op) and s.world_size > 1:
        where = f"{where} in {s.current_op}" if where else s.current_op
    detail = how(f)
    raised = _raised_in(s)
    if raised:
        detail += f" (raised in {raised})"
    signature = ";".join(f"{fr.file}:{fr.line}:{fr.function}" for fr in s.stack)
    return RankState(rank=f.rank, state=CULPRIT, where=where, signature=signature, idle_s=s.idle_s,
                     last_iteration=s.last_iteration, detail=detail[:500])


def _other_failure_state(f: _Failure, first_rank: int, t0: int) -> RankState:
    s = f.snap
    gap = f" {max(0.0, (f.failed_ns - t0) / 1e9):.2f} s" if t0 and f.failed_ns else ""
    if f.peer_loss:
        op = s.current_op if is_collective(s.current_op) else "a collective"
        return RankState(rank=f.rank, state=WAITING, where=op, idle_s=s.idle_s, last_iteration=s.last_iteration,
                         detail=f"failed{gap} after rank {first_rank}: {_gist(s.error)}")
    return RankState(rank=f.rank, state=FAILED, where=_user_place(s), idle_s=s.idle_s,
                     last_iteration=s.last_iteration, detail=f"also failed{gap} after rank {first_rank}: {how(f)}"[:500])


def _gist(error: str) -> str:
    m = PEER_LOSS.search(error)
    return m.group(0) if m else error.split(":", 1)[0]


# --------------------------------------------------------------------------------------------
# the sentence
# --------------------------------------------------------------------------------------------


def _ranks(rs: Sequence[int]) -> str:
    rs = sorted(rs)
    return f"rank {rs[0]}" if len(rs) == 1 else f"ranks {compress_ranks(rs)}"


def _iteration(completed: int) -> str:
    """``last_iteration`` counts completed iterations: 0 means it failed in its first one (or before)."""
    if completed < 0:
        return "at an unknown iteration"
    return "before its first iteration completed" if completed == 0 else f"at iteration {completed}"


def _summary(states: Sequence[RankState], first: _Failure | None, first_quiet: SilentRank | None,
             single: bool, pgs: Sequence[Group] = (), world: int = 0) -> str:
    culprit = next(s for s in states if s.state == CULPRIT)
    who = f"rank {culprit.rank}" + (" (a single-process job)" if single else "")
    place_in_job = culprit_clause(culprit.rank, pgs, first.snap.stack if first is not None else (), world)
    if place_in_job and not single:
        who += f" ({place_in_job})"
    if first is not None:
        verb = {"exception": "failed with", "exit": "ended with", "signal": "was", "oom": "was"}.get(first.end, "ended:")
        text = f"crash: {who} {verb} {how(first)}"
        if culprit.where:
            text += f" at {culprit.where}"
        text += f", {_iteration(culprit.last_iteration)}"
        raised = _raised_in(first.snap)
        if raised:
            text += f"; raised in {raised}"
    else:
        text = f"crash: {who} ended first ({culprit.detail}), {_iteration(culprit.last_iteration)}"
    if single:
        return text
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for s in states:
        if s.state == CULPRIT:
            continue
        key = s.where if s.state in (WAITING, RUNNING) else (s.detail if s.state == EXITED and "after rank" in s.detail
                                                             else "")
        if s.state == WAITING and s.detail.startswith("failed"):
            groups[("failed in", s.where)].append(s.rank)
        else:
            groups[(s.state, key)].append(s.rank)
    words = {WAITING: "wait in", RUNNING: "still running at", FAILED: "also failed", EXITED: "exited",
             SILENT: "silent", "failed in": "then failed in"}
    parts = []
    for (state, where), rs in sorted(groups.items(), key=lambda kv: min(kv[1])):
        word = words.get(state, state)
        if len(rs) == 1 and state in (WAITING, RUNNING):
            word = "waits in" if state == WAITING else "is still running at"
        part = f"{_ranks(rs)} {word}"
        if where and state == EXITED:
            part += f" ({where})"
        elif where:
            part += f" {where}"
        if state == WAITING:
            since = min(s.last_iteration for s in states if s.rank in rs)
            if since >= 0:
                part += f" since iteration {since}"
        if state == "failed in":
            gists = {s.detail.split(": ", 1)[-1] for s in states if s.rank in rs}
            if len(gists) == 1:
                part += f" ({next(iter(gists))})"
        parts.append(part)
    waiters = [s.rank for s in states if s.state == WAITING]
    far = hops_clause([culprit.rank], waiters, pgs, world) if pgs else ""
    return text + ("; " + "; ".join(parts) if parts else "") + (f"; {far}" if far else "")
