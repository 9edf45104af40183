"""Findings of a whole set of ranks (issue 28): a heavy pipeline stage, work that moves from rank to
rank with each step, and the process groups the wait evidence was judged in. Pure.

``group_causes`` finds them (``perftracker.localizer.diagnose.evidence.imbalance``) before the waits are
folded; ``claim`` takes the late groups they explain (a heavy stage's pipeline partners wait for
it in send/recv; a moving step group's members wait for whoever is slowest this step), so that no
rank of the stage or of the step group is named a culprit on its own; ``finding_of`` writes the
finding with every wait it took.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from perftracker.localizer.diagnose.evidence.cpu_starvation import is_cpu_wait
from perftracker.localizer.diagnose.evidence.imbalance import (
    MovingImbalance,
    StageImbalance,
    compute_seconds,
    moving_imbalance,
    moving_saves,
    stage_imbalance,
    stage_saves,
    steady_excess,
)
from perftracker.localizer.diagnose.evidence.waits import LateGroup, MemberSets, WaitOptions
from perftracker.localizer.diagnose.method.arrays import PatternArrays
from perftracker.localizer.diagnose.method.expect import OPEN_BOX
from perftracker.localizer.diagnose.verdict.shares import largest_wait_impact, without_culprits
from perftracker.localizer.diagnose.words.explain import describe_ranks, frame_text, pct

from perftracker.model import Category, Finding, Triple, Wait
from perftracker.model.hardware import is_health
from perftracker.model.schema import rounded

STAGE_KEY = "pipeline stage imbalance"
MOVING_KEY = "moving imbalance (slowest rank changes from step to step)"
HOP = ", one hop further"  # a wait label's suffix: these ranks wait for ranks that wait for the root


@dataclass
class GroupCause:
    """A cause that belongs to a set of ranks, with the waits it explains."""

    stage: StageImbalance | None = None
    moving: MovingImbalance | None = None
    waits: dict[str, Wait] = field(default_factory=dict)

    def add(self, w: Wait) -> None:
        old = self.waits.get(w.function)
        if old is None:
            self.waits[w.function] = w
        else:
            self.waits[w.function] = Wait(w.function, tuple(sorted(set(old.ranks) | set(w.ranks))),
                                          max(old.share, w.share))


def member_sets(arr: PatternArrays, families: Sequence[Sequence[int]]) -> MemberSets:
    """Per wait family (its first function): the process groups its functions run in, with their
    members, where the traces name them."""
    jg = arr.job_groups
    out: dict[int, list[tuple[int, np.ndarray]]] = {}
    if not jg.read:
        return out
    for family in families:
        idx = sorted({g for f in family for g in jg.comm.get(arr.functions[f].key, ())})
        if idx:
            out[family[0]] = [(g, jg.groups[g].members) for g in idx]
    return out


def group_label(arr: PatternArrays, label: str, group: int) -> str:
    """A collective's label with the group it ran in: "ncclDevKernel_SendRecv in PIPELINE_MODEL_PARALLEL_GROUP"."""
    if group < 0 or not arr.job_groups.read:
        return label
    g = arr.job_groups.groups[group]
    if label.endswith("]") and " [" in label:  # the summarizer named it by its group already
        return label
    return f"{label} in {g.desc or 'group ' + g.name}"


def group_causes(arr: PatternArrays, opts: WaitOptions) -> tuple[GroupCause, GroupCause]:
    """(the stage cause, the moving cause); each may hold nothing."""
    jg = arr.job_groups
    stage = None
    if arr.stage is not None:  # the workers' compute in seconds only where there are stages to compare
        compute = [f for f, info in enumerate(arr.functions) if info.category is Category.COMPUTE
                   and not is_health(info.key) and not is_cpu_wait(info)]  # a wait for a core is no compute
        seconds = compute_seconds(arr.values[:, 0, :], compute, arr.worker_window_s, float(arr.window_s))
        stage = stage_imbalance(seconds, arr.stage, float(arr.window_s), opts)
    return (GroupCause(stage=stage),
            GroupCause(moving=moving_imbalance(jg.steps, jg.step_group, float(arr.window_s), opts)))


def claim(arr: PatternArrays, groups: Sequence[LateGroup], roots: Sequence[int], labels: Sequence[str],
          stage: GroupCause, moving: GroupCause) -> list[bool]:
    """Per late group: True when a group cause explains it, and the wait then goes to that cause:
    its late workers (or its root's) are all of the heavy stage and its waiters all of other stages
    (a group across stages: the pipeline's send/recv, an embedding group), or its root was judged in
    a step group whose slowest rank moves and its late workers are not steadily slower there
    (``_steady``: a rank with a slow GPU in a group whose work moves is late on its own account). The group's own late workers are asked first: a stage-1
    rank that is late for its stage-0 partner because the heavy stage is late is the stage's
    doing, even when that rank also waits for a slow peer of its own stage."""
    out = []
    for i, lg in enumerate(groups):
        root = groups[roots[i]]
        s, m = stage.stage, moving.moving
        label = group_label(arr, labels[i], lg.group)
        if s is not None and _across(lg, s):  # the heavy stage is late in a group across stages
            stage.add(Wait(label, tuple(np.sort(arr.ranks[lg.waiting]).tolist()), rounded(lg.wait_share)))
            out.append(True)
            continue
        if root is not lg:
            label += HOP
        wait = Wait(label, tuple(np.sort(arr.ranks[lg.waiting]).tolist()), rounded(lg.wait_share))
        if s is not None and _across(root, s):
            stage.add(wait)
            out.append(True)
        elif m is not None and root.group >= 0 and root.group in m.groups and not _steady(arr, root):
            moving.add(wait)
            out.append(True)
        else:
            out.append(False)
    return out


def _steady(arr: PatternArrays, root: LateGroup) -> bool:
    """The root's late workers compute more than their step group's median member on average over
    the steps, by at least half of the wait judged: late on their own account, not by the work
    that moves from rank to rank (whose members' means are even)."""
    jg = arr.job_groups
    return steady_excess(jg.steps, jg.step_group, root.group, root.late, float(arr.window_s)) >= 0.5 * root.wait_share


def _across(lg: LateGroup, s: StageImbalance) -> bool:
    """The late workers are all of the heavy stage, the waiters all of other stages."""
    return bool(np.isin(lg.late, s.members).all() and not np.isin(lg.waiting, s.members).any())


def finding_of(cause: GroupCause, arr: PatternArrays, beta_compute: np.ndarray) -> Finding | None:
    """The finding of a group cause, or None when it holds nothing."""
    n = arr.n_workers
    culprits = arr.ranks[cause.stage.members].tolist() if cause.stage is not None else []
    waits = without_culprits(sorted(cause.waits.values(), key=lambda w: -w.share), culprits)
    wait_text = "".join(f"; {describe_ranks(list(w.ranks), n)} {'waits' if len(w.ranks) == 1 else 'wait'} for it "
                        f"{pct(w.share)} of the window in {frame_text(w.function)}" for w in waits)
    if cause.stage is not None:
        s = cause.stage
        ranks = tuple(np.sort(arr.ranks[s.members]).tolist())
        heavy, light = float(np.median(beta_compute[s.members])), float(np.median(beta_compute[s.waiting]))
        sentence = (f"pipeline stage {s.heavy} ({describe_ranks(list(ranks), n)}) computes {s.ratio:.2f}× stage "
                    f"{s.lightest}: its compute holds {pct(heavy)} of the window against {pct(light)}, and the other "
                    f"stages wait for it about {pct(s.cost)} of the window{wait_text} — rebalance the layers "
                    f"between the pipeline stages")
        impact = largest_wait_impact(s.cost, waits)
        jg = arr.job_groups
        if jg.steps is not None and arr.stage is not None:
            saves = stage_saves(jg.steps, arr.stage, s.heavy) / 1000.0 / float(arr.window_s)
        else:  # balanced, the heavy stage would compute halfway to the lightest: half of what it costs
            saves = s.cost / 2.0
        return _finding(STAGE_KEY, f"pipeline stage {s.heavy}", ranks, "specific", sentence, heavy, light,
                        impact, arr, waits, saves)
    if cause.moving is not None:
        m = cause.moving
        ranks = tuple(np.sort(arr.ranks[m.members]).tolist())
        descs = {arr.job_groups.groups[g].desc.upper() for g in m.groups}
        who = "data-parallel rank" if descs and all("DATA" in d for d in descs) else "rank of its group"
        of = "its stage's" if arr.stage is not None else "its group's"
        sentence = (f"no single culprit rank: the slowest {who} changes from step to step ({m.ratio_lo:.2f}-"
                    f"{m.ratio_hi:.2f}× {of} median over {m.steps} steps, {m.slowest} different ranks slowest, "
                    f"their mean compute even) — data or sequence-length imbalance; the other ranks wait for the "
                    f"slowest {pct(m.cost)} of the window{wait_text}")
        b = float(np.median(beta_compute[m.members]))
        impact = largest_wait_impact(m.cost, waits)
        jg = arr.job_groups
        saves = m.cost
        if jg.steps is not None and jg.step_group is not None:
            saves = moving_saves(jg.steps, jg.step_group, m.groups) / 1000.0 / float(arr.window_s)
        return _finding(MOVING_KEY, "slowest rank moves from step to step", ranks, "random", sentence, b, b,
                        impact, arr, waits, saves)
    return None


def _finding(key: str, label: str, ranks: tuple[int, ...], kind: str, sentence: str, observed: float,
             median: float, impact: float, arr: PatternArrays, waits: tuple[Wait, ...], saves: float) -> Finding:
    saves = min(1.0, max(0.0, saves))
    return Finding(key=key, label=label, category=Category.COMPUTE, ranks=ranks, kind=kind, tests=("waits",),
                   observed=Triple(rounded(observed), 0.0, 0.0), median=Triple(rounded(median), 0.0, 0.0),
                   expected=OPEN_BOX, sentence=sentence, impact=rounded(impact),
                   impact_s=rounded(impact * float(arr.window_s)), waits=waits, saves_share=rounded(saves),
                   saves_s=rounded(saves * float(arr.window_s)))


def groups_note(arr: PatternArrays) -> str:
    """What the report says of the process groups: read from the traces, or inferred."""
    jg = arr.job_groups
    if jg.read:
        return f"groups: read ({len(jg.groups)} process groups)"
    return "groups: inferred (one group)" if arr.stage is None else "groups: inferred (one per pipeline stage)"
