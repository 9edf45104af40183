"""What fixing a culprit would save, by replaying the recorded steps (issue 28). Pure numpy.

Each worker's step record (``perftracker.model.step_record``) lists the collective instances and
point-to-point transfers of its last steps: when it arrived, how long it was in each. Between two
instances a worker does its own work; the *gap* before an instance is its arrival minus the end of
the instance it follows (the latest one that had ended by then; a send and a recv launched together
follow the same one). The replay is the dependency graph these make:

    arrival = end of the instance it follows + its gap        (the record's start: 0 + gap)
    end     = the members' latest arrival + the transfer      (every member; a recv waits for its
                                                                 sender, and the sender for it)

with the transfer the shortest member's time in the instance (the others waited). Replayed as
recorded, it gives each step's length (the latest end of the step's instances, minus the previous
step's), and no step is shorter than the longest host's own time in it (``host_floor``, where the
records know the hosts); that must reproduce the recorded steps (within ``CONSISTENT``), else the
instances do not line up and the replay says "inconclusive". Replayed again with the culprit ranks
behaving like their median peer (each culprit gap, and the transfer of each instance it is in,
replaced by the median of its like peers' at the same place: the same pipeline stage, the same
sequence of instances; its host's own time too for a cause on its host), the saving is
what the replayed steps lose against the replayed steps as recorded, summed over every step of
the record (a pause every other step counts by what it costs over the steps, which a median over
them would not see). The first step has no replayed start: fixed, it is taken to be as long as
the median fixed step, and as recorded that plus how much earlier a worker's last instance of it
ends fixed (the most over the workers).

Only the culprit's connected ranks are replayed, at most ``MAX_RANKS`` (the culprit's groups,
then theirs, breadth first); members beyond them are left out of their instances (taken as on time).
A standing wait (another rank that is late at the same instances) stays in the replay: fixing the
culprit saves only down to it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from perftracker.model.step_record import StepRecord

MAX_RANKS = 256
MAX_PEERS = 16
CONSISTENT = 0.2  # the recorded replay's steps within this share of the recorded steps (median)
MIN_STEPS = 1  # steps after the first the saving is summed over

_Key = tuple[str, str, int, int, int]


@dataclass(frozen=True)
class Replay:
    saves: float  # share of the step; 0 when inconclusive
    steps: int  # how many steps were replayed
    inconclusive: str = ""  # why the replay could not say, "" when it did
    # whether some like peer's transfers are of other instances than the culprit's: where every
    # peer is in every instance the culprit is in (one group of all ranks), a slow link of the
    # culprit slows its peers' transfers alike and the replay cannot tell it from theirs
    links: bool = False


@dataclass(frozen=True)
class _Chain:
    """One worker's record as arrays, rows in arrival order."""

    keys: list[_Key]
    kinds: tuple[str, ...]  # per row: what it is (the like-peer signature)
    arrival: np.ndarray  # µs from the record's start
    dur: np.ndarray
    pred: np.ndarray  # row each follows, -1: the record's start
    gap: np.ndarray
    step: np.ndarray  # step of each row, counted from the last (-1 = the last step)
    steps_us: np.ndarray
    host_us: np.ndarray  # per step, the host's own time (empty: not known)
    compute: np.ndarray  # per row, the worker's compute in its gap (µs, at most the gap)


def chain(rec: StepRecord) -> _Chain:
    rows = np.array(rec.rows, dtype=np.int64).reshape(-1, 8)
    order = np.argsort(rows[:, 5], kind="stable")
    rows = rows[order]
    arrival = rows[:, 5].astype(np.float64)
    dur = rows[:, 6].astype(np.float64)
    pred = predecessors(arrival, arrival + dur)
    prev_end = np.where(pred >= 0, (arrival + dur)[np.maximum(pred, 0)], 0.0)
    steps_us = np.array(rec.steps_us, dtype=np.float64)
    step = np.searchsorted(np.cumsum(steps_us), arrival, side="right") - len(steps_us)
    keys = [(rec.groups[g], rec.kinds[k] if src < 0 and dst < 0 else "", int(seq), int(src), int(dst))
            for g, k, seq, src, dst in rows[:, :5].tolist()]
    kinds = tuple(f"{rec.kinds[k]}{'>' if src >= 0 or dst >= 0 else ''}" for _, k, _, src, dst in rows[:, :5].tolist())
    gap = np.maximum(arrival - prev_end, 0.0)
    return _Chain(keys, kinds, arrival, dur, pred, gap, np.minimum(step, -1), steps_us,
                  np.array(rec.host_us, dtype=np.float64), np.minimum(rows[:, 7].astype(np.float64), gap))


TOUCH_US = 2.0  # an instance that ends this close after an arrival ended by it (times are rounded to 1 µs)


def predecessors(arrival: np.ndarray, end: np.ndarray, tol_us: float = TOUCH_US) -> np.ndarray:
    """Per row (arrival order): the earlier row with the latest end that had ended by its arrival
    (within ``tol_us``), -1 when none had."""
    out = np.full(arrival.shape[0], -1, dtype=np.int64)
    best, best_end = -1, -np.inf
    pending: list[int] = []
    for j in range(arrival.shape[0]):
        keep = []
        for i in pending:
            if end[i] <= arrival[j] + tol_us:
                if end[i] >= best_end:
                    best, best_end = i, float(end[i])
            else:
                keep.append(i)
        pending = keep
        out[j] = best
        pending.append(j)
    return out


def pair_transfers(chains: Sequence[_Chain]) -> None:
    """Key each point-to-point transfer by its place in its directed channel (group, source,
    destination): the k-th row of the channel on the sender with the k-th on the receiver, where
    the two records hold the same number of them. The ``seq`` a trace gives a send or recv counts
    that rank's own point-to-point operations of the group, and on a pipeline deeper than two
    stages a send and its recv carry different numbers (sa_st: rank 3's sends to rank 2 are 184-187,
    rank 2's recvs of them 368-371): keyed by it, no transfer had two members and the replay knew
    no stage waits for another. Where the counts differ (records cut apart), the trace's numbers
    stay. In place."""
    at: dict[tuple[str, int, int], list[tuple[int, int]]] = {}
    for w, c in enumerate(chains):
        for j, (g, _kind, _, src, dst) in enumerate(c.keys):
            if src >= 0 or dst >= 0:
                at.setdefault((g, src, dst), []).append((w, j))
    for (g, src, dst), rows in at.items():
        per: dict[int, list[int]] = {}
        for w, j in rows:
            per.setdefault(w, []).append(j)
        if len(per) != 2 or len({len(v) for v in per.values()}) != 1:
            continue
        for w, js in per.items():
            for k, j in enumerate(sorted(js, key=lambda j: float(chains[w].arrival[j]))):
                chains[w].keys[j] = (g, "", k, src, dst)


@dataclass(frozen=True)
class _Job:
    """The replayed workers' instances: per instance its members (worker, row) and transfer time."""

    chains: list[_Chain]
    members: list[list[tuple[int, int]]]
    inst: list[list[int]]  # per worker, per row: its instance
    transfer: np.ndarray


def job(chains: list[_Chain]) -> _Job:
    members: dict[_Key, list[tuple[int, int]]] = {}
    for w, c in enumerate(chains):
        for j, k in enumerate(c.keys):
            members.setdefault(k, []).append((w, j))
    inst = [[0] * len(c.keys) for c in chains]
    instances = list(members.values())
    for i, ms in enumerate(instances):
        for w, j in ms:
            inst[w][j] = i
    transfer = np.array([min(float(chains[w].dur[j]) for w, j in ms) for ms in instances])
    return _Job(chains, instances, inst, transfer)


def replay_ends(jb: _Job, gaps: Sequence[np.ndarray], transfer: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(per step of the record, the first first, when its latest instance ends; per instance, when
    it ends), µs from the record's start, or None when the instances form no order (they do not
    line up). A step's length is the time between two such ends; the first step's end, from the
    record's start, holds its own work but not the tail of the step before it."""
    chains, instances = jb.chains, jb.members
    pending = [len(ms) for ms in instances]
    follows: list[list[list[int]]] = [[[] for _ in c.keys] for c in chains]
    ready: list[tuple[int, int]] = []
    for w, c in enumerate(chains):
        for j, p in enumerate(c.pred.tolist()):
            (ready.append((w, j)) if p < 0 else follows[w][p].append(j))
    end = np.full(len(instances), np.nan)
    latest = np.full(len(instances), -np.inf)
    while ready:
        w, j = ready.pop()
        p = int(chains[w].pred[j])
        a = (0.0 if p < 0 else float(end[jb.inst[w][p]])) + float(gaps[w][j])
        i = jb.inst[w][j]
        latest[i] = max(latest[i], a)
        pending[i] -= 1
        if pending[i] == 0:
            end[i] = latest[i] + transfer[i]
            for w2, j2 in instances[i]:
                ready.extend((w2, x) for x in follows[w2][j2])
    if np.isnan(end).any():
        return None
    step = np.array([min(int(chains[w].step[j]) for w, j in ms) for ms in instances])
    lo = int(step.min())
    t = np.array([float(end[step == s].max()) if (step == s).any() else np.nan for s in range(lo, 0)])
    return None if np.isnan(t).any() else (t, end)


def host_floor(chains: Sequence[_Chain], k: int, replace: dict[int, np.ndarray] | None = None) -> np.ndarray:
    """Per step (the last k), the longest host's own time: no step is shorter than that (0 where
    no worker's host is known)."""
    rows = [(replace or {}).get(w, c.host_us) for w, c in enumerate(chains)]
    rows = [r[-k:] for r in rows if r.size >= k]
    return np.max(np.stack(rows), axis=0) if rows else np.zeros(k)


def roles(c: _Chain) -> list[tuple[str, int]]:
    """Each row's place in its worker's record: (what it is, how many of that came before it).
    Like ranks (the same stage) have the same places: the k-th send to the next stage, the k-th
    all-reduce of the data-parallel group."""
    seen: dict[str, int] = {}
    out = []
    for kd in c.kinds:
        out.append((kd, seen.get(kd, 0)))
        seen[kd] = seen.get(kd, 0) + 1
    return out


def like_rows(chains: dict[int, _Chain], culprit: int, candidates: Sequence[int]) -> list[tuple[int, np.ndarray]]:
    """The like peers (the same stage, the same number of recorded steps) with, per culprit row,
    their row of the same place (``roles``; -1: none), those that share at least half of the
    culprit's places, at most ``MAX_PEERS``."""
    c = chains[culprit]
    mine = roles(c)
    out = []
    for p in candidates:
        pc = chains[p]
        if pc.steps_us.size != c.steps_us.size:
            continue
        at = {r: j for j, r in enumerate(roles(pc))}
        idx = np.array([at.get(r, -1) for r in mine], dtype=np.int64)
        if 2 * int((idx >= 0).sum()) >= len(mine):
            out.append((p, idx))
            if len(out) >= MAX_PEERS:
                break
    return out


def _median_at(values: list[np.ndarray], own: np.ndarray) -> np.ndarray:
    """Per row, the median of the peers' values (NaN: the peer has no such row); ``own`` where none has."""
    stack = np.stack(values)
    have = ~np.isnan(stack).all(axis=0)
    med = np.array(own, dtype=np.float64)
    med[have] = np.nanmedian(stack[:, have], axis=0)
    return med


def replay_saving(records: Sequence[StepRecord | None], culprits: Sequence[int],
                  stage: np.ndarray | None, host: bool | Collection[int] = True,
                  link_scale: Mapping[int, float] | None = None) -> Replay | None:
    """What the culprit columns behaving like their median like peer would save (module doc);
    None when a culprit has no record (the caller estimates instead). ``host``: the cause is on the
    culprit's host (its host's own time becomes its peers' too), for every culprit (True) or for
    those columns; a cause on its GPU or link leaves its host as it is (a rank that does more host
    work than its peers keeps doing it). ``link_scale``: culprit column -> the share of its
    instances' transfer time a healthy link would take (``savings.link_scale``, from its port's
    stall share): its transfers become that, not its peers' (which, in one group of all ranks, are
    the same slowed instances)."""
    host_cols = set(culprits) if host is True else set() if host is False else set(host)
    scale = dict(link_scale or {})
    if not culprits or any(records[c] is None for c in culprits):
        return None
    have = [w for w, r in enumerate(records) if r is not None and r.rows]
    if not set(culprits) <= set(have):
        return None
    chains = _Chains(records)
    bad = set(culprits)
    peers: dict[int, list[tuple[int, np.ndarray]]] = {}
    for c in culprits:
        same = [w for w in have if w not in bad and (stage is None or stage[w] == stage[c])]
        peers[c] = like_rows(chains, c, same)
        if not peers[c]:
            return Replay(0.0, 0, "no peer of the culprit's stage ran the same collective instances")
    cols = _connected(records, list(culprits))
    got = _recorded_run(records, chains, cols)
    if isinstance(got, Replay):
        return got
    jb, base_run, base = got
    gaps = [c.gap for c in jb.chains]
    transfer = jb.transfer.copy()
    floors: dict[int, np.ndarray] = {}
    tmin: dict[_Key, float] = {}
    links = False
    for i, w in enumerate(cols):
        if w not in bad:
            continue
        ch = chains[w]
        gaps[i] = _median_at([np.where(idx >= 0, chains[p].gap[np.maximum(idx, 0)], np.nan)
                              for p, idx in peers[w]], ch.gap)
        # the culprit's transfers as its peers' (a slow link of its own), never longer than recorded
        tmin = tmin if tmin else _transfers(chains.built())
        theirs = _median_at([np.array([tmin[chains[p].keys[x]] if x >= 0 else np.nan for x in idx.tolist()])
                             for p, idx in peers[w]], np.full(len(ch.keys), np.inf))
        links = links or any(x >= 0 and chains[p].keys[x] != ch.keys[j] for p, idx in peers[w]
                             for j, x in enumerate(idx.tolist()))
        for j, t in enumerate(theirs.tolist()):
            inst = jb.inst[i][j]
            transfer[inst] = min(transfer[inst], jb.transfer[inst] * scale[w] if w in scale else t)
        hs = [chains[p].host_us for p, _ in peers[w] if chains[p].host_us.size == ch.host_us.size]
        if w in host_cols and ch.host_us.size and hs:
            floors[i] = np.median(np.stack(hs), axis=0)
    return _fixed_saving(jb, base_run, base, gaps, transfer, floors, links)


def _recorded_run(records: Sequence[StepRecord | None], chains: _Chains, cols: list[int]
                  ) -> tuple[_Job, tuple[np.ndarray, np.ndarray], np.ndarray] | Replay:
    """The job of these columns replayed as recorded: (job, its run, its steps after the first,
    floored by the hosts), or the inconclusive Replay that says why not."""
    pair_transfers([chains[w] for w in sorted(set(cols) | set(chains))])
    jb = job([chains[w] for w in cols])
    base_run = replay_ends(jb, [c.gap for c in jb.chains], jb.transfer)
    if base_run is None or base_run[0].size - 1 < MIN_STEPS:
        return Replay(0.0, 0, "the ranks' collective instances do not line up step by step")
    base = np.diff(base_run[0])
    k = base.size
    base = np.maximum(base, host_floor(jb.chains, k))
    recorded = np.median(np.stack([c.steps_us[-k:] for c in jb.chains if c.steps_us.size >= k]), axis=0)
    off = off_recorded(base, recorded)
    if not np.isfinite(off) or off > CONSISTENT:
        return Replay(0.0, 0, f"the replayed steps are {off:.0%} off the recorded ones")
    return jb, base_run, base


def replay_scaled(records: Sequence[StepRecord | None], scale: Mapping[int, float]) -> Replay | None:
    """What the columns of ``scale`` computing that share of their recorded compute would save (a
    heavy pipeline stage's excess removed: each gap of theirs loses the compute it held times 1 -
    its scale; their transfers and host stay as recorded, and so does everyone else). The pipeline
    schedule's dependencies do the rest: warm-up, steady one-forward-one-backward, cool-down and
    the collectives between the stages (the data-parallel reduction, the embedding all-reduce
    between the first and the last stage) all follow from the recorded instances. None when a
    column has no record."""
    cols0 = sorted(scale)
    if not cols0 or any(c >= len(records) or records[c] is None for c in cols0):
        return None
    chains = _Chains(records)
    cols = _connected(records, cols0)
    got = _recorded_run(records, chains, cols)
    if isinstance(got, Replay):
        return got
    jb, base_run, base = got
    gaps = [c.gap for c in jb.chains]
    for i, w in enumerate(cols):
        if w in scale:
            f = min(1.0, max(0.0, float(scale[w])))
            gaps[i] = np.maximum(jb.chains[i].gap - jb.chains[i].compute * (1.0 - f), 0.0)
    return _fixed_saving(jb, base_run, base, gaps, jb.transfer, {}, False)


def pipeline_compute_us(rec: StepRecord) -> float | None:
    """A worker's compute per step in its pipeline's microbatches: the median over the record's
    steps of the compute before its point-to-point transfers (a send and a recv launched together
    share one gap: counted once); None without transfers. A heavy stage's excess is this against
    the other stages'."""
    c = chain(rec)
    p2p = np.array([k[3] >= 0 or k[4] >= 0 for k in c.keys], dtype=bool)
    if not p2p.any() or not c.steps_us.size:
        return None
    together = np.zeros_like(p2p)
    together[1:] = (c.arrival[1:] == c.arrival[:-1]) & (c.pred[1:] == c.pred[:-1])
    per = [float(c.compute[p2p & ~together & (c.step == st)].sum()) for st in np.unique(c.step).tolist()]
    return float(np.median(per))


def _fixed_saving(jb: _Job, base_run: tuple[np.ndarray, np.ndarray], base: np.ndarray, gaps: Sequence[np.ndarray],
                  transfer: np.ndarray, floors: dict[int, np.ndarray], links: bool) -> Replay:
    """The saving of the fixed replay (``gaps``, ``transfer``, host ``floors``) against the replay as
    recorded (module doc)."""
    k = base.size
    fixed_run = replay_ends(jb, gaps, transfer)
    if fixed_run is None:
        return Replay(0.0, 0, "the ranks' collective instances do not line up step by step")
    fixed_gpu = np.diff(fixed_run[0])
    fixed = np.maximum(fixed_gpu, host_floor(jb.chains, k, floors))
    # the first step has no replayed start (its latest end, from the record's start, lacks the tail
    # of the step before it, and each stage's record starts at its own step boundary): fixed, it is
    # taken to be as long as the median fixed step, and as recorded that plus how much earlier a
    # worker's last instance of it ends once fixed (the most, over the workers: the culprit's cycle),
    # within the same host floors
    like = float(np.median(fixed_gpu))
    first_base = max(like + first_moved(jb, base_run[1], fixed_run[1]), float(host_floor(jb.chains, k + 1)[0]))
    first_fixed = max(like, float(host_floor(jb.chains, k + 1, floors)[0]))
    saved = max(0.0, first_base - first_fixed) + float((base - fixed).sum())
    saves = saved / max(first_base + float(base.sum()), 1e-9)
    return Replay(min(1.0, max(0.0, saves)), k + 1, links=links)


def first_moved(jb: _Job, base_end: np.ndarray, fixed_end: np.ndarray) -> float:
    """How much earlier, the most over the workers, a worker's last instance of the record's first
    step ends in the fixed replay than in the replay as recorded (µs, at least 0)."""
    first = min(int(c.step.min()) for c in jb.chains if c.step.size)
    moved = 0.0
    for w, c in enumerate(jb.chains):
        rows = np.flatnonzero(c.step == first)
        if rows.size:
            i = jb.inst[w][int(rows[-1])]
            moved = max(moved, float(base_end[i] - fixed_end[i]))
    return moved


def off_recorded(replayed: np.ndarray, recorded: np.ndarray) -> float:
    """How far the replayed steps lie from the recorded ones: the median relative difference."""
    return float(np.median(np.abs(replayed - recorded) / np.maximum(recorded, 1.0)))


def _transfers(chains: dict[int, _Chain]) -> dict[_Key, float]:
    """Every instance's transfer: its shortest member's time in it."""
    out: dict[_Key, float] = {}
    for c in chains.values():
        for k, d in zip(c.keys, c.dur.tolist(), strict=True):
            out[k] = min(out.get(k, np.inf), d)
    return out


class _Chains(dict[int, _Chain]):
    """The workers' chains, each built when first asked for (a large job's other ranks never are)."""

    def __init__(self, records: Sequence[StepRecord | None]) -> None:
        super().__init__()
        self._records = records

    def __missing__(self, w: int) -> _Chain:
        rec = self._records[w]
        assert rec is not None
        c = self[w] = chain(rec)
        return c

    def built(self) -> dict[int, _Chain]:
        return dict(self)


def _connected(records: Sequence[StepRecord | None], start: list[int]) -> list[int]:
    """The culprits, then the ranks that share a process group with them (their records name it),
    breadth first, at most MAX_RANKS. Workers whose trace names no group share the group "": the
    whole job."""
    by_group: dict[str, list[int]] = {}
    for w, r in enumerate(records):
        if r is not None and r.rows:
            for g in r.groups:
                by_group.setdefault(g, []).append(w)
    seen = list(dict.fromkeys(start))
    taken = set(seen)
    i = 0
    while i < len(seen) and len(seen) < MAX_RANKS:
        rec = records[seen[i]]
        for g in rec.groups if rec is not None else ():
            for w in by_group.get(g, ()):
                if w not in taken and len(seen) < MAX_RANKS:
                    taken.add(w)
                    seen.append(w)
        i += 1
    return sorted(seen)
