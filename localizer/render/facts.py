"""Small facts every renderer shows the same way: derived from a Report, no analysis, no I/O."""

from __future__ import annotations

import statistics

from perftracker.model import Finding, Report, compress_ranks
from perftracker.model.shares import pct

_MAX_RANKS_SHOWN = 16


def trigger_text(report: Report) -> str:
    """"slowdown at iteration 268 (+49% over 42.9 ms), detected on rank 2": the typed detection that
    opened the session (perftracker/model/trigger.py), where the rank reads as the one that noticed,
    not as the culprit; a trigger without one (manual, a hang, a crash, a report stored before
    issue 48) is shown as its reason."""
    if report.trigger is not None:
        return report.trigger.text()
    return report.trigger_reason or "-"


def baseline_ms(report: Report) -> float | None:
    """The iteration time before the slowdown, from the report's detection; None without one."""
    return report.trigger.baseline_ms if report.trigger is not None else None


_LEVEL_TEXT = {
    "window": "profile window (Kineto, samplers)",
    "first look": "first look (the hooks' phase times; no window was run)",
    "snapshot": "stack snapshot",
    "exit": "the worker's exit",
    "traces": "offline traces",
}


def level_text(report: Report) -> str:
    """Which level of diagnosis the report came from, in words."""
    return _LEVEL_TEXT.get(report.diagnosis_level, report.diagnosis_level)


def cost_text(report: Report) -> str:
    """"ran 7.3 s, blocked training 0.4 s; budget 72.0 s over the last hour: 12.4 s spent before it,
    59.6 s left":
    what the window cost and the budget left, from the fields the workers sent ("" if none)."""
    c = report.window_cost
    if not c:
        return ""
    parts = []
    if "window_s" in c:
        parts.append(f"ran {c['window_s']:.1f} s")
    if "blocked_s" in c:
        parts.append(f"blocked training {c['blocked_s']:.2f} s")
    text = ", ".join(parts)
    if "cost_s" in c:
        text += f"{'; ' if text else ''}cost {c['cost_s']:.1f} s of training"
        if c.get("cost_partial"):
            text += " (to the exit: partial)"
    if "budget_s" in c:
        budget = f"budget {c['budget_s']:.1f} s over the last hour"
        if "spent_s" in c:
            budget += f": {c['spent_s']:.1f} s spent in the hour before it"
        if "left_s" in c:
            budget += f", {c['left_s']:.1f} s left"
        if "last_cost_s" in c:
            budget += f" (last window {c['last_cost_s']:.1f} s)"
        text = f"{text}; {budget}" if text else budget
    return text


def together_text(report: Report) -> str:
    """"ranks 1,6 together: about 23% of the window (replayed over 3 steps)": what fixing every
    replayed cause at once would save, where the report has several ("" otherwise)."""
    t = report.saves_together
    if t is None:
        return ""
    return (f"{'rank' if len(t.ranks) == 1 else 'ranks'} {compress_ranks(t.ranks)} together: about "
            f"{pct(t.saves_share)} of the window ({t.basis})")


def brief_lines(report: Report) -> list[str]:
    """``perftracker report --brief``: the headline, then each finding's title and its cost."""
    lines = [report.top_line or "(no headline)"]
    for i, f in enumerate(report.findings, 1):
        cost = f" [{pct(f.impact)}]" if f.impact > 0 else ""
        lines.append(f"  {i}. {f.headline}{cost}")
    return lines


def has_samples(report: Report) -> bool:
    """Whether the window had utilization samples: an offline trace has none, so μ and σ are all 0
    and a renderer leaves them out rather than show zeros as if they were measured."""
    return report.samples_measured


def impact_text(f: Finding) -> str:
    """"12% of the window (0.6 s)": the finding's estimated cost to the step."""
    seconds = f"{f.impact_s:.3g} s" if f.impact_s >= 1 else f"{f.impact_s * 1000:.3g} ms"
    return f"{pct(f.impact)} of the window ({seconds})"


def session_text(report: Report) -> str:
    """"s-12 (slowdown, complete)"; an offline report's session is its kind: "offline (complete)"."""
    if report.session == report.kind:
        return f"{report.session} ({report.status})"
    return f"{report.session} ({report.kind}, {report.status})"


_SAME_STEP = 0.01  # step medians this close (a fraction of the longest) read as one step time


def step_times_text(report: Report) -> str:
    """"0: 14.5 ms, 1: 19.9 ms, …": each rank's median step time, for reports whose ranks' windows
    are their own steps (offline traces); "" otherwise or when no rank has one."""
    if report.kind != "offline" or not report.iteration_ms:
        return ""
    ranks = sorted(r for r, v in report.iteration_ms.items() if v)
    if not ranks:
        return ""
    medians = {r: statistics.median(report.iteration_ms[r]) for r in ranks}
    lo, hi = min(medians.values()), max(medians.values())
    if len(ranks) > 1 and hi - lo <= _SAME_STEP * hi:  # a synchronous job: everyone's step is the slowest's
        return f"{statistics.median(medians.values()):.1f} ms on every rank (ranks that finish early wait for the others)"
    shown = ranks[:_MAX_RANKS_SHOWN]
    text = ", ".join(f"{r}: {medians[r]:.1f} ms" for r in shown)
    if len(ranks) > len(shown):
        text += f", … ({compress_ranks(ranks)})"
    return text
