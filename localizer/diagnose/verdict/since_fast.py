"""A report's "since it was fast": the baseline comparison's changes as findings (issue 49).

``with_since_fast`` takes a localized report, the session's arrays and the job's baseline (or
None) and returns the report with its ``since_fast`` line and, for each job-wide change
(perftracker.localizer.diagnose.evidence.baseline) no other finding names, a finding of its own
(tests ``("baseline",)``, cause ``since_baseline``). Such a finding holds on most ranks, so it is
placed like any job-wide finding: after the findings specific to some ranks, among the job-wide
ones by what it costs. A change that an existing finding already names adds an evidence line to it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from perftracker.localizer.diagnose.evidence.baseline import BaselineRule, compare, median_step_ms
from perftracker.localizer.diagnose.method.arrays import PatternArrays
from perftracker.localizer.diagnose.words.headline import fit, report_headline

from perftracker.model import Box, Finding, Report, compress_ranks
from perftracker.model.shares import pct
from perftracker.model.since_fast import Change, SinceFast

CAUSE = "since_baseline"
TEST = "baseline"
NO_BASELINE = ("no baseline for this job yet: it is taken from one short window once the job runs at a "
               "steady speed (docs/baseline.md)")


@dataclass(frozen=True, eq=False)
class JobBaseline:
    """The job's healthy baseline: its window's patterns as arrays, the session and when it was taken."""

    session: str
    taken_ns: int
    arrays: PatternArrays


def age_words(seconds: float) -> str:
    """40 -> "40 s", 720 -> "12 min", 5040 -> "1.4 h", 200000 -> "2.3 days"."""
    s = max(0.0, seconds)
    if s < 120:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{s / 60:.0f} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def who(c: Change) -> str:
    n = len(c.ranks)
    if n == c.compared:
        return "every rank spends" if n > 1 else "the rank spends"
    return f"{n} of {c.compared} ranks spend"


def step_words(then_ms: float, now_ms: float) -> str:
    if then_ms <= 0 or now_ms <= 0:
        return ""
    return f"step {then_ms:.1f} ms then, {now_ms:.1f} ms now"


def saving(c: Change, then_ms: float, now_ms: float) -> float:
    """What bringing the function back to its baseline time per step would save, as a share of the
    step now: β_now - β_then x step_then / step_now (Δβ where a step time is unknown)."""
    scale = then_ms / now_ms if then_ms > 0 and now_ms > 0 else 1.0
    return max(0.0, c.now.beta - c.then.beta * scale)


def change_finding(c: Change, arr: PatternArrays, base: JobBaseline, age: str, then_ms: float,
                   now_ms: float) -> Finding:
    """The finding of one job-wide change."""
    since = "where the baseline did not run it" if c.new else f"against {pct(c.then.beta)} at the baseline"
    title = f"{who(c)} {pct(c.now.beta)} in {c.label}, {since}, {age} ago"
    steps = step_words(then_ms, now_ms)
    sentence = f"{title}{f' ({steps})' if steps else ''}"
    f_idx = next(i for i, f in enumerate(arr.functions) if f.key == c.key)
    median = np.median(arr.values[f_idx], axis=1)
    grown = c.now.beta - c.then.beta
    save = saving(c, then_ms, now_ms)
    evidence = (
        f"at the baseline (session {base.session}, {age} ago): β {pct(c.then.beta)}, μ {c.then.mu:.2f}, "
        f"σ {c.then.sigma:.2f}",
        f"now: β {pct(c.now.beta)}, μ {c.now.mu:.2f}, σ {c.now.sigma:.2f}, on ranks {compress_ranks(c.ranks)} "
        f"of the {c.compared} compared",
        *((f"{steps}",) if steps else ()),
        "the ranks alike: the comparison of ranks with each other cannot see it; the baseline does",
    )
    return Finding(
        key=c.key, label=c.label, category=c.category, ranks=c.ranks, kind="common", tests=(TEST,),
        observed=c.now, median=type(c.now)(*(float(x) for x in median)), expected=Box(c.then, c.then),
        sentence=sentence, points=tuple((int(r), float(arr.values[f_idx, 0, w]), float(arr.values[f_idx, 1, w]))
                                        for w, r in enumerate(arr.ranks.tolist()[:256])),
        impact=grown, impact_s=grown * float(arr.window_s), saves_share=save,
        saves_s=save * float(arr.window_s), saves_basis="an estimate: back to its share at the baseline",
        title=fit(title), evidence=evidence, cause=CAUSE,
        next_steps=(f"look for what changed in {c.label} since the baseline: a dependency upgrade, a data "
                    "pipeline or configuration change on restart",
                    "once the change is intended: perftracker baseline JOB --retake (the next steady "
                    "window becomes the baseline)"),
    )


def placed(findings: Sequence[Finding], new: Finding) -> list[Finding]:
    """``findings`` with ``new`` (job-wide) after every finding specific to some ranks and before the
    first job-wide one that costs less."""
    out = list(findings)
    for i, f in enumerate(out):
        if f.kind == "common" and f.impact < new.impact:
            out.insert(i, new)
            return out
    out.append(new)
    return out


def note_of(changes: Sequence[Change], base: JobBaseline, age: str, then_ms: float, now_ms: float) -> str:
    steps = step_words(then_ms, now_ms)
    when = f"the baseline (session {base.session}, {age} ago{'; ' + steps if steps else ''})"
    if not changes:
        return f"no function's share grew since {when}"
    c = changes[0]
    since = "new since" if c.new else f"against {pct(c.then.beta)} at"
    more = f" (+{len(changes) - 1} more)" if len(changes) > 1 else ""
    return f"{who(c)} {pct(c.now.beta)} in {c.label}, {since} {when}{more}"


MIN_STEP_CHANGE = 0.05  # a step time this much faster or slower than the previous report's is a new speed


def fix_paid(prev: Report, step_ms_now: float, now_ns: int) -> str:
    """Did the fix pay: the previous report's predicted saving (its first finding that predicts one)
    beside the step time measured now, when the job runs at a new speed ("" otherwise). Both step
    times are the windows' own (PatternSet.iteration_ms), so a window's overhead is on both sides."""
    step_then = median_step_ms(prev.iteration_ms)
    predicted = next((f for f in prev.findings if f.saves_share > 0), None)
    if predicted is None or step_then <= 0 or step_ms_now <= 0:
        return ""
    change = 1.0 - step_ms_now / step_then
    if abs(change) < MIN_STEP_CHANGE:
        return ""
    age = age_words((now_ns - prev.created_ns) / 1e9)
    measured = f"{pct(change)} less" if change > 0 else f"{pct(-change)} more"
    return (f"the previous report (session {prev.session}, {age} ago) predicted that fixing "
            f"{predicted.label or predicted.key} would save {pct(predicted.saves_share)} of the step "
            f"({predicted.saves_basis or 'an estimate'}); the step went from {step_then:.1f} ms to "
            f"{step_ms_now:.1f} ms, {measured}")


def with_since_fast(report: Report, arr: PatternArrays, base: JobBaseline | None, now_ns: int,
                    rule: BaselineRule | None = None, previous: Report | None = None) -> Report:
    """``report`` with its "since it was fast" line and the findings of its job-wide changes."""
    paid = fix_paid(previous, median_step_ms(arr.iteration_ms), now_ns) if previous is not None else ""
    if base is None:
        return dataclasses.replace(report, since_fast=SinceFast(note=NO_BASELINE, paid=paid))
    changes = compare(base.arrays, arr, rule)
    then_ms = median_step_ms(base.arrays.iteration_ms)
    now_ms = median_step_ms(arr.iteration_ms)
    age = age_words((now_ns - base.taken_ns) / 1e9)
    findings = list(report.findings)
    for c in changes:
        same = [i for i, f in enumerate(findings) if f.key == c.key or c.key in {k for k, _ in f.parts}]
        if same:
            i = same[0]
            said = (f"since it was fast: {pct(c.then.beta)} at the baseline ({age} ago), {pct(c.now.beta)} now, "
                    f"on ranks {compress_ranks(c.ranks)}")
            findings[i] = dataclasses.replace(findings[i], evidence=findings[i].evidence + (said,))
        else:
            findings = placed(findings, change_finding(c, arr, base, age, then_ms, now_ms))
    line = SinceFast(note=note_of(changes, base, age, then_ms, now_ms), baseline_session=base.session,
                     taken_ns=base.taken_ns, step_ms_then=then_ms, step_ms_now=now_ms, changes=tuple(changes),
                     paid=paid)
    if len(findings) == len(report.findings):
        return dataclasses.replace(report, findings=tuple(findings), since_fast=line)
    summary = report.summary if report.findings else findings[0].sentence
    headline = report_headline(findings, arr.n_workers, report.headline)
    return dataclasses.replace(report, findings=tuple(findings), since_fast=line, headline=headline, summary=summary)


__all__ = ["CAUSE", "JobBaseline", "NO_BASELINE", "age_words", "change_finding", "fix_paid", "placed",
           "with_since_fast"]
