"""The process group of each gloo collective in offline CPU traces (issue 28). Pure: parsed trace
documents in, an assignment out; no I/O.

A CPU gloo job under torch 2.13 writes ``distributedInfo.pg_config`` (the groups the rank belongs
to: name, description, member ranks), but its ``gloo:all_reduce``, ``gloo:send`` and ``gloo:recv``
events carry no ``Process Group Name`` and no ``Src Rank``/``Dst Rank`` (NCCL's
``record_param_comms`` writes those). Which group ran a call can still be read where the traces
leave one answer:

- **Collectives** (``gloo:all_reduce``, ``gloo:broadcast`` ...). A group G is a candidate for rank
  r's calls of name n when r is a member, every member's trace is present, every member made the
  same number of calls of n in the window (one group per rank and name), and, instance by instance
  (the k-th call on each member), the calls overlap: no member leaves before the last one arrives
  (``max start <= min end + clock_tol_us``). That is causality, not a tolerance on how close the
  ends are: under CPU contention the members of one gloo all-reduce leave up to ms apart (1.3 ms
  on the recorded DP2 x PP2 job), but none leaves before the last arrives. Then the choice is
  propagated: a rank left with one candidate uses it, so all of that group's members use it, and a
  group one of whose members is held by another group is no longer a candidate for anyone. A rank
  with exactly one candidate at the end is assigned; none: "no group fits"; several: "ambiguous".
  Needs the ranks' clocks to be comparable (one host, or clocks synchronized to better than the
  calls' overlap): skewed clocks refute true groups, and the call is then left unassigned.
- **Point to point** (``gloo:send``, ``gloo:recv``): the trace names no peer. The call is assigned
  to the rank's only 2-rank group, when it has exactly one and the other member made as many calls
  of the opposite kind (its recvs for these sends). A rank in several 2-rank groups (DP2 x PP2: its
  pipeline pair and its data-parallel pair) is left unassigned: pairing a send with a recv by time
  was tried on the recorded job and refuted true pairs (gloo's send can return before the recv is
  posted, and a window can cut a pair), so it is not used. A send on a larger group (WORLD) to the
  pair's other member would be taken for the pair's; the trace cannot tell them apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

GLOO_PREFIX = "gloo:"
P2P_OPPOSITE = {"gloo:send": "gloo:recv", "gloo:recv": "gloo:send"}


@dataclass(frozen=True)
class RankCalls:
    """One rank's gloo calls and the groups its trace lists."""

    rank: int
    groups: tuple[tuple[str, tuple[int, ...]], ...]  # (group name, member ranks) from pg_config
    calls: Mapping[str, np.ndarray]  # event name -> (k, 2) float64 start and end in µs, by start


@dataclass(frozen=True)
class Assignment:
    groups: dict[tuple[int, str], str] = field(default_factory=dict)  # (rank, event name) -> group name
    unassigned: dict[tuple[int, str], str] = field(default_factory=dict)  # (rank, event name) -> why


def gloo_calls(doc: Mapping[str, Any], rank: int) -> RankCalls:
    """The gloo calls of a parsed Kineto trace and the groups of its ``distributedInfo.pg_config``
    that hold ``rank``. Malformed entries are skipped."""
    groups: list[tuple[str, tuple[int, ...]]] = []
    info = doc.get("distributedInfo")
    for g in (info.get("pg_config") if isinstance(info, dict) else None) or ():
        if not isinstance(g, dict) or isinstance(g.get("pg_name"), bool) or not isinstance(g.get("pg_name"), (str, int)):
            continue
        ranks = g.get("ranks")
        if not isinstance(ranks, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in ranks):
            continue
        if rank in ranks:
            groups.append((str(g["pg_name"]), tuple(ranks)))
    spans: dict[str, list[tuple[float, float]]] = {}
    events = doc.get("traceEvents")
    for ev in events if isinstance(events, list) else ():
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        name, ts, dur = ev.get("name"), ev.get("ts"), ev.get("dur", 0)
        if not isinstance(name, str) or not name.startswith(GLOO_PREFIX):
            continue
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)) or isinstance(ts, bool) \
                or isinstance(dur, bool) or not (np.isfinite(ts) and np.isfinite(dur)) or dur < 0:
            continue
        spans.setdefault(name, []).append((float(ts), float(ts) + float(dur)))
    calls = {n: np.array(sorted(v), dtype=np.float64).reshape(-1, 2) for n, v in spans.items()}
    return RankCalls(rank, tuple(groups), calls)


def assign(ranks: Sequence[RankCalls], clock_tol_us: float = 0.0) -> Assignment:
    """The group of each (rank, gloo event name), where the traces leave one (module docstring)."""
    by_rank = {r.rank: r for r in ranks}
    out = Assignment()
    names = sorted({n for r in ranks for n in r.calls})
    for name in names:
        users = [r for r in ranks if name in r.calls]
        if name in P2P_OPPOSITE:
            _assign_p2p(name, users, by_rank, out)
        else:
            _assign_collective(name, users, by_rank, clock_tol_us, out)
    return out


def _assign_p2p(name: str, users: Sequence[RankCalls], by_rank: Mapping[int, RankCalls], out: Assignment) -> None:
    other = P2P_OPPOSITE[name]
    for r in users:
        pairs = [(g, m) for g, m in r.groups if len(m) == 2]
        if len(pairs) != 1:
            out.unassigned[(r.rank, name)] = (f"{name} names no peer and rank {r.rank} is in {len(pairs)} "
                                              "2-rank groups" if pairs else f"{name} names no peer and rank "
                                              f"{r.rank} is in no 2-rank group")
            continue
        group, members = pairs[0]
        peer = by_rank.get(members[0] if members[1] == r.rank else members[1])
        if peer is None:
            out.unassigned[(r.rank, name)] = f"the trace of rank {members[0] if members[1] == r.rank else members[1]} is missing"
        elif len(peer.calls.get(other, ())) != len(r.calls[name]):
            out.unassigned[(r.rank, name)] = (f"rank {peer.rank} made {len(peer.calls.get(other, ()))} {other} "
                                              f"for {len(r.calls[name])} {name}")
        else:
            out.groups[(r.rank, name)] = group


def _assign_collective(name: str, users: Sequence[RankCalls], by_rank: Mapping[int, RankCalls],
                       clock_tol_us: float, out: Assignment) -> None:
    members_of: dict[str, tuple[int, ...]] = {}
    fits: dict[str, bool] = {}
    cand: dict[int, set[str]] = {}
    for r in users:
        cand[r.rank] = set()
        for g, members in r.groups:
            if len(members) < 2:
                continue
            members_of[g] = members
            if g not in fits:
                fits[g] = _group_fits(name, members, by_rank, clock_tol_us)
            if fits[g]:
                cand[r.rank].add(g)
    held: dict[int, str] = {}  # rank -> the group its calls of name are known to run in
    conflict: set[int] = set()
    changed = True
    while changed:
        changed = False
        for rank, c in cand.items():
            if rank in held or rank in conflict or len(c) != 1:
                continue
            g = next(iter(c))
            if any(g not in cand.get(m, set()) or held.get(m, g) != g for m in members_of[g]):
                conflict.update(members_of[g])
                changed = True
                continue
            for m in members_of[g]:
                held[m] = g
                cand[m] = {g}
            changed = True
        for rank, c in cand.items():  # a group one of whose members is held elsewhere is out
            drop = {g for g in c if any(held.get(m, g) != g for m in members_of[g])}
            if drop and rank not in held:
                c -= drop
                changed = True
    for rank, c in sorted(cand.items()):
        if rank in conflict:
            out.unassigned[(rank, name)] = f"{name}: the ranks' candidate groups contradict each other"
        elif rank in held:
            out.groups[(rank, name)] = held[rank]
        elif not c:
            out.unassigned[(rank, name)] = (f"{name}: no group of rank {rank} fits (a member's trace missing, "
                                            "different call counts, or a member left before the last arrived)")
        else:
            out.unassigned[(rank, name)] = f"{name}: ambiguous between groups {', '.join(sorted(c))}"


def _group_fits(name: str, members: tuple[int, ...], by_rank: Mapping[int, RankCalls], clock_tol_us: float) -> bool:
    """Every member present with the same number of calls of name, and in each instance no member
    leaves before the last one arrives."""
    if any(m not in by_rank or name not in by_rank[m].calls for m in members):
        return False
    spans = [by_rank[m].calls[name] for m in members]
    if len({len(s) for s in spans}) != 1 or len(spans[0]) == 0:
        return False
    stack = np.stack(spans)  # (M, k, 2)
    return bool((stack[:, :, 0].max(axis=0) <= stack[:, :, 1].min(axis=0) + clock_tol_us).all())
