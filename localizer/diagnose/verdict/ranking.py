"""Where a finding's rank is decided: one module, its rules side by side (issue 47, issue 48 item 4).

**[decision] The order.** Findings are listed by

1. *tier*: 0 for a material cause on some ranks, measured against the job's own other ranks (the
   differential test, the wait evidence, or peers that wait for it), and for a set of ranks'
   cause (a heavy pipeline stage, a moving straggler); 1 for the rest. A finding judged only
   against a configured expected range, job-wide or not, says how the job runs, not why some
   ranks hold the others back;
2. *cost*, largest first: the finding's impact (its own excess on the critical path plus the
   waits it induces, a share of the window), and never less than what fixing it saves
   (``cost``: a saving found from the step records may exceed the impact's estimate; then the
   cost is the saving, and the report says so);
3. the function key and the first rank, so that equal costs keep one order from run to run.

``rank`` applies it to built findings, after their savings are known; every renderer lists
findings in the order it returns (terminal, JSON and HTML alike: renderers never reorder).

**[decision] Who leads, and the words for the order.** The first finding leads the headline.
Where a finding that costs more comes after a cheaper one (a job-wide cause below a rank-specific
one), ``order_note`` says why on that finding, and ``more_tail`` says so in the headline's
"(+N more …)" tail, naming the costliest finding by its number and cost:
"(+2 more; #2 costs 44%)" (of the window, as every share in a report).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from perftracker.localizer.diagnose.verdict.group_findings import MOVING_KEY, STAGE_KEY
from perftracker.localizer.diagnose.words.explain import pct

from perftracker.model import Finding
from perftracker.model.kinds import Test

PEER_TESTS = frozenset({Test.DIFFERENTIAL, Test.WAITS})  # tests that measure ranks against the job's own ranks
GROUP_KEYS = frozenset({STAGE_KEY, MOVING_KEY})  # a set of ranks' causes: always tier 0


def tier(kind: str, tests: Sequence[str], has_waits: bool, impact: float, material: float,
         key: str = "") -> int:
    """0 for a material cause on some ranks measured against the job's own ranks, 1 for the rest."""
    if key in GROUP_KEYS:
        return 0
    peers = bool(PEER_TESTS.intersection(tests)) or has_waits
    return 0 if kind != "common" and peers and impact >= material else 1


def finding_tier(f: Finding, material: float) -> int:
    """``tier`` of a built finding."""
    return tier(f.kind, f.tests, bool(f.waits), f.impact, material, f.key)


def cost(f: Finding) -> float:
    """What a finding costs the step, as a share of the window: its impact, and at least what
    fixing it saves."""
    return max(f.impact, f.saves_share)


def at_least_saving(f: Finding) -> Finding:
    """``f`` with its impact raised to its saving where the saving is larger (the step records saw
    more than the estimate of its excess and waits): a saving never exceeds the cost."""
    if f.saves_share <= f.impact:
        return f
    return dataclasses.replace(f, impact=f.saves_share, impact_s=max(f.impact_s, f.saves_s))


def order_key(f: Finding, material: float) -> tuple[int, float, str, int]:
    return (finding_tier(f, material), -cost(f), f.key, f.ranks[0] if f.ranks else -1)


def rank(findings: Sequence[Finding], material: float) -> list[Finding]:
    """The findings in report order (impacts raised to their savings first, ``at_least_saving``)."""
    return sorted((at_least_saving(f) for f in findings), key=lambda f: order_key(f, material))


def costliest(findings: Sequence[Finding]) -> int:
    """The index of the costliest finding (the first of equals); -1 for none."""
    if not findings:
        return -1
    return max(range(len(findings)), key=lambda i: (cost(findings[i]), -i))


def order_note(f: Finding, before: Sequence[Finding]) -> str:
    """Why a finding that costs more than one listed above it comes after it ("" when none does)."""
    cheaper = [g for g in before if cost(g) < cost(f)]
    if not cheaper:
        return ""
    why = ("it holds on most ranks (how the whole job runs), and the causes specific to some ranks come first"
           if f.kind == "common" else "the causes that others wait for at a material cost come first")
    return f"order: listed below a finding that costs less because {why}"


def more_tail(findings: Sequence[Finding]) -> str:
    """The headline's tail: "" for one finding, " (+N more)", or " (+N more; #k costs X)" where the headline's finding is not the costliest."""
    if len(findings) < 2:
        return ""
    top = costliest(findings)
    if top <= 0 or cost(findings[top]) <= cost(findings[0]):
        return f" (+{len(findings) - 1} more)"
    return f" (+{len(findings) - 1} more; #{top + 1} costs {pct(cost(findings[top]))})"
