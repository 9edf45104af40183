"""Who waits for whom: the wait evidence of a synchronous job, as pure functions over β arrays.

In a synchronous job every member of a collective (or P2P transfer) leaves it together, when the
last member has arrived and the transfer is done. A member that arrives early spends the time until
the last one arrives inside the collective (on a GPU: an NCCL kernel that spins; on CPU DDP: the
reducer's wait). So, within one group, the ranks that hold a collective *least* arrive last: they are
the candidates for the cause, and the excess of every other member over them is time spent waiting
for them: a consequence, never a finding of its own (docs/design.md section 6, "Culprits and victims").

``late_groups`` finds, per collective function and per group of like workers (the same pipeline
stage where it is known), a small set of late workers that every other member waits for:

- A wait is material when the waiters wait at least ``wait_min`` of the window and at least
  ``pair_ratio`` (¼) of their own collective time longer than the late workers.
- N ≥ 3: some worker lies below the median β of the *other* workers by more than
  δ = ``max(wait_min, k·MADn(others))`` (a low outlier against the spread of the waiting majority,
  leave-one-out so that the late worker's own deviation does not widen it); in a group of more
  than 64 workers the late cluster is every worker below the median by more than δ/2; the late
  workers are a minority of the group (at most ``late_fraction``) and the waiters' median exceeds
  theirs by a material wait (a typical, not only an extreme, late worker);
- N = 2: the one that holds the collective less is late when the other holds it longer by a
  material wait (above).

``wait_min`` (default 5% of the window) is the materiality of a wait: jitter of a clean job moves the
collective shares by a few percent from rank to rank, a slowdown worth a report (≥ 10% of the step)
makes every waiting peer wait for that much. ``cause_of_lateness`` names the late workers' function
that costs them the most time over the waiting workers, in absolute time per window (offline windows
differ in length from rank to rank: a waiting rank's window includes its wait).

``suspect_late_groups`` is the same evidence *given* a suspect: a finding on a few ranks from a test
that does not look at the collectives (the differential or expected-range test on one of their own
functions). Then the question is no longer "is some rank an outlier", which needs a wide margin
against the waiters' spread, but "do the others wait for these ranks", and the answer is yes when
every suspect rank holds the collective less than every other member (below the waiters' 5th
percentile) and the waiters' median excess is at least ``wait_min``, and the suspect's findings cost
it at least ``suspect_cost`` (¼) of that wait. A finding that holds 1% of the window more cannot be why
seven peers wait 31% of it: on the real 8-rank dlrm traces rank 7 holds its all-to-all least because it
began the recorded step late, before its trace starts, and its one finding (1.3% of the window on
an annotation) cost it 0.013 against a wait of 0.308. In the 10 loaded demo runs below the slow
rank's findings cost it 0.32-1.69 of its peers' wait (a slowdown spreads over several functions and
the findings name the largest). Measured on the 2-core host: in
5 demo runs beside two busy loops (4 CPU ranks, one computing 50% more), the waiters' reducer waits
spread by 0.02-0.16 of the window; in 2 of them the outlier test found no late rank (margin 4·MADn
= 0.38, or an excess of 0.1474 against a pair bar of 0.1475), while the slow rank held the wait
0.12-0.35 less than any other rank in all 5.
"""


from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

_MADN = 1.482602218505602  # MAD → σ for normal data (statsmodels' normalization)
_LOO_MAX = 64


@dataclass(frozen=True)
class WaitOptions:
    wait_min: float = 0.05  # share of the window: a smaller wait is not material
    k: float = 4.0  # late = below the median by more than k · MADn (N ≥ 3)
    late_fraction: float = 0.4  # the late workers are at most this share of the group
    pair_ratio: float = 0.25  # the waiters' excess is at least this share of their collective time
    cause_min: float = 0.01  # a late worker's cause holds at least this much more of the window
    suspect_cost: float = 0.25  # a suspect's own findings cost it at least this share of the wait
    stage_ratio: float = 1.2  # a pipeline stage computes at least this many times the lightest stage
    moving_ratio: float = 0.1  # the typical step's slowest rank computes this much over its group's median
    moving_share: float = 0.5  # no rank is the slowest in more than this share of the steps
    even_means: float = 0.5  # the ranks' mean compute differs by less than this share of the typical excess


@dataclass(frozen=True)
class LateGroup:
    """Within one group of workers running collective f: who arrives last and who waits."""

    f: int
    late: np.ndarray  # worker columns, sorted
    waiting: np.ndarray  # worker columns, sorted
    wait_share: float  # median share of the window the waiting workers wait for the late ones
    group: int = -1  # the process group (JobGroups.groups index) it was judged in; -1: a stage or the job


def groups_of(n_workers: int, stage: np.ndarray | None) -> list[np.ndarray]:
    """Like workers: one group per pipeline stage where stages are known, else all workers."""
    if stage is None:
        return [np.arange(n_workers)]
    return [np.flatnonzero(stage == s) for s in np.unique(stage)]


def late_workers(beta: np.ndarray, opts: WaitOptions) -> tuple[np.ndarray, float]:
    """(late mask, the waiters' median excess over the late) for one group's collective shares."""
    b = np.asarray(beta, dtype=np.float64)
    none = np.zeros(b.size, dtype=bool), 0.0
    if b.size < 2 or float(b.max()) <= 0.0:
        return none
    if b.size == 2:
        lo, hi = int(np.argmin(b)), int(np.argmax(b))
        excess = float(b[hi] - b[lo])
        if lo == hi or not material_wait(excess, float(b[hi]), opts):
            return none
        late = np.zeros(2, dtype=bool)
        late[lo] = True
        return late, excess
    delta, med = loo_threshold(b, opts)
    if not (b < med - delta).any():
        return none
    late = b < med - delta
    if b.size > _LOO_MAX:  # the whole late cluster of a large group, not only its most extreme members
        late = b < med - delta / 2
    if late.sum() > opts.late_fraction * b.size:
        return none
    share = float(np.median(b[~late]) - np.median(b[late]))
    return (late, share) if material_wait(share, float(np.median(b[~late])), opts) else none


def material_wait(share: float, waiters: float, opts: WaitOptions) -> bool:
    """The waiters wait for the late ranks at least ``wait_min`` of the window, and at least
    ``pair_ratio`` of their own time in the collective. In a job whose ranks wait for each other a
    lot as a matter of course (4 CPU ranks sharing 2 cores hold the DDP reducer's wait for half of
    the window, each rank late in turn), one rank a little later than the rest is jitter; a culprit
    makes the others' wait a large multiple of its own."""
    return share >= opts.wait_min and share >= opts.pair_ratio * waiters


def loo_threshold(b: np.ndarray, opts: WaitOptions) -> tuple[np.ndarray, np.ndarray]:
    """Per worker: (δ, median) of the *other* workers' shares, δ = max(wait_min, k·MADn(others)).

    Leaving the worker out keeps a late worker's own deviation out of the spread it is judged
    against, which matters at small N (with 4 ranks, one late rank is a quarter of the MAD's input).
    Above ``_LOO_MAX`` workers one worker moves the median and MAD by nothing that matters, and the
    group's own values are used."""
    n = b.size
    if n > _LOO_MAX:
        med = float(np.median(b))
        madn = _MADN * float(np.median(np.abs(b - med)))
        return np.full(n, max(opts.wait_min, opts.k * madn)), np.full(n, med)
    others = np.array([np.delete(b, i) for i in range(n)])  # (n, n-1)
    med = np.median(others, axis=1)
    madn = _MADN * np.median(np.abs(others - med[:, None]), axis=1)
    return np.maximum(opts.wait_min, opts.k * madn), med


def wait_families(labels: list[str], functions: list[int]) -> list[list[int]]:
    """The collective functions grouped into the waits they are parts of: a wait the summarizer
    splits in two (the DDP reducer's steady part and its varying part, agent/summarize/victims.py) is one wait
    here, since how much of it a late peer's delay lands in depends on how much that delay varies.
    The family is the label up to its first ", " or " (". The first member names the family."""
    fam: dict[str, list[int]] = {}
    for f in functions:
        fam.setdefault(labels[f].split(", ")[0].split(" (")[0], []).append(f)
    return list(fam.values())


# per wait family (its first function): the process groups it runs in, (group index, member columns)
MemberSets = Mapping[int, Sequence[tuple[int, np.ndarray]]]


def late_groups(values_beta: np.ndarray, families: list[list[int]], stage: np.ndarray | None,
                opts: WaitOptions, member_sets: MemberSets | None = None) -> list[LateGroup]:
    """Every (wait family, group of like workers) with a late minority. values_beta: (F, N) β.
    ``member_sets``: the process groups a family runs in, where the traces name them (else the
    stages, or the whole job)."""
    out: list[LateGroup] = []
    for f, cols, b, g in family_shares(values_beta, families, stage, member_sets):
        if cols.size < 2:
            continue
        late, share = late_workers(b, opts)
        if not late.any() and cols.size == 2 and g >= 0 and stage is not None:
            late, share = pair_across_stages(values_beta, families, stage, f, cols, b, opts)
        if late.any():
            out.append(LateGroup(f, np.sort(cols[late]), np.sort(cols[~late]), share, g))
    return out


def pair_across_stages(values_beta: np.ndarray, families: list[list[int]], stage: np.ndarray, f: int,
                       cols: np.ndarray, b: np.ndarray, opts: WaitOptions) -> tuple[np.ndarray, float]:
    """(late mask, the wait) of a point-to-point pair whose two ranks are of different pipeline
    stages, judged against each rank's own stage: each stage waits at its send/recv as a matter of
    course (the light stage for the heavy one), so a pair's plain shares can tie while one rank is
    late. The rank that holds the transfer less than its stage's median worker, while its partner
    holds it more than its own stage's median by a material wait (``material_wait``), is late; the
    wait is the partner's excess. Asked only where the plain shares found no late rank. DP32 x PP2,
    rank 30's GPU 1.5x: it held its send/recv 0.138 against its stage's 0.265, its partner 0.089
    against 0.034; 0.049 apart, they were no late pair, and the pair's send/recv was named."""
    none = np.zeros(2, dtype=bool), 0.0
    st = stage[cols]
    if st[0] == st[1] or (st < 0).any():
        return none
    family = next((fam for fam in families if fam[0] == f), [f])
    whole = values_beta[family].sum(axis=0)
    norm = np.array([float(np.median(whole[(stage == s) & (whole > 0)])) for s in st.tolist()])
    rel = b - norm
    lo, hi = int(np.argmin(rel)), int(np.argmax(rel))
    if lo == hi or rel[lo] >= 0.0 or not material_wait(float(rel[hi]), float(b[hi]), opts):
        return none
    late = np.zeros(2, dtype=bool)
    late[lo] = True
    return late, float(rel[hi])


def family_shares(values_beta: np.ndarray, families: list[list[int]], stage: np.ndarray | None,
                  member_sets: MemberSets | None = None) -> Iterator[tuple[int, np.ndarray, np.ndarray, int]]:
    """Per group of like workers and wait family: (the family's first function, the worker columns
    that run it, their summed β, the process group's index or -1). A family whose process groups are
    known is judged within each of them; any other within each stage (or the whole job)."""
    like = groups_of(values_beta.shape[1], stage)
    for family in families:
        sets = member_sets.get(family[0]) if member_sets else None
        for g, members in sets if sets else [(-1, m) for m in like]:
            b = values_beta[family][:, members].sum(axis=0)
            runs = b > 0.0
            yield family[0], members[runs], b[runs], g


_EXPLAINS = 0.5  # a wait elsewhere explains a lateness here when it is at least this share of it


def _ranks_of(late: np.ndarray, waiting: np.ndarray) -> frozenset[int]:
    return frozenset(late.tolist()) | frozenset(waiting.tolist())


def wait_roots(groups: Sequence[LateGroup]) -> tuple[list[LateGroup], list[int]]:
    """The late groups with their roots: (the groups, each late set trimmed to the workers that are
    late on their own where only some of them wait elsewhere; for each, the index of the group at
    the root of its waits).

    A late worker *waits elsewhere* when it is among the waiting workers of a late group of another
    process group whose late workers are not its fellow late workers, and waits there at least half
    (``_EXPLAINS``) as long as it is late here: a rank slowed 2x in a pipeline whose other stage is
    heavier still waits a little for its partner (5% of the window), and is late 12% at its
    data-parallel collective on its own account. The waiters of g wait for the
    last of g's late workers to arrive: when some of them wait elsewhere and some do not, those that
    do not are late on their own and are g's root (g is trimmed to them); when every one of them
    waits elsewhere, the waits are followed there, from group to group, until a group whose late
    workers wait for no one. A cycle stops where it closes.

    What a late worker waits elsewhere explains its lateness only by what it waits there *beyond* the
    workers that wait for it here (the median, over g's waiters, of their wait at the same
    collective in their own groups; 0 where they have none that is material): on a DP32 x PP2 job
    whose stage 1 is heavy, every stage-0 rank waits at its pipeline send/recv for its stage-1
    partner; a stage-0 rank late at its data-parallel all-reduce that waits at its send/recv no more
    than its 31 peers is late on its own account, and the all-reduce's wait is its, not the stage's
    (issue 28: a rank with a 1.3x slower GPU on the light stage was claimed by the stage imbalance).

    Only waits in a *different* process group (both read from the traces) are followed: within one
    group the collectives run one after the other, and a rank late at one of them while it waits
    at the next is two phases of the same step, not a chain (on dlrm, rank 7 arrives last at the
    first all-to-all and waits for ranks 4-5 at the all-reduces). Two groups of the same ranks are
    one group for this: on a two-stage pipeline a replica's send/recv and its embedding all-reduce
    join the same pair, and a stage-0 rank slowed 2x was late at the send/recv while it waited at the
    all-reduce for its partner, which waited for it at the send/recv: a cycle that handed the slowed
    rank's pipeline wait, and its partner's one hop further in the data-parallel group, to the heavy
    stage (DP32 x PP2, ranks 4 and 6 slowed)."""

    def waits_in(late: np.ndarray, waiting: np.ndarray, here: int, share: float) -> list[int]:
        """Per late worker, the first other group's late group it waits in at least half as long as
        it is late here, beyond what ``waiting`` wait at that collective (-1: none)."""
        out = []
        ranks = _ranks_of(late, waiting)
        for r in late.tolist():
            out.append(next((j for j, h in enumerate(groups) if here >= 0 and h.group >= 0 and h.group != here
                             and _ranks_of(h.late, h.waiting) != ranks
                             and r in h.waiting and not np.isin(h.late, late).any()
                             and h.wait_share - peers_wait(h.f, waiting, here) >= _EXPLAINS * share), -1))
        return out

    memo: dict[tuple[int, int, bytes], float] = {}

    def peers_wait(f: int, waiting: np.ndarray, here: int) -> float:
        """The median, over ``waiting``, of each one's wait at collective f in another group than
        ``here`` (its largest where it waits in several; 0 where in none)."""
        key = (f, here, waiting.tobytes())
        if key not in memo:
            best = np.zeros(waiting.size)
            for h in groups:
                if h.f == f and h.group >= 0 and h.group != here:
                    best = np.where(np.isin(waiting, h.waiting), np.maximum(best, h.wait_share), best)
            memo[key] = float(np.median(best)) if waiting.size else 0.0
        return memo[key]

    trimmed = list(groups)
    for i, g in enumerate(groups):
        elsewhere = np.array(waits_in(g.late, g.waiting, g.group, g.wait_share), dtype=np.int64)
        if (elsewhere >= 0).any() and (elsewhere < 0).any():
            trimmed[i] = LateGroup(g.f, g.late[elsewhere < 0], g.waiting, g.wait_share, g.group)
    roots = []
    for i in range(len(trimmed)):
        cur, seen = i, {i}
        while True:
            where = waits_in(trimmed[cur].late, trimmed[cur].waiting, trimmed[cur].group, trimmed[cur].wait_share)
            nxt = where[0] if where and min(where) >= 0 else -1
            if nxt < 0 or nxt in seen:
                break
            seen.add(nxt)
            cur = nxt
        roots.append(cur)
    return trimmed, roots


def cause_of_lateness(values_beta: np.ndarray, candidates: list[int], late: np.ndarray, waiting: np.ndarray,
                      window_s: np.ndarray | None, opts: WaitOptions) -> tuple[int, float] | None:
    """The candidate function the late workers spend the most extra time in, over the waiting ones:
    (function index, excess as a share of the late workers' window), or None when none is material.

    Compared in absolute time (β · each worker's window) so that a waiter's longer window (its wait)
    does not shrink its shares; the excess is then expressed in the late workers' window."""
    if not candidates:
        return None
    b = values_beta[candidates]
    if window_s is not None:
        w = np.where(np.asarray(window_s) > 0, window_s, 1.0)
        t_late = float(np.median(w[late]))
        b = b * (w / t_late)[None, :]
    excess = np.median(b[:, late], axis=1) - np.median(b[:, waiting], axis=1)
    i = int(np.argmax(excess))
    if float(excess[i]) < opts.cause_min:
        return None
    return candidates[i], float(excess[i])


def doing_more(beta_f: np.ndarray, late: np.ndarray, waiting: np.ndarray, window_s: np.ndarray | None) -> np.ndarray:
    """The late workers that spend more time in a function than the waiting workers' median (in
    absolute time, as ``cause_of_lateness`` compares): those its finding names. The cause is chosen
    on the late workers' median; a late worker that spends less in it than the waiters is late for
    something else, and naming it for this cause would be false. ``late`` itself when none does."""
    b = np.asarray(beta_f, dtype=float)
    if window_s is not None:
        w = np.where(np.asarray(window_s) > 0, window_s, 1.0)
        b = b * w
    more = late[b[late] > float(np.median(b[waiting]))]
    return more if more.size else late


_SUSPECT_BELOW_Q = 0.05  # every suspect rank lies below this quantile of the waiting ranks' shares


def suspect_late_groups(values_beta: np.ndarray, families: list[list[int]], stage: np.ndarray | None,
                        suspects: Sequence[tuple[np.ndarray, float]], known: Sequence[LateGroup],
                        opts: WaitOptions, member_sets: MemberSets | None = None) -> list[LateGroup]:
    """Late groups for suspects found by another test, each (worker columns, cost: the share of the
    window their findings hold over the other workers' median): within each group of like workers
    and wait family, the suspect's ranks that run the collective are late when they are a minority
    (at most ``late_fraction``), each holds the collective less than the waiters' 5th percentile, the
    waiters' median exceeds theirs by at least ``wait_min``, and the cost is at least
    ``suspect_cost`` of that excess. (family, rank) pairs already late in ``known`` are not judged
    again."""
    covered = {(g.f, int(r)) for g in known for r in g.late}
    out: list[LateGroup] = []
    for f, cols, b, g in family_shares(values_beta, families, stage, member_sets):
        for idx, cost in suspects:
            late = np.isin(cols, idx)
            n_late = int(late.sum())
            if n_late == 0 or n_late > opts.late_fraction * cols.size:
                continue
            if all((f, int(c)) in covered for c in cols[late]):
                continue
            waiters = b[~late]
            if float(b[late].max()) >= float(np.quantile(waiters, _SUSPECT_BELOW_Q)):
                continue
            share = float(np.median(waiters) - np.median(b[late]))
            if share >= opts.wait_min and cost >= opts.suspect_cost * share:
                out.append(LateGroup(f, np.sort(cols[late]), np.sort(cols[~late]), share, g))
                covered.update((f, int(c)) for c in cols[late])
    return out
