"""From per-function rule outcomes to grouped, labelled and explained findings.

**[decision] Kinds.** A finding on more than half of the workers is *common*. One on at least 3
workers whose β varies from worker to worker by more than half its median (interquartile range ≥
0.5 × median), i.e. no single group pattern, is *random* (the paper's garbage-collection case) and is
summarized as a spread, not rank by rank. Anything else is *specific*.

**[decision] Split.** When the expectation test fires on most workers of a function and the
differential test singles out other workers of it, the function gets two findings: the common one
and the specific one.

**[decision] Waiting is a consequence.** In a synchronous job, workers slowed by f make every other
worker wait in a collective g, so the slow workers are unique on g too, because they hold g *less*.
A differential-only finding whose workers hold the critical path less than the median worker
(observed β ≤ 0.9 × median β), and whose workers are at least half covered by another finding in
which they hold more, is folded into that finding's sentence instead of standing alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from perftracker.localizer.diagnose.evidence.contention import within_contention
from perftracker.localizer.diagnose.evidence.cpu_starvation import (
    cpu_wait_function,
    is_cpu_wait,
    judge_cpu_wait,
    like_peers,
    own_functions,
    shares_cores,
)
from perftracker.localizer.diagnose.evidence.health import (
    WORDED_KEYS,
    evidence_only,
    health_excess,
    health_text,
)
from perftracker.localizer.diagnose.evidence.host_bound import HOST_KEY, top_host_functions
from perftracker.localizer.diagnose.evidence.host_link import apart, needs_range
from perftracker.localizer.diagnose.evidence.imbalance import step_late
from perftracker.localizer.diagnose.evidence.pipeline_schedule import schedule_waits
from perftracker.localizer.diagnose.evidence.waits import (
    LateGroup,
    MemberSets,
    WaitOptions,
    cause_of_lateness,
    doing_more,
    late_groups,
    loo_threshold,
    material_wait,
    suspect_late_groups,
    wait_families,
    wait_roots,
)
from perftracker.localizer.diagnose.method.arrays import FunctionInfo, PatternArrays, nan_row_means
from perftracker.localizer.diagnose.method.distances import exact_median
from perftracker.localizer.diagnose.method.intsets import setdiff_ints
from perftracker.localizer.diagnose.method.options import LocalizeOptions
from perftracker.localizer.diagnose.method.rule import Threshold
from perftracker.localizer.diagnose.verdict.group_findings import (
    HOP,
    GroupCause,
    claim,
    finding_of,
    group_causes,
    group_label,
    groups_note,
    member_sets,
)
from perftracker.localizer.diagnose.verdict.ranking import rank, tier
from perftracker.localizer.diagnose.verdict.shares import bounded_impact, without_culprits
from perftracker.localizer.diagnose.words.explain import (
    Consequence,
    also_clause,
    describe_finding,
    describe_ranks,
    describe_report,
)
from perftracker.localizer.diagnose.words.labels import distinct_labels

from perftracker.model import Box, Category, Finding, TopFunction, Triple, Wait
from perftracker.model.hardware import HEALTH_KEYS, LINK_KEYS, is_health
from perftracker.model.schema import rounded

_RANDOM_MIN_WORKERS = 3
_RANDOM_IQR_OVER_MEDIAN = 0.5
_LESS = 0.9
_FEW_RANKS = 8  # a culprit of at most this many ranks absorbs findings on some of its ranks
_MORE = 1.1


@dataclass(frozen=True, eq=False)
class FunctionVerdict:
    """The rule's outcome for one function. Masks are None when no worker has β > β_min."""

    info: FunctionInfo
    box: Box
    hint: str
    median_beta: float
    by_expectation: np.ndarray | None
    by_differential: np.ndarray | None
    threshold: Threshold | None
    waits_for_peers: bool = False  # the function is time spent waiting for late peers (expect.py)


@dataclass(eq=False)
class _Draft:
    f: int
    verdict: FunctionVerdict
    idx: np.ndarray  # worker columns, sorted
    tests: tuple[str, ...]
    observed: Triple
    median: Triple
    kind: str
    spread: tuple[float, float]
    consequences: list[Consequence]
    folded: bool = False
    waits: dict[str, Wait] | None = None  # collective label -> the peers that wait for these ranks there
    parts: tuple[tuple[str, float], ...] = ()
    also: list[_Draft] | None = None  # other findings on exactly these ranks (one culprit, several symptoms)


def build_findings(arr: PatternArrays, verdicts: Sequence[FunctionVerdict], opts: LocalizeOptions
                   ) -> tuple[list[Finding], list[TopFunction]]:
    """(findings sorted by impact, the top critical-path functions). The sentences do not yet say
    what fixing each cause would save: the savings are replayed after (``savings.py``), and
    ``savings.said`` words them; ``report_summary`` then reads the first."""
    n = arr.n_workers
    common_fraction = opts.common_fraction
    verdicts = _distinct(verdicts)
    drafts: list[_Draft] = []
    medians: dict[int, Triple] = {}
    for f, v in enumerate(verdicts):
        if v.by_expectation is None or v.by_differential is None or evidence_only(v.info.key):
            continue
        by_exp, by_diff = v.by_expectation, v.by_differential
        if v.info.key in WORDED_KEYS or needs_range(v.info.key):  # health, host link: a fault only outside its range (β
            by_diff = by_diff & by_exp  # is its category's time, no signal of its own; health.py)
        if not (by_exp.any() or by_diff.any()):
            continue
        values = arr.values[f]
        median = _median_triple(arr, verdicts, f, medians)
        exp_idx = np.flatnonzero(by_exp)
        diff_only = by_diff & ~by_exp
        groups: list[tuple[np.ndarray, tuple[str, ...]]]
        if exp_idx.size > common_fraction * n and diff_only.any():
            groups = [(exp_idx, ("expectation",)), (np.flatnonzero(diff_only), ("differential",))]
        else:
            idx = np.flatnonzero(by_exp | by_diff)
            tests = tuple(t for t, m in (("expectation", by_exp), ("differential", by_diff)) if m[idx].any())
            groups = [(idx, tests)]
        for idx, tests in groups:
            drafts.append(_draft(f, v, values, idx, tests, _stage_median(arr, values, idx, median), n,
                                 common_fraction))
    _fold_consequences(drafts, arr)
    _cpu_wait_to_own_work(drafts, arr, verdicts, n, common_fraction)
    stage, moving = group_causes(arr, opts.waits)
    if stage.stage is not None and _one_rank_per_stage(arr):
        stage = GroupCause()  # a stage of one rank is that rank: its own findings name what it does more
    _fold_waits(drafts, arr, verdicts, opts.waits, (stage, moving))
    for d in drafts:
        if d.verdict.info.key == HOST_KEY:
            d.parts = top_host_functions(arr, d.idx, labels=[v.info.label for v in verdicts])
    kept = _merge_same_ranks([d for d in drafts if not d.folded])
    material = opts.waits.wait_min
    kept.sort(key=lambda d: (_tier(d, material), -_impact(d), d.verdict.info.key, int(d.idx[0])))
    max_points = opts.max_points
    findings = [_finding(d, arr, max_points) for d in kept]
    causes: list[Finding] = []
    if stage.stage is not None or moving.moving is not None:
        compute = [f for f, i in enumerate(arr.functions) if i.category is Category.COMPUTE and not is_health(i.key)
                   and not is_cpu_wait(i)]
        compute_beta = arr.values[compute, 0, :].sum(axis=0)
        causes = [g for g in (finding_of(c, arr, compute_beta) for c in (stage, moving)) if g is not None]
    # one order for every finding, a set of ranks' causes among them (ranking.py)
    return rank(causes + findings, material), top_functions(arr, verdicts, opts.top_functions, medians)


def _distinct(verdicts: Sequence[FunctionVerdict]) -> list[FunctionVerdict]:
    """The verdicts with labels that identify: two call paths of one function never share a label
    (``labels.distinct_labels``: the callers that tell them apart)."""
    names = distinct_labels([v.info.key for v in verdicts], [v.info.label for v in verdicts])
    return [v if name == v.info.label else dataclasses.replace(v, info=dataclasses.replace(v.info, label=name))
            for v, name in zip(verdicts, names, strict=True)]


def report_summary(arr: PatternArrays, findings: Sequence[Finding], top: Sequence[TopFunction]) -> str:
    """The report's one line: the first finding's sentence (and how many more), or what holds the
    critical path when nothing is abnormal; the process groups' source where there are several ranks."""
    n = arr.n_workers
    summary = describe_report(len(findings), findings[0].sentence if findings else "", n,
                              [(t.label, t.median.beta) for t in top], int(arr.ranks[0]) if n == 1 else None)
    return summary + (f" [{groups_note(arr)}]" if n > 1 else "")


def _one_rank_per_stage(arr: PatternArrays) -> bool:
    """A pipeline with no data-parallel replica (issue 31): each stage is one worker, so a heavy stage
    and a slowed rank are the same data, and the rank's own findings (its function, the waits folded
    into it) say more than "stage k computes more"."""
    if arr.stage is None:
        return False
    st = arr.stage[arr.stage >= 0]
    return st.size > 1 and np.unique(st).size == st.size


def _stage_median(arr: PatternArrays, values: np.ndarray, idx: np.ndarray, median: Triple) -> Triple:
    """The median worker of the pipeline stage that holds all of ``idx`` (like with like: issue 28),
    else ``median`` (the job's)."""
    if arr.stage is None or idx.size == 0:
        return median
    st = arr.stage[idx]
    if (st != st[0]).any() or st[0] < 0 or (arr.stage == st[0]).all():
        return median
    if setdiff_ints(np.flatnonzero(arr.stage == st[0]), idx).size == 0:
        return median  # a stage of these ranks alone (one rank per stage): no like peer to compare with
    return Triple(*(float(x) for x in np.median(values[:, arr.stage == st[0]], axis=1)))


def _draft(f: int, v: FunctionVerdict, values: np.ndarray, idx: np.ndarray, tests: tuple[str, ...],
           median: Triple, n: int, common_fraction: float) -> _Draft:
    sub = values[:, idx]
    observed = Triple(*(float(x) for x in np.median(sub, axis=1)))
    beta = sub[0]
    q10, q25, q75, q90 = (float(x) for x in np.quantile(beta, [0.1, 0.25, 0.75, 0.9]))
    if idx.size > common_fraction * n:
        kind = "common"
    elif idx.size >= _RANDOM_MIN_WORKERS and (q75 - q25) >= _RANDOM_IQR_OVER_MEDIAN * observed.beta:
        kind = "random"
    else:
        kind = "specific"
    return _Draft(f, v, idx, tests, observed, median, kind, (q10, q90), [])


def _fold_consequences(drafts: list[_Draft], arr: PatternArrays) -> None:
    for b in drafts:
        if b.tests != ("differential",) or b.kind == "common" or b.median.beta <= 0:
            continue
        if b.observed.beta > _LESS * b.median.beta:
            continue
        for a in drafts:
            if a is b or a.folded or a.observed.beta < _MORE * a.median.beta:
                continue
            if np.intersect1d(a.idx, b.idx, assume_unique=True).size * 2 >= b.idx.size:
                if b.verdict.info.key not in HEALTH_KEYS:  # a health pattern's β is only its category's time
                    a.consequences.append(Consequence(b.verdict.info.label, b.observed.beta / b.median.beta))
                b.folded = True
                break


def _is_wait(info: FunctionInfo) -> bool:
    return info.category is Category.COLLECTIVE and info.key not in HEALTH_KEYS


def _fold_waits(drafts: list[_Draft], arr: PatternArrays, verdicts: Sequence[FunctionVerdict],
                opts: WaitOptions, group_causes: tuple[GroupCause, GroupCause] | None = None) -> None:
    """Waits are consequences (docs/design.md section 6): find the late workers of each collective, within
    each process group it runs in where the traces name them (else each stage, or the job), follow
    the waits from group to group to their root (``wait_roots``: late workers that are themselves
    waiting elsewhere are victims too), give every waiting peer's excess to the root's own finding
    (or make one from the wait evidence when it has none; a heavy pipeline stage or a step group
    whose slowest rank moves takes its waits as a cause of its own, ``group_findings``), and fold
    every collective finding of the waiting workers into it."""
    beta = arr.values[:, 0, :]
    waits = sorted((f for f, v in enumerate(verdicts) if _is_wait(v.info)), key=lambda f: verdicts[f].waits_for_peers)
    families = wait_families([v.info.label for v in verdicts], waits)
    causes = [f for f, v in enumerate(verdicts) if not _is_wait(v.info) and v.info.key not in HEALTH_KEYS | {HOST_KEY}]
    sets = member_sets(arr, families)
    groups = late_groups(beta, families, arr.stage, opts, sets)
    groups += _step_late_groups(arr, families, sets, groups, opts)
    groups += _flagged_early_exits(drafts, beta, families, groups, opts, sets)
    suspects = _suspects(drafts)
    groups += suspect_late_groups(beta, families, arr.stage, suspects, groups, opts, sets)
    groups = _one_late_set_per_group(groups)
    groups.sort(key=lambda g: -g.wait_share)
    _drop_split_early_exits(drafts, families, groups)
    waiting = np.zeros(arr.n_workers, dtype=bool)
    for lg in groups:
        waiting[lg.waiting] = True
    groups, roots = wait_roots(groups)
    claimed = [False] * len(groups)
    if group_causes is not None:
        claimed = claim(arr, groups, roots, [verdicts[lg.f].info.label for lg in groups], *group_causes)
    sched = schedule_waits(beta, families, arr.stage, sets, groups, opts)
    claimed = [c or sched[roots[i]] for i, c in enumerate(claimed)]  # a pipeline's own bubble is no rank's
    culprits = [d for d in drafts if not d.folded and d.kind != "common" and d.observed.beta >= d.median.beta
                and d.verdict.info.key not in HEALTH_KEYS
                and not (_is_wait(d.verdict.info) and 2 * int(waiting[d.idx].sum()) >= d.idx.size)]
    owners: list[tuple[np.ndarray, _Draft]] = []
    for i, lg in enumerate(groups):
        if claimed[i]:
            continue
        root = groups[roots[i]]
        label = group_label(arr, verdicts[lg.f].info.label, lg.group)
        if root is not lg:  # a victim one hop (or more) further: it waits for ranks that wait for the root
            label += HOP
        owner = _owner(culprits, root.late)
        rest = _unexplained(culprits, root.late, root.wait_share, opts) if owner is None else root.late
        if owner is None and rest.size == 0:  # each late rank has a culprit of its own: the widest takes the wait
            owner = max(culprits, key=lambda d: (np.intersect1d(d.idx, root.late).size, _impact(d)))
        if owner is None:
            like = _like(arr, root.late, root.waiting)
            cands = _computes_more(arr, rest, like, _unless_own_work_wait(arr, causes, rest, like), opts)
            cause = cause_of_lateness(beta, cands, rest, like,
                                      arr.worker_window_s, opts)
            if cause is None and within_contention(arr, root.wait_share, root.late, root.waiting):
                claimed[i] = True  # the scheduler's, no rank's (contention.py): its waiters' findings fold
                continue
            f = root.f if cause is None else cause[0]
            who = rest if cause is None else doing_more(beta[f], rest, like, arr.worker_window_s)
            of_waiters = Triple(*(float(x) for x in np.median(arr.values[f][:, root.waiting], axis=1)))
            owner = _draft(f, verdicts[f], arr.values[f], who, ("waits",), of_waiters, arr.n_workers, 1.0)
            owner.kind = "specific"  # compared with the ranks that wait for it, never "random"
            drafts.append(owner)
            culprits.append(owner)
        _add_wait(owner, Wait(label, tuple(np.sort(arr.ranks[lg.waiting]).tolist()), lg.wait_share))
        owners.append((lg.waiting, owner))
    for i, lg in enumerate(groups):  # a claimed group's waiters' collective findings are the group cause's
        if claimed[i]:
            for v in drafts:
                if not v.folded and _is_wait(v.verdict.info) and np.isin(v.idx, lg.waiting).all():
                    v.folded = True
    for d in drafts:  # ranks of one host read one TCP counter: only a host apart from the others has a bad link
        if not d.folded and d.kind != "common" and not apart(d.verdict.info.key, d.observed.mu, d.median.mu):
            d.folded = True
    links = [d for d in drafts if not d.folded and d.kind != "common" and d.verdict.info.key in LINK_KEYS]
    family_of = {f: fam for fam in families for f in fam}
    for v in drafts:  # a collective finding of workers that wait for a culprit is the culprit's
        if v.folded or not _is_wait(v.verdict.info) or any(v is c for c in culprits):
            continue
        if links:  # one host's bad link slows every collective through it: the link is the cause
            excess = _own_impact(v)
            ranks = tuple(np.sort(arr.ranks[setdiff_ints(v.idx, links[0].idx)]).tolist())
            if ranks and excess > 0:
                _add_wait(links[0], Wait(v.verdict.info.label, ranks, excess))
            v.folded = True
            continue
        family = family_of.get(v.f, [v.f])
        if _explained_by_waits(v, beta[family].sum(axis=0), arr.stage, family[0], groups, opts.wait_min):
            c = max(culprits, key=lambda d: np.intersect1d(d.idx, v.idx).size, default=None)
            if c is not None and np.intersect1d(c.idx, v.idx).size:
                c.consequences.append(Consequence(v.verdict.info.label, v.observed.beta / v.median.beta))
            v.folded = True
            continue
        # judged on the whole wait family: a waiter may hold one part of a split wait longer than
        # the late rank and the whole wait no longer than its fellow waiters
        whole = beta[family].sum(axis=0)
        median_g, held = float(np.median(whole)), float(np.median(whole[v.idx]))
        for c in [o for w, o in owners if 2 * np.intersect1d(w, v.idx).size >= v.idx.size] + \
                sorted(culprits, key=lambda d: -_impact(d)):
            if c is v:
                continue
            if np.intersect1d(c.idx, v.idx).size * 2 > v.idx.size:
                if v.observed.beta < v.median.beta and v.median.beta > 0:  # the culprit's own early exit
                    c.consequences.append(Consequence(v.verdict.info.label, v.observed.beta / v.median.beta))
                    v.folded = True
                    break
                continue
            late_share = float(np.median(whole[c.idx]))
            if late_share <= median_g and late_share + 0.5 * opts.wait_min <= held:
                ranks = tuple(np.sort(arr.ranks[setdiff_ints(v.idx, c.idx)]).tolist())
                if not _waits_cover(c, verdicts[family[0]].info.label, ranks):
                    _add_wait(c, Wait(verdicts[family[0]].info.label, ranks, held - late_share))
                v.folded = True
                break
    _drop_split_long_waits(drafts, beta, families, opts)


def _cpu_wait_to_own_work(drafts: list[_Draft], arr: PatternArrays, verdicts: Sequence[FunctionVerdict], n: int,
                          common_fraction: float) -> None:
    """A rank-specific CPU-wait finding whose ranks' own work grew (``cpu_starvation``) is that work's:
    it folds, as an "also" clause, into the finding of the function whose β grew most on those ranks
    (made from the differential evidence when the wait took so much of that function's critical path
    that it was not flagged itself)."""
    wait_f = cpu_wait_function(arr.functions)
    if wait_f is None:
        return
    beta = arr.values[:, 0, :]
    own_fs = own_functions(arr.functions)
    for d in [d for d in drafts if d.f == wait_f and not d.folded and d.kind != "common"
              and d.observed.beta > d.median.beta]:
        peers = like_peers(arr, d.idx)
        if peers.size == 0:
            continue
        verdict = judge_cpu_wait(beta, own_fs, d.idx, peers)
        if not verdict.work_grew or verdict.work is None:
            if shares_cores(arr, d.idx, peers):  # the scheduler's placement on shared cores, no rank's
                d.folded = True
            continue
        g = verdict.work
        work = next((w for w in drafts if w.f == g and not w.folded and np.isin(d.idx, w.idx).all()), None)
        if work is None:
            values = arr.values[g]
            of_peers = Triple(*(float(x) for x in np.median(values[:, peers], axis=1)))
            work = _draft(g, verdicts[g], values, d.idx, ("differential",), of_peers, n, common_fraction)
            work.kind = "specific"
            drafts.append(work)
        work.also = (work.also or []) + [d]
        work.consequences.extend(d.consequences)
        d.folded = True


def _unless_own_work_wait(arr: PatternArrays, causes: list[int], late: np.ndarray, like: np.ndarray) -> list[int]:
    """The candidate causes of lateness without the CPU wait where the late ranks' wait came with their
    own work (``cpu_starvation``): then the work is the cause."""
    wait_f = cpu_wait_function(arr.functions)
    if wait_f is None or wait_f not in causes or like.size == 0:
        return causes
    verdict = judge_cpu_wait(arr.values[:, 0, :], own_functions(arr.functions), late, like)
    shared = shares_cores(arr, late, like)  # a longer wait for a shared core is no cause of the rank's
    return [f for f in causes if f != wait_f] if verdict.work_grew or shared else causes


def _like(arr: PatternArrays, late: np.ndarray, waiting: np.ndarray) -> np.ndarray:
    """The waiting workers of the late workers' pipeline stage, where all of these are of one stage
    and some waiters are too (a cause is what the late workers do more than their like peers)."""
    if arr.stage is None:
        return waiting
    st = np.unique(arr.stage[late])
    same = waiting[arr.stage[waiting] == st[0]] if st.size == 1 else waiting[:0]
    return same if same.size else waiting


def _computes_more(arr: PatternArrays, late: np.ndarray, like: np.ndarray, causes: list[int], opts: WaitOptions
                   ) -> list[int]:
    """The candidate causes of lateness: only the compute functions where the per-step compute says
    the late workers compute more per step than their like peers (by ``moving_ratio``), else all.
    On a trace whose collectives start when the last member arrives the waiters' waits are idle
    GPU time, so "nothing on the critical path" differs between late and waiting workers by the
    waits themselves, not by a host stall."""
    steps = arr.job_groups.steps
    if steps is None:
        return causes
    mine, theirs = nan_row_means(steps[late]), nan_row_means(steps[like])
    if not (np.isfinite(mine).all() and np.isfinite(theirs).any()):
        return causes
    if float(np.median(mine)) < (1.0 + opts.moving_ratio) * float(np.nanmedian(theirs)):
        return causes
    compute = [f for f in causes if arr.functions[f].category is Category.COMPUTE]
    return compute or causes


def _step_late_groups(arr: PatternArrays, families: list[list[int]], sets: MemberSets, known: Sequence[LateGroup],
                      opts: WaitOptions) -> list[LateGroup]:
    """Late groups from the per-step compute (``imbalance.step_late``): members of a step group that
    the others wait for step after step, where the collective shares did not show it (a trace whose
    collectives start when the last member arrives shows the waits as idle time). Each is judged at
    the step group's first collective."""
    out: list[LateGroup] = []
    covered = {(g.group, int(r)) for g in known for r in g.late}
    for g, late, waiting, share in step_late(arr.job_groups.steps, arr.job_groups.step_group, float(arr.window_s),
                                            opts):
        if all((g, int(r)) in covered for r in late):
            continue
        head = next((fam[0] for fam in families if any(i == g for i, _ in sets.get(fam[0], ()))), None)
        if head is not None:
            out.append(LateGroup(head, late, waiting, share, g))
    return out


def _suspects(drafts: Sequence[_Draft]) -> list[tuple[np.ndarray, float]]:
    """The ranks of each specific finding on one of their own functions (not a wait), with what
    their findings cost them: the share of the window those functions hold over the median rank,
    summed over the findings on exactly these ranks."""
    cost: dict[tuple[int, ...], float] = {}
    for d in drafts:
        if (not d.folded and d.kind == "specific" and d.observed.beta >= d.median.beta
                and d.verdict.info.key not in HEALTH_KEYS and not _is_wait(d.verdict.info)):
            key = tuple(np.sort(d.idx).tolist())
            cost[key] = cost.get(key, 0.0) + d.observed.beta - d.median.beta
    return [(np.array(k, dtype=np.int64), c) for k, c in cost.items()]


def _flagged_early_exits(drafts: Sequence[_Draft], beta: np.ndarray, families: list[list[int]],
                         known: Sequence[LateGroup], opts: WaitOptions, sets: MemberSets | None = None
                         ) -> list[LateGroup]:
    """Late groups from collective findings whose ranks hold the collective materially *less* than
    the others (the differential test singled them out: they arrive last), where the wait evidence
    itself was not clear enough (a noisy group). Judged, like the wait evidence, on the whole wait
    family (a rank that holds one part of the DDP reducer's wait less may hold the other part more),
    and within each process group the family runs in where the traces name them (one finding may
    hold the late ranks of several groups: each group's members wait only for their own; on a DP32 x
    PP2 job one finding held ranks 4 and 6, late in stage 0's data-parallel group, and 5 and 7, late
    in stage 1's, and judged across both made a late group of the job that no cause owned). The
    others' excess must be a material wait.
    Such a finding may already be folded into its ranks' own finding as a consequence; its waits
    still count."""
    family_of = {f: fam for fam in families for f in fam}
    covered = {(g.f, int(r)) for g in known for r in g.late}
    out = []
    for v in drafts:
        info = v.verdict.info
        if not _is_wait(info) or v.kind == "common" or v.tests != ("differential",):
            continue
        family = family_of.get(v.f, [v.f])
        head = family[0]
        if all((head, int(r)) in covered for r in v.idx):
            continue
        b = beta[family].sum(axis=0)
        runs = b > 0
        named: Sequence[tuple[int, np.ndarray | None]] = (sets or {}).get(head) or [(-1, None)]
        for g, members in named:
            if members is None:  # the whole job (or its stages): as before the groups were read
                late, others = v.idx, setdiff_ints(np.flatnonzero(runs), v.idx)
            else:
                inside = np.zeros(b.size, dtype=bool)
                inside[members] = True
                inside &= runs
                mine = np.zeros(b.size, dtype=bool)
                mine[v.idx] = True
                late, others = np.flatnonzero(inside & mine), np.flatnonzero(inside & ~mine)
            if late.size == 0 or others.size == 0:
                continue
            if g >= 0 and all((head, int(r)) in covered for r in late):
                continue
            share = float(np.median(b[others]) - np.median(b[late]))
            if material_wait(share, float(np.median(b[others])), opts):
                out.append(LateGroup(head, np.sort(late), others, share, g))
                covered.update((head, int(r)) for r in late)
    return out


def _explained_by_waits(v: _Draft, b: np.ndarray, stage: np.ndarray | None, head: int,
                        groups: Sequence[LateGroup], wait_min: float) -> bool:
    """A collective finding says nothing of its own when the wait evidence of its family (``b``: the
    family's β per worker) accounts for every one of its ranks: each is late in a late group (whose
    wait went to that group's owner or cause) or waits in one, and none holds the collective a
    material wait (``wait_min``) longer than its stage's median worker beyond what it waits in those
    groups (such a wait is judged with the culprits, below). A rank that holds it *less* arrives late: it is a late group's, or it
    arrives after its fellow waiters but before the late ones and no one waits for it. On a DP32 x
    PP2 job with ranks 4 and 6 slowed, one finding held the stage-0 all-reduce's late ranks (4, 6),
    the stage-1 all-reduce's (5, 7, late one hop further: they waited for 4 and 6 at the pipeline)
    and rank 0, which idles on its own and still waited for 4 and 6."""
    mine = [g for g in groups if g.f == head]
    if not mine or v.median.beta <= 0:
        return False
    inside = np.zeros(b.size, dtype=bool)
    waited = np.zeros(b.size)  # a waiter's wait there is the group's
    for g in mine:
        inside[g.late] = True
        inside[g.waiting] = True
        waited[g.waiting] = np.maximum(waited[g.waiting], g.wait_share)
    if not inside[v.idx].all():
        return False
    like = stage if stage is not None else np.zeros(b.size, dtype=np.int64)
    for s in np.unique(like[v.idx]).tolist():
        peers = b[(like == s) & (b > 0)]
        rows = v.idx[like[v.idx] == s]
        if peers.size and (b[rows] >= float(np.median(peers)) + wait_min + waited[rows]).any():
            return False
    return True


def _one_late_set_per_group(groups: Sequence[LateGroup]) -> list[LateGroup]:
    """One late set per collective family and named process group: the late groups the several
    kinds of evidence (the collective shares, the per-step compute, a flagged early exit, a suspect)
    found in the same process group are one, late ranks put together (its waiters are the members
    that are late in none; its wait the largest). Its owner is then chosen once for the set, as for
    a cluster of late ranks the shares found together. DP32 x PP2 with rank 10 slowed: the per-step
    compute found rank 10 late in stage 0's data-parallel group, and rank 0's early exit from the
    same all-reduce (it idles 2 ms a step on its own, and still waits for rank 10) made a second late
    group there, and a finding on rank 0 whose replayed saving was 0. Groups of a stage or of the
    whole job (no process group read) are left as they are."""
    merged: dict[tuple[int, int], LateGroup] = {}
    out: list[LateGroup] = []
    for lg in groups:
        key = (lg.f, lg.group)
        old = merged.get(key) if lg.group >= 0 else None
        if old is None:
            if lg.group >= 0:
                merged[key] = lg
            out.append(lg)
            continue
        late = np.union1d(old.late, lg.late)
        waiting = np.setdiff1d(np.union1d(old.waiting, lg.waiting), late)
        merged[key] = LateGroup(lg.f, late, waiting, max(old.wait_share, lg.wait_share), lg.group)
        out[next(i for i, g in enumerate(out) if g is old)] = merged[key]
    return out


def _drop_split_early_exits(drafts: Sequence[_Draft], families: list[list[int]], groups: Sequence[LateGroup]) -> None:
    """A finding that some ranks hold one *part* of a split wait (the DDP reducer's steady and varying
    parts) less, where those ranks are not late for the wait as a whole, says only how a peer's
    delay split between the parts on them: no finding."""
    family_of = {f: fam for fam in families for f in fam}
    late = {(g.f, int(r)) for g in groups for r in g.late}
    for v in drafts:
        if v.folded or not _is_wait(v.verdict.info) or v.observed.beta >= v.median.beta:
            continue
        family = family_of.get(v.f, [v.f])
        if len(family) > 1 and not any((family[0], int(r)) in late for r in v.idx):
            v.folded = True


def _drop_split_long_waits(drafts: Sequence[_Draft], beta: np.ndarray, families: list[list[int]],
                           opts: WaitOptions) -> None:
    """The mirror of ``_drop_split_early_exits``: a finding that some ranks hold one *part* of a split
    wait longer, left over after the waits were folded into their culprits, stands only when those
    ranks wait longer for the wait as a whole too: above the other ranks' median by more than the
    δ a late rank must lie below it (``late_workers``). Otherwise it says only how the ranks'
    waiting split between the parts (on a loaded 2-core host rank 0 of a clean job held the
    reducer's steady part 0.26 of the window against 0.13-0.16, and the whole wait 0.58 against
    0.45-0.56)."""
    family_of = {f: fam for fam in families for f in fam}
    for v in drafts:
        if v.folded or not _is_wait(v.verdict.info) or v.observed.beta <= v.median.beta or "waits" in v.tests:
            continue
        family = family_of.get(v.f, [v.f])
        if len(family) < 2:
            continue
        whole = beta[family].sum(axis=0)
        runs = np.flatnonzero(whole > 0)
        others = np.setdiff1d(runs, v.idx)
        if others.size < 2:
            continue
        delta, med = loo_threshold(np.r_[whole[others], np.median(whole[v.idx])], opts)
        if float(np.median(whole[v.idx])) <= float(med[-1] + delta[-1]):
            v.folded = True


def _owner(culprits: Sequence[_Draft], late: np.ndarray) -> _Draft | None:
    """The culprit finding that covers at least half of the late workers (the costliest such)."""
    covering = [d for d in culprits if np.intersect1d(d.idx, late).size * 2 >= late.size]
    return max(covering, key=_impact, default=None)


def _unexplained(culprits: Sequence[_Draft], late: np.ndarray, wait_share: float, opts: WaitOptions) -> np.ndarray:
    """The late workers that no culprit finding already names. A late rank with a finding of its own
    that costs it at least ``suspect_cost`` of the wait (the bar of ``suspect_late_groups``) is late
    for that cause; the group's other late ranks are searched for theirs alone, so that one rank's
    cause is not painted on another (imbalance-r2 of the GPU bench: rank 2's GPU work made it late at
    the all-reduce with ranks 4 and 5, whose extra host time then named rank 2 a host stall, while
    rank 2 held less of that idle time than the ranks that waited)."""
    named = [d.idx for d in culprits if _own_impact(d) >= opts.suspect_cost * wait_share]
    if not named:
        return late
    return np.setdiff1d(late, np.concatenate(named))


def _waits_cover(d: _Draft, label: str, ranks: tuple[int, ...]) -> bool:
    """The finding already says that these ranks wait for it in this collective (in one of its
    process groups)."""
    said = {r for w in (d.waits or {}).values() if w.function == label or w.function.startswith(label + " in ")
            for r in w.ranks}
    return set(ranks) <= said


def _add_wait(d: _Draft, w: Wait) -> None:
    w = Wait(w.function, w.ranks, rounded(w.share))
    if d.waits is None:
        d.waits = {}
    old = d.waits.get(w.function)
    # the ranks of every wait at the same collective, at the largest share (a wait no larger than
    # the one already said lost its ranks: two slowed ranks' partners, each 0.2 at its own send/recv,
    # read as one)
    d.waits[w.function] = w if old is None else Wait(w.function, tuple(sorted(set(old.ranks) | set(w.ranks))),
                                                     max(old.share, w.share))


def _tier(d: _Draft, material: float) -> int:
    """A draft's tier (``ranking.tier``: the rule is stated there)."""
    return tier(d.kind, d.tests, bool(d.waits), _impact(d), material, d.verdict.info.key)


def _merge_same_ranks(kept: list[_Draft]) -> list[_Draft]:
    """Rank-specific findings on the same ranks, or on some of the few (≤ 8) ranks of a costlier
    finding, are one culprit with several symptoms (a slow copy and the host op that waits for it):
    the costliest keeps the others as "also" clauses, and their waits."""
    # hardware evidence (a throttled clock, a stalled port) names the cause of the same ranks' slower
    # kernels or collectives: it leads, they are its symptoms (health.py)
    specific = sorted((d for d in kept if d.kind != "common"),
                      key=lambda d: (d.verdict.info.key not in WORDED_KEYS, -_impact(d)))
    for i, d in enumerate(specific):
        for primary in specific[:i]:
            if primary.folded or not np.isin(d.idx, primary.idx).all():
                continue
            if d.idx.size < primary.idx.size and primary.idx.size > _FEW_RANKS:
                continue  # a part of a large group (3 of 48 hosts) is a finding of its own
            primary.also = (primary.also or []) + [d]
            for w in (d.waits or {}).values():
                _add_wait(primary, w)
            d.folded = True
            break
    return [d for d in kept if not d.folded]


def _own_impact(d: _Draft) -> float:
    health = health_excess(d.verdict.info.key, d.observed, d.median)
    if health is not None:  # a clock or port: the time it costs, not its β's distance (health.py)
        return health
    over_box = d.observed.beta - d.verdict.box.hi.beta if "expectation" in d.tests else 0.0
    return max(over_box, abs(d.observed.beta - d.median.beta), 0.0)


def _impact(d: _Draft) -> float:
    """The finding's cost to the step, as a share of the window: its own excess on the critical path
    (above the expected range, or off the median worker) plus the waits it induces in its peers."""
    induced = sum(w.share for w in d.waits.values()) if d.waits else 0.0
    return _own_impact(d) + induced + 1e-3 * d.observed.beta


def _finding(d: _Draft, arr: PatternArrays, max_points: int) -> Finding:
    info = d.verdict.info
    ranks = np.sort(arr.ranks[d.idx])
    waits = without_culprits(sorted(d.waits.values(), key=lambda w: -w.share), ranks.tolist()) if d.waits else ()
    label = info.label
    if info.key in WORDED_KEYS:  # a throttled GPU, a slow InfiniBand port: their facts (health.py)
        label, sentence = health_text(info.key, arr, d.f, d.idx, ranks.tolist(), d.observed, d.median,
                                      (d.verdict.box.lo.mu, d.verdict.box.hi.mu), d.verdict.hint, waits)
    else:
        sentence = describe_finding(
            label=info.label, key=info.key, category=info.category, resource=info.resource, kind=d.kind,
            ranks=ranks.tolist(), n_workers=arr.n_workers, observed=d.observed, median=d.median,
            expected=d.verdict.box, tests=d.tests, hint=d.verdict.hint, gpu=arr.gpu, beta_spread=d.spread,
            consequences=d.consequences, waits=waits, parts=d.parts)
    for o in d.also or ():
        on = "" if o.idx.size == d.idx.size else f" on {describe_ranks(np.sort(arr.ranks[o.idx]).tolist(), arr.n_workers)}"
        sentence += f"; also{on} " + also_clause(o.verdict.info.label, o.verdict.info.key, o.verdict.info.category,
                                                 o.observed, o.median, arr.gpu)
    impact = rounded(bounded_impact(_own_impact(d), waits))  # what it costs one rank (shares.py)
    saves = _saves(d, arr, waits)
    return Finding(
        key=info.key, label=label, category=info.category, ranks=tuple(ranks.tolist()), kind=d.kind,
        tests=d.tests, observed=d.observed, median=d.median, expected=d.verdict.box, sentence=sentence,
        points=_points(arr, d.f, d.idx, max_points), impact=impact, impact_s=rounded(impact * float(arr.window_s)),
        waits=waits, parts=d.parts, saves_share=rounded(saves), saves_s=rounded(saves * float(arr.window_s)))


def _saves(d: _Draft, arr: PatternArrays, waits: tuple[Wait, ...]) -> float:
    """What fixing this finding's cause would save, as a share of the window: a stated estimate, not
    a replay of the step's dependency graph. A cause that others wait for holds the step up by its
    own excess on the critical path and by the waits it induces in each group along the step (a
    pipeline partner's send/recv, then the data-parallel collectives, one after the other), so
    fixing it saves about its impact; a cause that no one waits for saves its own excess; a common
    finding (most ranks) has no peer to be brought to: judged against its expected range, it saves
    its excess over the top of that range (issue 47: every finding whose cost is measured says what
    fixing it saves), else none. On the bench mutator's slowed workers
    of the DP32 x PP2 traces this came within 0.05-0.17 (relative) of the replayed saving (one
    worker x2.3 in stage 0 or 1, two workers x2 in stage 0). Waits in one collective of a job
    with no pipeline stage known: the cause's excess and its peers' wait there are one interval
    seen from both sides (a late rank's 'cause outside the profile' finding has, as its own excess,
    the waiters' share itself), so they count once, the larger of the two: the sum read 'rank 1
    waits 37% ... saves ~74%' on a 2-rank DDP job (on the DP32 x PP2 traces the sum stands: there
    the max under-predicted 21%/34%, 18%/44%, 16%/29%)."""
    if arr.window_s <= 0:
        return 0.0
    if d.kind == "common":  # no peer to be brought to: down to the top of its expected range, if judged by it
        return min(1.0, max(0.0, d.observed.beta - d.verdict.box.hi.beta)) if "expectation" in d.tests else 0.0
    if len(waits) == 1 and (arr.stage is None or not bool((arr.stage > 0).any())):
        return min(1.0, max(_own_impact(d), waits[0].share))
    return min(1.0, _impact(d) if waits else _own_impact(d))


def _points(arr: PatternArrays, f: int, idx: np.ndarray, max_points: int) -> tuple[tuple[int, float, float], ...]:
    """(rank, β, μ) of the abnormal workers and of evenly spaced others, at most max_points in all."""
    n = arr.n_workers
    take_flagged = _spaced(idx, max_points // 2 if idx.size < n else max_points)
    if idx.size < n:
        mask = np.ones(n, dtype=bool)
        mask[idx] = False
        others = np.flatnonzero(mask)
    else:
        others = idx[:0]
    take_others = _spaced(others, max_points - take_flagged.size)
    cols = np.concatenate([take_flagged, take_others])
    v = arr.values[f]
    return tuple((int(arr.ranks[c]), round(float(v[0, c]), 6), round(float(v[1, c]), 6)) for c in cols)


def _spaced(idx: np.ndarray, k: int) -> np.ndarray:
    if k <= 0:
        return idx[:0]
    if idx.size <= k:
        return idx
    return idx[np.linspace(0, idx.size - 1, k).astype(np.int64)]


def _median_triple(arr: PatternArrays, verdicts: Sequence[FunctionVerdict], f: int,
                   cache: dict[int, Triple]) -> Triple:
    """The median worker's pattern of function f (β's median is already in the verdict)."""
    if f not in cache:
        v = arr.values[f]
        cache[f] = Triple(verdicts[f].median_beta, exact_median(v[1]), exact_median(v[2]))
    return cache[f]


def top_functions(arr: PatternArrays, verdicts: Sequence[FunctionVerdict], n: int,
                  cache: dict[int, Triple] | None = None) -> list[TopFunction]:
    """The n functions with the largest median β (shown when nothing is abnormal). The link-health
    patterns (``HEALTH_KEYS``) are left out: their β is their category's time, not their own."""
    funcs = [f for f in range(len(verdicts)) if verdicts[f].info.key not in HEALTH_KEYS]
    order = sorted(funcs, key=lambda f: (-verdicts[f].median_beta, verdicts[f].info.key))[:n]
    cache = {} if cache is None else cache
    out = []
    for f in order:
        info = verdicts[f].info
        out.append(TopFunction(info.key, info.label, info.category, _median_triple(arr, verdicts, f, cache)))
    return out
