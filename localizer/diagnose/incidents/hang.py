"""Hang localization: which rank stopped where, from hang snapshots and liveness. Pure; no I/O.

Every rank that sent a snapshot is classified from its stack:

- *waiting*: it waits in a collective (``perftracker.model.frames.recognise_collective``), e.g.
  "c10d allreduce";
- *in user code*: anywhere else; its place is the innermost frame of the training script plus
  the call in progress there, e.g. "perftracker/examples/train.py:88 in forward (time.sleep)".

Ranks expected but without a snapshot are *silent* (dead, SIGSTOPped, frozen with the GIL held,
or on a host whose agent went away); the caller says which, from heartbeats and
``perftracker.agent.daemon.liveness``.

The verdict, in order:

1. silent ranks, and ranks in user code while others wait, are the culprits;
2. every rank in one collective, none elsewhere: a network or collective hang; no rank is named;
3. ranks in different collectives: the minority is named (mismatched collectives);
4. every rank in user code and the longest idle time below ``pause_s``: not a hang (a checkpoint
   save or an evaluation pass on all ranks): ``None``. Past ``pause_s`` the report names the
   minority places, or no rank when all ranks stopped at the same place.
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from perftracker.localizer.diagnose.incidents.rank_groups import (
    Group,
    culprit_clause,
    hops_clause,
    job_groups,
)
from perftracker.localizer.diagnose.words.headline import fit_incident

from perftracker.model import Frame, HangSnapshot, RankState, Report, compress_ranks
from perftracker.model.frames import (
    SELF_PREFIX,
    innermost_user_frame,
    is_collective,
    is_user_frame,
    recognise_collective,
)
from perftracker.model.kinds import RankStateName

log = logging.getLogger(__name__)

CULPRIT, WAITING, SILENT, PAUSED = RankStateName.CULPRIT, RankStateName.WAITING, RankStateName.SILENT, RankStateName.PAUSED


@dataclass(frozen=True)
class HangOptions:
    pause_s: float = 60.0  # Config.hang_pause_s: all ranks in user code for less than this is a pause
    max_listed_groups: int = 3  # groups spelled out in the summary sentence
    max_callers: int = 3  # enclosing user functions named after the place ("via main > forward")

    @classmethod
    def from_env(cls) -> HangOptions:
        """pause_s from PERFTRACKER_HANG_PAUSE_S (Config.hang_pause_s), as the workers see it."""
        from perftracker.config import Config

        return cls(pause_s=Config.from_env().hang_pause_s)


# Liveness words an agent puts in a silent worker's heartbeat ``phase`` (perftracker.agent.daemon.liveness states),
# and how a report says them.
LIVENESS_DETAIL = {
    "stopped": "process stopped",
    "disk_wait": "process stuck in uninterruptible kernel wait",
    "silent": "process running but silent",
    "dead": "process dead",
}


FOLLOWER = re.compile(r"dead after rank (\d+)")  # an agent saw this worker die just after that one


def silent_detail(alive: bool, phase: str) -> str:
    """The report's words for a silent rank from its latest heartbeat."""
    if not alive:
        if phase == "exited":
            return "process exited"  # said so itself: an exit, not a death
        m = FOLLOWER.fullmatch(phase)
        return f"process dead after rank {m.group(1)}" if m else LIVENESS_DETAIL["dead"]
    return LIVENESS_DETAIL.get(phase, f"process running but silent (phase {phase or '?'})")


def never_answers(alive: bool, phase: str) -> bool:
    """A rank that cannot send a snapshot: dead or stopped (no point waiting for it). A rank that
    "exited" by itself sent its exit snapshot, if any, before it went: that may still be on its way."""
    if phase == "exited":
        return False
    return not alive or phase in ("stopped", "dead")


def job_resumed(snapshots: Sequence[HangSnapshot], beats: Sequence[tuple[int, int, int]]) -> bool:
    """Whether any rank completed an iteration after its snapshot.

    ``beats`` are (rank, completed iterations, received wall ns) from the latest heartbeats.
    """
    last = {s.rank: s for s in snapshots}
    for rank, iteration, received_ns in beats:
        s = last.get(rank)
        if s is not None and s.last_iteration >= 0 and iteration > s.last_iteration and received_ns >= s.taken_ns:
            return True
    return False


@dataclass(frozen=True)
class SilentRank:
    """A rank from which no snapshot came, with what liveness knows about it."""

    rank: int
    detail: str = ""  # "process stopped" | "process dead" | "process running but silent" | ...
    silent_s: float = 0.0  # time since its last sign of progress, 0 if unknown
    last_iteration: int = -1


@dataclass(frozen=True)
class _Placed:
    snap: HangSnapshot
    waiting: bool
    where: str
    signature: str


def localize_hang(
    snapshots: Sequence[HangSnapshot],
    silent: Mapping[int, SilentRank | str],
    expected_ranks: Sequence[int],
    options: HangOptions | object | None = None,
    now_ns: int | None = None,
) -> Report | None:
    """A Report of kind "hang", or None when the snapshots show a pause on all ranks, not a hang.

    ``silent`` maps rank -> SilentRank or a plain liveness note ("process stopped"). Expected
    ranks with neither a snapshot nor an entry in ``silent`` count as silent with no detail.
    ``now_ns`` (wall clock, like ``HangSnapshot.taken_ns``) ages the snapshots' idle times to now.
    """
    opts = options if isinstance(options, HangOptions) else HangOptions()
    latest: dict[int, HangSnapshot] = {}  # the latest snapshot per rank, one with a stack if any
    for s in sorted(snapshots, key=lambda x: (bool(x.stack), x.taken_ns)):
        latest[s.rank] = s
    if not latest and not silent and not expected_ranks:
        return None
    placed = {r: place(s, opts, now_ns) for r, s in sorted(latest.items())}
    quiet: dict[int, SilentRank] = {}
    for r in sorted({*expected_ranks, *silent}):
        if r in latest:
            continue
        v = silent.get(r, "")
        quiet[r] = v if isinstance(v, SilentRank) else SilentRank(r, str(v))
    # ranks that died right after another silent rank (torchrun stops the rest of a node when one
    # worker dies): they were waiting for it, and are not culprits themselves
    followers: dict[int, int] = {}
    for r, q in quiet.items():
        m = FOLLOWER.search(q.detail)
        if m and int(m.group(1)) in quiet and int(m.group(1)) != r and not FOLLOWER.search(quiet[int(m.group(1))].detail):
            followers[r] = int(m.group(1))
    for r in followers:
        del quiet[r]
    waiting: dict[str, list[int]] = defaultdict(list)
    user: dict[str, list[int]] = defaultdict(list)
    for r, p in placed.items():
        (waiting if p.waiting else user)[p.signature].append(r)
    since = _since_iteration(latest.values())

    culprits: set[int] = set(quiet)
    if not quiet and user and waiting and all(in_own_window(placed[r].snap) for rs in user.values() for r in rs):
        # the ranks the others wait for are inside perftracker's own profile window (stopping the
        # profiler, writing its data): profiling cost, a pause, until it outlasts pause_s. A peer
        # stopped during a window is silent instead (procfs: "process stopped"), so it is a hang.
        idle = max(_idle(placed[r].snap, now_ns) for rs in user.values() for r in rs)
        if idle < opts.pause_s:
            log.info("hang: rank(s) %s in perftracker's profile window for %.0f s < pause %.0f s: not a hang",
                     sorted(r for rs in user.values() for r in rs), idle, opts.pause_s)
            return None
    if quiet or (user and waiting):
        culprits |= {r for rs in user.values() for r in rs}
        summary = _culprit_sentence(placed, quiet, user, waiting, since, opts,
                                    job_groups(latest.values()), max((s.world_size for s in latest.values()), default=0))
        if followers:
            summary += "; " + "; ".join(
                f"{_ranks(rs)} died after rank {leader} (stopped by the launcher)"
                for leader, rs in sorted(_invert(followers).items()))
    elif waiting and not user:
        if len(waiting) == 1:
            (op,) = waiting
            summary = (f"hang: all {len(placed)} ranks wait in {op} since iteration {since}; no rank "
                       "is elsewhere: a network or collective hang")
        else:
            culprits |= _minority(waiting)
            summary = _mismatch_sentence(placed, waiting, culprits, since)
    else:
        idle = max((_idle(p.snap, now_ns) for p in placed.values()), default=0.0)
        if idle < opts.pause_s:
            log.info("hang: all %d ranks in user code for %.0f s < pause %.0f s: not a hang",
                     len(placed), idle, opts.pause_s)
            return None
        if len(user) == 1:
            where = next(iter(placed.values())).where
            summary = (f"hang: all {len(placed)} ranks stopped at {where} for {idle:.0f} s since "
                       f"iteration {since}; no rank waits in a collective")
        else:
            culprits |= _minority(user)
            summary = _user_split_sentence(placed, user, culprits, since, idle)

    states = [
        RankState(
            rank=r,
            state=CULPRIT if r in culprits else (WAITING if p.waiting else PAUSED),
            where=p.where,
            signature=p.signature,
            idle_s=round(_idle(p.snap, now_ns), 3),
            last_iteration=p.snap.last_iteration,
            detail=p.snap.error or p.snap.kernel_state,
        )
        for r, p in placed.items()
    ]
    states += [
        RankState(rank=r, state=WAITING, where=f"unknown: died after rank {leader}", detail=f"process dead "
                  f"after rank {leader}")
        for r, leader in followers.items()
    ]
    states += [
        RankState(rank=r, state=SILENT, where="", idle_s=q.silent_s, last_iteration=q.last_iteration,
                  detail=q.detail or "no snapshot")
        for r, q in quiet.items()
    ]
    states.sort(key=lambda st: st.rank)
    first = next(iter(latest.values()), None)
    return Report(
        job=first.job if first else "",
        session=first.session if first else "",
        kind="hang",
        created_ns=max((s.taken_ns for s in latest.values()), default=0) if now_ns is None else now_ns,
        trigger_reason="blocked",
        window_s=0.0,
        ranks_reported=tuple(sorted(latest)),
        ranks_missing=tuple(sorted({*quiet, *followers})),
        hang_states=tuple(states),
        summary=summary,
        headline=fit_incident(summary),
    )


# --------------------------------------------------------------------------------------------
# classification
# --------------------------------------------------------------------------------------------


def place(snap: HangSnapshot, options: HangOptions | None = None, now_ns: int | None = None) -> _Placed:
    """Where one rank is: in a collective, or at a place in user code, with a grouping signature."""
    op = snap.current_op
    if not is_collective(op):
        op = recognise_collective(snap.stack, op, snap.kernel_state, snap.world_size > 1) or op
    if is_collective(op):
        return _Placed(snap, True, op, op)
    frames = [f for f in snap.stack if not f.file.startswith(SELF_PREFIX)]
    signature = ";".join(f"{f.file}:{f.line}:{f.function}" for f in frames) or "?"
    anchor = innermost_user_frame(frames) or (frames[-1] if frames else None)
    where = str(anchor) if anchor is not None else "an unknown place (empty stack)"
    if op:
        where += f" ({op})"
    callers = _user_callers(frames, anchor, (options or HangOptions()).max_callers)
    if callers:
        where += " via " + " > ".join(callers)
    return _Placed(snap, False, where, signature)


def _user_callers(frames: Sequence[Frame], anchor: Frame | None, limit: int) -> list[str]:
    """Names of the user functions that called the anchor frame, outermost first (at most limit)."""
    if anchor is None or limit <= 0:
        return []
    i = max(j for j, f in enumerate(frames) if f is anchor)
    names = [f.function for f in frames[:i] if is_user_frame(f) and not f.function.startswith("<")]
    return names[-limit:]


_OWN_WINDOW_FILES = ("window", "profiler", "sampler")  # perftracker's profile-window modules


def in_own_window(snap: HangSnapshot) -> bool:
    """Whether the training thread is inside perftracker's own profile-window code (a profiler
    start or stop, the window's data being written), not in the job's code."""
    prefixes = tuple(SELF_PREFIX + name for name in _OWN_WINDOW_FILES)
    return any(f.file.startswith(prefixes) for f in snap.stack)


def _idle(snap: HangSnapshot, now_ns: int | None) -> float:
    if now_ns is None:
        return snap.idle_s
    return snap.idle_s + max(0.0, (now_ns - snap.taken_ns) / 1e9)


def _since_iteration(snaps: object) -> int:
    its = [s.last_iteration for s in snaps if s.last_iteration >= 0]  # type: ignore[attr-defined]
    return min(its) if its else -1


def _invert(followers: Mapping[int, int]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for r, leader in followers.items():
        out[leader].append(r)
    return out


def _minority(groups: Mapping[str, list[int]]) -> set[int]:
    """Ranks outside the largest group; every rank when no group is largest."""
    sizes = sorted((len(v) for v in groups.values()), reverse=True)
    if len(sizes) > 1 and sizes[0] == sizes[1]:
        return {r for rs in groups.values() for r in rs}
    top = max(groups, key=lambda k: len(groups[k]))
    return {r for k, rs in groups.items() if k != top for r in rs}


# --------------------------------------------------------------------------------------------
# sentences
# --------------------------------------------------------------------------------------------


def _ranks(rs: Sequence[int] | set[int]) -> str:
    rs = sorted(rs)
    return f"rank {rs[0]}" if len(rs) == 1 else f"ranks {compress_ranks(rs)}"


def _verb(rs: Sequence[int] | set[int], one: str, many: str) -> str:
    return one if len(rs) == 1 else many


def _others_clause(placed: Mapping[int, _Placed], waiting: Mapping[str, list[int]], named: set[int],
                   everyone: set[int], opts: HangOptions) -> str:
    if not waiting:
        return ""

    def verb(rs: Sequence[int], plural: bool) -> str:
        errors = {placed[r].snap.error for r in rs}
        if "" not in errors:  # exit snapshots: the collective failed under them
            gist = _short_error(next(iter(errors))) if len(errors) == 1 else ""
            return "failed" + (f" ({gist})" if gist else "") + " in"
        return ("wait" if plural else "waits") + " in"

    waiters = {r for rs in waiting.values() for r in rs}
    if len(waiting) == 1 and waiters | named == everyone:
        ((op, rs),) = waiting.items()
        return f"all other ranks {verb(rs, True)} {op}"
    parts = [f"{_ranks(rs)} {verb(rs, len(rs) > 1)} {op}"
             for op, rs in sorted(waiting.items(), key=lambda kv: -len(kv[1]))[: opts.max_listed_groups]]
    return "; ".join(parts)


def _short_error(error: str) -> str:
    """"RuntimeError: [../pair.cc:537] Read error [1.2.3.4]:5: Connection reset by peer. ..." -> the gist."""
    m = re.search(r"(Connection (?:reset|closed|refused)(?: by peer)?|[Tt]imed? ?out|Broken pipe)", error)
    if m:
        return m.group(1).strip()
    return error.split(":", 1)[0]


def _culprit_sentence(placed: Mapping[int, _Placed], quiet: Mapping[int, SilentRank],
                      user: Mapping[str, list[int]], waiting: Mapping[str, list[int]], since: int,
                      opts: HangOptions, groups: Sequence[Group] = (), world: int = 0) -> str:
    """Who stopped where, with its process groups and pipeline stage where the snapshots name them
    (``rank_groups``), then where the others wait, and which of them wait one hop further."""

    def in_groups(rs: Sequence[int]) -> str:
        if len(rs) != 1 or not groups:
            return ""
        clause = culprit_clause(rs[0], groups, placed[rs[0]].snap.stack if rs[0] in placed else (), world)
        return f" ({clause})" if clause else ""

    parts: list[str] = []
    by_detail: dict[tuple[str, int], list[int]] = defaultdict(list)
    for r, q in quiet.items():
        by_detail[(q.detail, round(q.silent_s))].append(r)
    for (detail, silent_s), rs in sorted(by_detail.items(), key=lambda kv: min(kv[1])):
        text = f"{_ranks(rs)} silent"
        if silent_s > 0:
            text += f" for {silent_s} s"
        if detail:
            text += f" ({detail})"
        parts.append(text + in_groups(rs))
    for _sig, rs in sorted(user.items(), key=lambda kv: min(kv[1]))[: opts.max_listed_groups]:
        p = placed[rs[0]]
        it = min(placed[r].snap.last_iteration for r in rs)
        text = f"{_ranks(rs)} stopped at {p.where}"
        if it >= 0:
            text += f" since iteration {it}"
        parts.append(text + in_groups(rs))
    if len(user) > opts.max_listed_groups:
        parts.append(f"{len(user) - opts.max_listed_groups} more place(s) in user code")
    named = set(quiet) | {r for rs in user.values() for r in rs}
    everyone = named | set(placed)
    others = _others_clause(placed, waiting, named, everyone, opts)
    far = hops_clause(sorted(named), [r for rs in waiting.values() for r in rs], groups, world) if groups else ""
    return "hang: " + ", ".join(parts) + (f"; {others}" if others else "") + (f"; {far}" if far else "")


def _mismatch_sentence(placed: Mapping[int, _Placed], waiting: Mapping[str, list[int]],
                       culprits: set[int], since: int) -> str:
    odd = [f"{_ranks(rs)} {_verb(rs, 'waits', 'wait')} in {op}"
           for op, rs in sorted(waiting.items(), key=lambda kv: min(kv[1])) if set(rs) <= culprits]
    rest = [f"{_ranks(rs)} in {op}" for op, rs in waiting.items() if not set(rs) <= culprits]
    text = "hang: " + ", ".join(odd)
    if rest:
        text += " while " + ", ".join(rest)
    return text + f" since iteration {since}: mismatched collectives"


def _user_split_sentence(placed: Mapping[int, _Placed], user: Mapping[str, list[int]],
                         culprits: set[int], since: int, idle: float) -> str:
    parts = [f"{_ranks(rs)} stopped at {placed[rs[0]].where}"
             for _sig, rs in sorted(user.items(), key=lambda kv: min(kv[1])) if set(rs) <= culprits]
    rest = [rs for rs in user.values() if not set(rs) <= culprits]
    text = "hang: " + ", ".join(parts) + f" for {idle:.0f} s since iteration {since}"
    if rest:
        text += f"; {_ranks(rest[0])} at {placed[rest[0][0]].where}"
    return text + "; no rank waits in a collective"
