"""What fixing each finding's cause would save: the replay where the workers sent step records
(``replay.py``), else the finding's stated estimate (``findings._saves``, ``group_findings``), and
which of the two each finding carries (``Finding.saves_basis``). Pure.

A finding on some ranks (not a common one, not a whole stage or the moving work: those keep their
estimates) is replayed with those ranks behaving like their median like peer in what the finding
is about: their host's own time too for a host-side (Python) cause, only their GPU-side gaps and
transfers for a cause on the GPU or a link. A slow InfiniBand port in a job whose every collective
spans all ranks has no peer with a healthy transfer of the same instance: there its transfers take
the share a port stalled like its peers' would (``link_scale``). Where the replay cannot say (the
instances do not line up, no like peer, a culprit whose window runs apart from the others', or
another link finding whose peers are in every instance the culprit is in), the estimate stays, and
its basis says why.

Several culprits hold one another up: a step waits for the latest of them, so fixing one saves
only down to the next. ``together`` replays them all fixed at once: what fixing every cause the
report names would save.

The sentences say the saving last (``said``), once every saving is known.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from perftracker.localizer.diagnose.method.arrays import PatternArrays
from perftracker.localizer.diagnose.verdict.group_findings import MOVING_KEY, STAGE_KEY
from perftracker.localizer.diagnose.verdict.replay import (
    CONSISTENT,
    Replay,
    pipeline_compute_us,
    replay_saving,
    replay_scaled,
)
from perftracker.localizer.diagnose.words.explain import pct

from perftracker.model import Category, Finding, JointSaving
from perftracker.model.hardware import IB_WAIT_KEY
from perftracker.model.schema import rounded

ESTIMATE = "an estimate"
REPLAYED = "replayed over"
SAY_SAVES = 0.01  # the sentence says what fixing a cause would save from this share of the step
_LINK = ("the culprit's peers are in every collective instance it is in: the replay cannot tell its link "
         "from theirs")


def replayed_savings(arr: PatternArrays, findings: Sequence[Finding]) -> list[Finding]:
    """The findings with their savings replayed where the records allow (the sentences unchanged)."""
    return [_with_basis(arr, f) for f in findings]


def _replayable(arr: PatternArrays, f: Finding) -> bool:
    return not (f.kind == "common" or f.key in (STAGE_KEY, MOVING_KEY) or not arr.step_records or not f.ranks)


def _columns(arr: PatternArrays, ranks: Sequence[int]) -> list[int]:
    column = {int(r): w for w, r in enumerate(arr.ranks.tolist())}
    return [column[r] for r in ranks if r in column]


def _replay(arr: PatternArrays, cols: list[int], host: list[int], links: dict[int, float]) -> Replay | None:
    """The replay of these culprit columns; None where one of them sent no step record."""
    off = window_apart(arr, cols)
    if off > CONSISTENT:
        return Replay(0.0, 0, f"the culprit's window runs {off:.0%} apart from the others' (its work "
                              f"does not line up with its collectives)")
    return replay_saving(arr.step_records, cols, arr.stage, host=host, link_scale=links)


def stage_scale(arr: PatternArrays, ranks: Sequence[int]) -> dict[int, float] | str:
    """Per column of a heavy stage (``ranks``): the share of its pipeline compute (``pipeline_compute_us``)
    that the other stages' level is (the median over the other stages of their median worker), or
    why there is none."""
    if arr.stage is None or not any(r is not None for r in arr.step_records):
        return "the workers sent no step records"
    cols = _columns(arr, ranks)
    if len(cols) != len(ranks):
        return "a rank of the stage sent no patterns"
    mine = {c: pipeline_compute_us(r) if (r := arr.step_records[c]) is not None else None for c in cols}
    heavy = {int(arr.stage[c]) for c in cols}
    per_stage: dict[int, list[float]] = {}
    for w, r in enumerate(arr.step_records):
        s = int(arr.stage[w])
        if r is not None and s >= 0 and s not in heavy and (v := pipeline_compute_us(r)) is not None:
            per_stage.setdefault(s, []).append(v)
    if any(v is None or v <= 0 for v in mine.values()) or not per_stage:
        return "the step records hold no pipeline transfers of every stage"
    level = float(np.median([np.median(v) for v in per_stage.values()]))
    out = {c: min(1.0, level / v) for c, v in mine.items() if v is not None}
    if all(x >= 1.0 for x in out.values()):
        return "the stage computes no more between its transfers than the others"
    return out


def _stage_basis(arr: PatternArrays, f: Finding) -> Finding:
    """A heavy stage's finding: its excess replayed away (``replay_scaled``), else its estimate
    with the reason the replay could not say."""
    scale = stage_scale(arr, f.ranks)
    r = replay_scaled(arr.step_records, scale) if not isinstance(scale, str) else None
    why = scale if isinstance(scale, str) else ("a rank of the stage sent no step record" if r is None
                                                 else r.inconclusive)
    if why:
        basis = f"{ESTIMATE}; the replay was inconclusive: {why}" if f.saves_share > 0 else ""
        return dataclasses.replace(f, saves_basis=basis)
    assert r is not None
    saves = rounded(r.saves)
    return dataclasses.replace(f, saves_share=saves, saves_s=rounded(saves * float(arr.window_s)),
                               saves_basis=f"{replayed_over(r.steps)}, the stage at the other stages' compute")


def _with_basis(arr: PatternArrays, f: Finding) -> Finding:
    basis = ESTIMATE if f.saves_share > 0 else ""
    if f.key == STAGE_KEY:
        return _stage_basis(arr, f)
    if not _replayable(arr, f):
        return dataclasses.replace(f, saves_basis=basis)
    cols = _columns(arr, f.ranks)
    links = {c: s for c in cols if (s := link_scale(arr, f, c)) is not None}
    r = _replay(arr, cols, cols if f.category is Category.PYTHON else [], links) \
        if len(cols) == len(f.ranks) else None
    if r is None:
        return dataclasses.replace(f, saves_basis=basis)
    if not r.inconclusive and f.category is Category.COLLECTIVE and not r.links and len(links) < len(cols):
        r = Replay(0.0, 0, _LINK)
    if r.inconclusive:
        return dataclasses.replace(f, saves_basis=f"{ESTIMATE}; the replay was inconclusive: {r.inconclusive}"
                                   if f.saves_share > 0 else "")
    saves = rounded(r.saves)
    how = replayed_over(r.steps)
    if links:
        how += ", the link at its peers' port stall"
    return dataclasses.replace(f, saves_share=saves, saves_s=rounded(saves * float(arr.window_s)), saves_basis=how)


def replayed_over(steps: int) -> str:
    return f"{REPLAYED} {steps} step{'s' if steps != 1 else ''}"


def link_scale(arr: PatternArrays, f: Finding, col: int) -> float | None:
    """For a slow-InfiniBand-port finding: the share of the culprit's transfer time a port stalled
    like its peers' would take, ``(1 - stall) / (1 - peers' stall)``. The stall share is the port's
    ``port_xmit_wait`` over its active time while the rank's collectives run (``IB_WAIT_KEY``'s μ:
    the time it had data and could not send); a port that sends the same bytes stalled only as
    often as its peers' is active that much less. None for any other finding, or without the
    pattern's μ on the culprit and on a peer."""
    if f.key != IB_WAIT_KEY:
        return None
    keys = [i.key for i in arr.functions]
    if IB_WAIT_KEY not in keys:
        return None
    row = arr.values[keys.index(IB_WAIT_KEY)]
    culprits = set(_columns(arr, f.ranks))
    peers = np.array([row[1, w] for w in range(row.shape[1]) if w not in culprits and row[0, w] > 0])
    mine = float(row[1, col])
    if not peers.size or not np.isfinite(mine) or row[0, col] <= 0:
        return None
    theirs = float(np.median(peers))
    if theirs >= 1.0 or mine <= theirs:
        return None
    return max(0.0, min(1.0, (1.0 - mine) / (1.0 - theirs)))


def together(arr: PatternArrays, findings: Sequence[Finding]) -> JointSaving | None:
    """What fixing every replayed finding's cause at once would save, where there are several (their
    ranks replayed together: each like its like peers, in what its finding is about); None where
    fewer than two findings were replayed, or the joint replay cannot say."""
    done = [f for f in findings if _replayable(arr, f) and f.saves_basis.startswith(REPLAYED)]
    if len(done) < 2:
        return None
    cols: list[int] = []
    host: list[int] = []
    links: dict[int, float] = {}
    for f in done:
        mine = _columns(arr, f.ranks)
        cols += [c for c in mine if c not in cols]
        host += mine if f.category is Category.PYTHON else []
        links.update({c: s for c in mine if (s := link_scale(arr, f, c)) is not None})
    r = _replay(arr, sorted(cols), host, links)
    if r is None or r.inconclusive:
        return None
    saves = rounded(r.saves)
    return JointSaving(tuple(sorted({r_ for f in done for r_ in f.ranks})), saves,
                       rounded(saves * float(arr.window_s)), replayed_over(r.steps))


def window_apart(arr: PatternArrays, cols: Sequence[int]) -> float:
    """How far the culprit columns' windows lie from the job's median window (relative, the largest):
    the ranks of one synchronous job record the same steps in about the same time, and a culprit whose
    trace runs on past the others' (its GPU work drifting away from its own collectives) has a
    record that does not hold what it did."""
    w = arr.worker_window_s
    if w is None or not len(cols) or w.size < 2:
        return 0.0
    med = float(np.median(w))
    return float(np.max(np.abs(w[list(cols)] - med))) / med if med > 0 else 0.0


def said(arr: PatternArrays, findings: Sequence[Finding]) -> list[Finding]:
    """Each sentence with what fixing its cause would save, last ("; fixing it would save about X%
    of the window": every share in a report is of the window, issue 47), from ``SAY_SAVES`` of the step: a replayed saving always; an estimate where the
    job's process groups were read (a stage or moving-work cause, which are measured per step,
    always), since elsewhere it is too rough to print."""
    out = []
    for f in findings:
        say = f.saves_share >= SAY_SAVES and (f.saves_basis.startswith(REPLAYED) or arr.job_groups.read
                                              or f.key in (STAGE_KEY, MOVING_KEY))
        out.append(dataclasses.replace(f, sentence=f"{f.sentence}; fixing it would save about "
                                                   f"{pct(f.saves_share)} of the window") if say else f)
    return out
