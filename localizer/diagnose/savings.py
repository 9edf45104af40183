"""What fixing each finding's cause would save: the replay where the workers sent step records
(``replay.py``), else the finding's stated estimate (``findings._saves``, ``group_findings``), and
which of the two each finding carries (``Finding.saves_basis``). Pure.

A finding on some ranks (not a common one, not a whole stage or the moving work: those keep their
estimates) is replayed with those ranks behaving like their median like peer in what the finding
is about: their host's own time too for a host-side (Python) cause, only their GPU-side gaps and
transfers for a cause on the GPU or a link. Where the replay
cannot say (the instances do not line up, no like peer, a culprit whose window runs apart from the
others', or a link finding whose peers are in every instance the culprit is in), the estimate stays,
and its basis says why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from perftracker.localizer.diagnose.arrays import PatternArrays
from perftracker.localizer.diagnose.explain import pct
from perftracker.localizer.diagnose.group_findings import MOVING_KEY, STAGE_KEY
from perftracker.localizer.diagnose.replay import CONSISTENT, Replay, replay_saving

from perftracker.model import Category, Finding
from perftracker.model.schema import rounded

ESTIMATE = "an estimate"
SAY_SAVES = 0.01  # the sentence says what fixing a cause would save from this share of the step
_LINK = ("the culprit's peers are in every collective instance it is in: the replay cannot tell its link "
         "from theirs")


def replayed_savings(arr: PatternArrays, findings: Sequence[Finding], summary: str) -> tuple[list[Finding], str]:
    """(the findings with their savings replayed where the records allow, the summary with the
    first finding's sentence as it now reads)."""
    out = [_with_basis(arr, f) for f in findings]
    if findings and out[0].sentence != findings[0].sentence and findings[0].sentence in summary:
        summary = summary.replace(findings[0].sentence, out[0].sentence, 1)
    return out, summary


def _with_basis(arr: PatternArrays, f: Finding) -> Finding:
    basis = ESTIMATE if f.saves_share > 0 else ""
    if f.kind == "common" or f.key in (STAGE_KEY, MOVING_KEY) or not arr.step_records or not f.ranks:
        return dataclasses.replace(f, saves_basis=basis)
    column = {int(r): w for w, r in enumerate(arr.ranks.tolist())}
    cols = [column[r] for r in f.ranks if r in column]
    off = window_apart(arr, cols)
    if off > CONSISTENT:
        r: Replay | None = Replay(0.0, 0, f"the culprit's window runs {off:.0%} apart from the others' (its work "
                                        f"does not line up with its collectives)")
    else:
        r = replay_saving(arr.step_records, cols, arr.stage, host=f.category is Category.PYTHON) \
            if len(cols) == len(f.ranks) else None
    if r is not None and not r.inconclusive and f.category is Category.COLLECTIVE and not r.links:
        r = Replay(0.0, 0, _LINK)
    if r is None:
        return dataclasses.replace(f, saves_basis=basis)
    if r.inconclusive:
        return dataclasses.replace(f, saves_basis=f"{ESTIMATE}; the replay was inconclusive: {r.inconclusive}"
                                   if f.saves_share > 0 else "")
    window_s = float(arr.window_s)
    saves = rounded(r.saves)
    return dataclasses.replace(
        f, sentence=_say(f.sentence, f.saves_share, saves), saves_share=saves, saves_s=rounded(saves * window_s),
        saves_basis=f"replayed over {r.steps} step{'s' if r.steps != 1 else ''}" if saves > 0 else "")


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


def _say(sentence: str, old: float, new: float) -> str:
    """The sentence with its "fixing it would save" clause for ``new`` (none below ``SAY_SAVES``)."""
    clause = f"; fixing it would save about {pct(old)} of the step"
    if old >= SAY_SAVES and sentence.endswith(clause):
        sentence = sentence[: -len(clause)]
    return sentence + (f"; fixing it would save about {pct(new)} of the step" if new >= SAY_SAVES else "")

