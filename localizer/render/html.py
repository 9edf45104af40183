"""HTML renderer: one self-contained file (inline CSS and SVG, no scripts, no external assets).

It shows the headline, a picture of one step (``Report.step_lanes``: a swimlane per chosen rank,
host / compute / waiting / communication time), one card per finding (its title, evidence, what to
check next, and a scatter of every rank's (β, μ) from ``Finding.points`` where the other ranks show
anything), the iteration-time series from ``Report.iteration_ms`` (outliers clipped, the trigger and
the pre-slowdown baseline marked), the rank-by-state table of a hang and the top critical-path
functions. Computes nothing beyond layout (axis scales, grouping rows for display).

Every string from the report goes through ``escape`` below: the HTML escape, after ``safe_text``
shows control characters and the bidi overrides (U+202A-U+202E, U+2066-U+2069) as visible escapes,
so a name cannot reorder what the page shows.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from html import escape as _html_escape
from typing import TextIO

from perftracker.localizer.render.facts import (
    baseline_ms,
    cost_text,
    has_samples,
    impact_text,
    level_text,
    session_text,
    step_times_text,
    together_text,
    trigger_text,
)
from perftracker.localizer.render.names import mu_names, short_frame

from perftracker.model import Finding, RankState, Report, compress_ranks
from perftracker.model.names import safe_text

ABNORMAL = "#d62728"
NORMAL = "#55779d"  # also a label colour on white: WCAG AA (4.5:1), tests/unit/test_ranking.py
MAX_SERIES = 64  # iteration-time lines drawn; the rest are named in a note
MAX_POINT_LABELS = 12

_CSS = """
:root { --fg:#1d2330; --muted:#5f6b7a; --line:#d9dee5; --bad:#d62728; --bg:#f6f7f9; }
* { box-sizing: border-box; }
body { font: 15px/1.45 -apple-system, "Segoe UI", Roboto, "DejaVu Sans", Arial, sans-serif;
       color: var(--fg); background: var(--bg); margin: 0 auto; padding: 24px 32px; max-width: 1120px; }
h1 { font-size: 22px; margin: 0 0 12px; }
h2 { font-size: 18px; margin: 0 0 8px; }
section, header { background: #fff; border: 1px solid var(--line); border-radius: 8px;
                  padding: 16px 20px; margin: 0 0 18px; }
.brand { color: var(--muted); font-size: 13px; letter-spacing: .04em; text-transform: uppercase; }
.meta { display: grid; grid-template-columns: max-content 1fr; gap: 2px 18px; font-size: 14px; }
.meta dt { color: var(--muted); } .meta dd { margin: 0; }
.bad { color: var(--bad); font-weight: 600; }
.finding { border-left: 5px solid var(--bad); }
.sentence { font-size: 19px; font-weight: 650; margin: 0 0 10px; }
.evidence { margin: 6px 0 10px; padding-left: 20px; font-size: 14px; color: #333; }
.evidence li, .steps li { margin: 1px 0; }
.steps { margin: 4px 0 10px; padding-left: 20px; font-size: 14px; }
h3 { font-size: 14px; margin: 10px 0 2px; color: var(--muted); text-transform: uppercase; letter-spacing: .04em; }
details { font-size: 13px; color: var(--muted); margin: 6px 0; }
.chips span { display: inline-block; background: #eef1f5; border-radius: 12px; padding: 1px 10px;
              margin: 0 6px 6px 0; font-size: 13px; }
.chips span.r { background: #fde8e8; color: #b71c1c; font-weight: 600; }
.row { display: flex; flex-wrap: wrap; gap: 24px; align-items: flex-start; }
table { border-collapse: collapse; font-size: 14px; }
th, td { padding: 4px 10px; border-bottom: 1px solid var(--line); text-align: left; }
th, td.n, td.nw { white-space: nowrap; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
.key { font-family: "DejaVu Sans Mono", Menlo, monospace; font-size: 12px; color: var(--muted);
       word-break: break-all; margin: 0 0 8px; }
.state-culprit { color: var(--bad); font-weight: 700; } .state-silent { color: #9c27b0; font-weight: 700; }
.state-waiting { color: #955700; } .note { color: var(--muted); font-size: 13px; }
svg text { font: 12px "DejaVu Sans", Arial, sans-serif; fill: #333; }
"""


def escape(text: str) -> str:
    """``text`` for HTML: bidi overrides and control characters shown (``safe_text``), then escaped."""
    return _html_escape(safe_text(text, newlines=True))


def render(report: Report, file: TextIO) -> None:
    """Write ``report`` to ``file`` as one self-contained HTML document."""
    title = f"perftracker report: {report.job} {report.session}"
    out: list[str] = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>",
        _header(report),
    ]
    if report.hang_states:
        out.append(_hang_section(report.hang_states))
    samples = has_samples(report)
    if report.step_lanes:
        out.append(_step_section(report))
    for i, f in enumerate(report.findings, 1):
        out.append(_finding_section(f, len(report.ranks_reported), samples, i))
    if not report.findings and report.kind not in ("hang", "crash"):
        out.append('<section><h2>No abnormal functions</h2>')
        out.append(_top_table(report, samples) if report.top_functions else "")
        out.append("</section>")
    if report.iteration_ms:
        out.append(_iteration_section(report))
    out.append('<p class="note">Generated by perftracker. This file has no scripts and loads nothing.</p>')
    out.append("</body></html>\n")
    file.write("\n".join(out))


# ------------------------------------------------------------------------------------------------
# sections
# ------------------------------------------------------------------------------------------------


def _ranks(ranks: Iterable[int]) -> str:
    rs = list(ranks)
    return f"{compress_ranks(rs)} ({len(rs)})" if rs else "none"


def _header(report: Report) -> str:
    created = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(report.created_ns / 1e9))
    rows = [
        ("job", escape(report.job)),
        ("session", escape(session_text(report))),
        ("created", created),
    ]
    if report.window_s > 0:
        rows.append(("window", _window(report.window_s) + (f", profile {escape(report.profile)}" if report.profile else "")))
    rows.append(("level", escape(level_text(report))))
    cost = cost_text(report)
    if cost:
        rows.append(("window cost", escape(cost)))
    together = together_text(report)
    if together:
        rows.append(("fixing all", escape(together)))
    rows.append(("trigger", escape(trigger_text(report))))
    rows.append(("ranks reported", escape(_ranks(report.ranks_reported))))
    missing = escape(_ranks(report.ranks_missing))
    rows.append(("ranks missing", f'<span class="bad">{missing}</span>' if report.ranks_missing else missing))
    steps = step_times_text(report)
    if steps:
        rows.append(("step time", escape(steps)))
    if report.since_fast is not None:  # the job's healthy baseline (issue 49)
        rows.append(("since it was fast", escape(report.since_fast.note)))
        if report.since_fast.paid:
            rows.append(("did the fix pay", escape(report.since_fast.paid)))
    meta = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
    summary = f"<h1>{escape(report.top_line)}</h1>" if report.top_line else ""
    return f'<header><div class="brand">perftracker report</div>{summary}<dl class="meta">{meta}</dl></header>'


def _window(window_s: float) -> str:
    return f"{window_s:.3g} s" if window_s >= 1 else f"{window_s * 1000:.3g} ms"


def _finding_section(f: Finding, n_ranks: int = 0, samples: bool = True, number: int = 0) -> str:
    chips = [
        f"<span>{escape(f.category.value)}</span>",
        f"<span>{escape(short_frame(f.label or f.key))}</span>",
        f"<span>test: {escape(', '.join(f.tests))}</span>",
        f"<span>{escape(f.kind)}</span>",
        f'<span class="r" title="{escape(compress_ranks(f.ranks))}">{escape(_short_ranks(f.ranks, count=True))}</span>',
    ]
    if f.impact > 0:
        chips.append(f"<span>impact {escape(impact_text(f))}</span>")
    stack = " \u203a ".join(short_frame(fr) for fr in f.key.split(";"))
    key = f'<p class="key" title="{escape(f.key)}">{escape(stack)}</p>' if ";" in f.key else ""
    if number == 1 and f.title:  # the headline, already the page's heading: said once
        head = '<p class="note">Finding 1: the headline above.</p>'
    else:
        head = f'<p class="sentence">{escape((f"{number}. " if number else "") + f.headline)}</p>'
    details = ""
    if f.evidence:
        details += '<h3>Evidence</h3><ul class="evidence">' + "".join(
            f"<li>{escape(line)}</li>" for line in f.evidence) + "</ul>"
    if f.next_steps:
        details += '<h3>What to check next</h3><ul class="steps">' + "".join(
            f"<li>{escape(step)}</li>" for step in f.next_steps) + "</ul>"
    if f.title and f.sentence:
        details += f"<details><summary>in one sentence</summary>{escape(f.sentence)}</details>"
    scatter = _scatter(f) if f.points and samples and shows_something(f) else ""
    return (
        f'<section class="finding">{head}'
        f'<div class="chips">{"".join(chips)}</div>{key}{details}'
        f'<div class="row">{scatter}{_pattern_table(f, samples)}</div>'
        f'{_sample_note(f, n_ranks) if scatter else ""}</section>'
    )


def shows_something(f: Finding) -> bool:
    """Whether the (β, μ) scatter shows more than the flagged ranks against a heap at (0, 0): some
    other rank runs the function."""
    flagged = set(f.ranks)
    return any(b > 0 or m > 0 for r, b, m in f.points if r not in flagged)


def _sample_note(f: Finding, n_ranks: int) -> str:
    if not f.points or len(f.points) >= n_ranks:
        return ""
    return f'<p class="note">The plot shows {len(f.points)} of {n_ranks} ranks (a sample the localizer kept).</p>'


def _pattern_table(f: Finding, samples: bool = True) -> str:
    head = (
        f'<table><tr><th></th><th class="n">{escape(_short_ranks(f.ranks))}</th>'
        '<th class="n">median rank</th><th class="n">expected</th></tr>'
    )
    rows = []
    mu_name, sigma_name = mu_names(f)
    dims = (("beta", "\u03b2 critical-path share"), ("mu", mu_name), ("sigma", sigma_name))
    for dim, name in dims if samples else dims[:1]:
        obs, med = getattr(f.observed, dim), getattr(f.median, dim)
        lo, hi = getattr(f.expected.lo, dim), getattr(f.expected.hi, dim)
        cls = "n bad" if obs < lo - 1e-12 or obs > hi + 1e-12 else "n"
        rows.append(
            f'<tr><td>{name}</td><td class="{cls}">{obs:.3f}</td><td class="n">{med:.3f}</td>'
            f'<td class="n">[{lo:g}, {hi:g}]</td></tr>'
        )
    return head + "".join(rows) + "</table>"


def _short_ranks(ranks: Sequence[int], count: bool = False) -> str:
    """"ranks 0-3,7", with its count when asked, or "32 ranks" where the list is long."""
    text = compress_ranks(ranks)
    if len(text) > 24:
        return f"{len(ranks)} ranks"
    return f"ranks {text} ({len(ranks)})" if count else f"ranks {text}"


def _hang_section(states: Sequence[RankState]) -> str:
    order = ["culprit", "silent", "failed", "waiting", "running", "paused", "exited", "ok"]
    groups: dict[tuple[str, str, str], list[RankState]] = {}
    for s in states:
        groups.setdefault((s.state, s.where, s.detail), []).append(s)
    rows = []
    for (state, where, detail), members in sorted(
        groups.items(), key=lambda kv: order.index(kv[0][0]) if kv[0][0] in order else len(order)
    ):
        idle = max(m.idle_s for m in members)
        last = max(m.last_iteration for m in members)
        rows.append(
            f'<tr><td class="state-{escape(state)}">{escape(state)}</td>'
            f'<td class="nw">{escape(compress_ranks([m.rank for m in members]))}</td><td>{escape(where)}</td>'
            f'<td class="n">{f"{idle:.1f}" if idle > 0 else "-"}</td>'
            f'<td class="n">{last if last >= 0 else "-"}</td><td class="nw">{escape(detail)}</td></tr>'
        )
    return (
        "<section><h2>Ranks by state</h2><table><tr><th>state</th><th>ranks</th><th>where</th>"
        '<th class="n">idle s</th><th class="n">last iteration</th><th>detail</th></tr>'
        + "".join(rows)
        + "</table></section>"
    )


def _top_table(report: Report, samples: bool = True) -> str:
    dims = ("beta", "mu", "sigma") if samples else ("beta",)
    rows = "".join(
        f"<tr><td>{escape(short_frame(t.label or t.key))}</td><td>{escape(t.category.value)}</td>"
        + "".join(f'<td class="n">{getattr(t.median, d):.3f}</td>' for d in dims) + "</tr>"
        for t in report.top_functions
    )
    names = {"beta": "\u03b2", "mu": "\u03bc", "sigma": "\u03c3"}
    return (
        '<p class="note">Top critical-path functions (median rank):</p><table><tr><th>function</th><th>category</th>'
        + "".join(f'<th class="n">{names[d]}</th>' for d in dims) + "</tr>" + rows + "</table>"
    )


# ------------------------------------------------------------------------------------------------
# SVG charts
# ------------------------------------------------------------------------------------------------


def _nice_max(x: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k that is >= x (x > 0)."""
    if x <= 0:
        return 1.0
    exp = math.floor(math.log10(x))
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        if m * 10**exp >= x - 1e-12:
            return m * 10**exp
    return 10.0 ** (exp + 1)


def _ticks(top: float, n: int = 5) -> list[float]:
    return [top * i / n for i in range(n + 1)]


def _fmt_tick(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _scatter(f: Finding, width: int = 460, height: int = 340) -> str:
    ml, mr, mt, mb = 52, 16, 34, 44
    pw, ph = width - ml - mr, height - mt - mb
    betas = [p[1] for p in f.points] + [f.observed.beta, f.median.beta]
    if f.expected.hi.beta < 1:
        betas.append(f.expected.hi.beta)
    x_top = min(1.0, _nice_max(max(betas) * 1.1)) if max(betas) > 0 else 1.0
    y_top = 1.0

    def sx(b: float) -> float:
        return ml + pw * min(max(b / x_top, 0.0), 1.0)

    def sy(m: float) -> float:
        return mt + ph * (1 - min(max(m / y_top, 0.0), 1.0))

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="beta against mu for every rank">'
    ]
    # expected range (only if it is not the whole square)
    lo, hi = f.expected.lo, f.expected.hi
    if (lo.beta, lo.mu, hi.beta, hi.mu) != (0.0, 0.0, 1.0, 1.0):
        x0, x1, y0, y1 = sx(lo.beta), sx(hi.beta), sy(hi.mu), sy(lo.mu)
        parts.append(f'<rect x="{x0:.1f}" y="{y0:.1f}" width="{x1 - x0:.1f}" height="{y1 - y0:.1f}" fill="#2ca02c" fill-opacity="0.10" stroke="#2ca02c" stroke-dasharray="4 3"/>')
        parts.append(f'<text x="{x0 + 4:.1f}" y="{y1 - 6:.1f}" style="fill:#258625">expected range</text>')
    # axes and grid
    for t in _ticks(x_top):
        x = sx(t)
        parts.append(f'<line x1="{x:.1f}" y1="{mt}" x2="{x:.1f}" y2="{mt + ph}" stroke="#eee"/>')
        parts.append(f'<text x="{x:.1f}" y="{mt + ph + 16}" text-anchor="middle">{_fmt_tick(t)}</text>')
    for t in _ticks(y_top):
        y = sy(t)
        parts.append(f'<line x1="{ml}" y1="{y:.1f}" x2="{ml + pw}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{ml - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt_tick(t)}</text>')
    parts.append(f'<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
    parts.append(f'<text x="{ml + pw / 2:.1f}" y="{height - 8}" text-anchor="middle">\u03b2: share of the window on the critical path</text>')
    parts.append(f'<text transform="translate(14 {mt + ph / 2:.1f}) rotate(-90)" text-anchor="middle">{escape(mu_names(f)[0].replace(" ", ": ", 1))}</text>')
    # points: normal first, abnormal on top
    abnormal = set(f.ranks)
    normal_pts = [p for p in f.points if p[0] not in abnormal]
    bad_pts = [p for p in f.points if p[0] in abnormal]
    for rank, b, m in normal_pts:
        parts.append(f'<circle cx="{sx(b):.1f}" cy="{sy(m):.1f}" r="4.5" fill="{NORMAL}" fill-opacity="0.6"><title>rank {rank}: \u03b2={b:.3f} \u03bc={m:.3f}</title></circle>')
    mx, my = sx(f.median.beta), sy(f.median.mu)
    parts.append(f'<path d="M{mx - 7:.1f},{my:.1f} L{mx:.1f},{my - 7:.1f} L{mx + 7:.1f},{my:.1f} L{mx:.1f},{my + 7:.1f} Z" fill="none" stroke="#333" stroke-width="1.5"><title>median rank</title></path>')
    for i, (rank, b, m) in enumerate(bad_pts):
        cx, cy = sx(b), sy(m)
        parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="7" fill="{ABNORMAL}" stroke="#fff" stroke-width="1.5"><title>rank {rank}: \u03b2={b:.3f} \u03bc={m:.3f}</title></circle>')
        if i == 0 or len(bad_pts) <= MAX_POINT_LABELS // 3:
            anchor = "end" if cx > ml + pw * 0.7 else "start"
            dx = -10 if anchor == "end" else 10
            label = f"rank {rank}" if len(bad_pts) <= MAX_POINT_LABELS // 3 else f"ranks {compress_ranks(f.ranks)}"
            parts.append(f'<text x="{cx + dx:.1f}" y="{cy - 9:.1f}" text-anchor="{anchor}" style="fill:{ABNORMAL};font-weight:700">{escape(label)}</text>')
    # legend
    lx, ly = ml + 6, mt - 12
    parts.append(f'<circle cx="{lx}" cy="{ly - 4}" r="5" fill="{ABNORMAL}"/><text x="{lx + 10}" y="{ly}">abnormal</text>')
    parts.append(f'<circle cx="{lx + 84}" cy="{ly - 4}" r="4.5" fill="{NORMAL}" fill-opacity="0.6"/><text x="{lx + 94}" y="{ly}">other ranks</text>')
    parts.append(f'<path d="M{lx + 184},{ly - 4} l6,-6 l6,6 l-6,6 Z" fill="none" stroke="#333"/><text x="{lx + 200}" y="{ly}">median</text>')
    parts.append("</svg>")
    return "".join(parts)


def _highlight_ranks(report: Report) -> set[int]:
    if report.hang_states:
        return {s.rank for s in report.hang_states if s.state in ("culprit", "silent")}
    specific = {r for f in report.findings if f.kind != "common" for r in f.ranks}
    return specific or {r for f in report.findings for r in f.ranks}


def _iteration_section(report: Report, width: int = 900, height: int = 300) -> str:
    ml, mr, mt, mb = 72, 110, 14, 40
    pw, ph = width - ml - mr, height - mt - mb
    highlight = _highlight_ranks(report)
    ranks = sorted(report.iteration_ms, key=lambda r: (r not in highlight, r))
    shown = ranks[:MAX_SERIES]
    series = {r: report.iteration_ms[r] for r in shown if report.iteration_ms[r]}
    if not series:
        return ""
    n_max = max(len(s) for s in series.values())
    if n_max < 2:  # one step per rank (offline traces): no line to draw, and the header lists the step times
        return ('<section><h2>Iteration time</h2><p class="note">No chart: each rank has one step in the '
                f'{"traces" if report.kind == "offline" else "window"}, so there is no series to draw; '
                "the step time of each rank is in the header above.</p></section>")
    values = sorted(v for s in series.values() for v in s)
    clip = values[min(len(values) - 1, int(0.98 * len(values)))] * 1.25  # past this: an outlier, drawn at the top
    base = baseline_ms(report)
    y_top = _nice_max(max(min(values[-1], clip), base or 0.0) * 1.05)
    clipped = sum(1 for v in values if v > y_top)

    def sx(i: float) -> float:
        return ml + pw * (i / max(n_max - 1, 1))

    def sy(v: float) -> float:
        return mt + ph * (1 - min(max(v / y_top, 0.0), 1.0))

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="iteration time per rank">'
    ]
    for t in _ticks(y_top):
        y = sy(t)
        parts.append(f'<line x1="{ml}" y1="{y:.1f}" x2="{ml + pw}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{ml - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt_tick(t)}</text>')
    parts.append(f'<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
    triggered = report.kind != "offline"  # offline traces have no trigger and no window after one
    parts.append(f'<text x="{ml + pw / 2:.1f}" y="{height - 8}" text-anchor="middle">'
                 + ("iteration in the profile window (it opens after the trigger)" if triggered
                    else "iteration in the traces") + "</text>")
    parts.append(f'<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="#2c7fb8" fill-opacity="0.04"/>')
    if triggered:
        parts.append(f'<line x1="{ml}" y1="{mt}" x2="{ml}" y2="{mt + ph}" stroke="#333" stroke-width="2"/>'
                     f'<text x="{ml + 4}" y="{mt + 12}" style="font-weight:700">trigger → window</text>')
    if base is not None:
        yb = sy(base)
        parts.append(f'<line x1="{ml}" y1="{yb:.1f}" x2="{ml + pw}" y2="{yb:.1f}" stroke="#333" stroke-dasharray="6 4"/>'
                     f'<text x="{ml + pw - 4}" y="{yb - 5:.1f}" text-anchor="end">before the slowdown: '
                     f'{base:.3g} ms</text>')
    parts.append(f'<text transform="translate(14 {mt + ph / 2:.1f}) rotate(-90)" text-anchor="middle">iteration time, ms</text>')
    labelled = 0
    label_ys: list[float] = []
    for r in sorted(series, key=lambda r: r in highlight):  # highlighted lines drawn last, on top
        s = series[r]
        offset = n_max - len(s)
        pts = " ".join(f"{sx(offset + i):.1f},{sy(v):.1f}" for i, v in enumerate(s))
        bad = r in highlight
        color, w, op = (ABNORMAL, 2.5, 1.0) if bad else (NORMAL, 1.2, 0.45)
        parts.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="{w}" stroke-opacity="{op}"><title>rank {r}</title></polyline>')
        if bad and labelled < MAX_POINT_LABELS:
            labelled += 1
            y = sy(s[-1]) + 4
            while any(abs(y - u) < 14 for u in label_ys):
                y += 14
            label_ys.append(y)
            parts.append(f'<text x="{sx(n_max - 1) + 6:.1f}" y="{y:.1f}" style="fill:{ABNORMAL};font-weight:700">rank {r}</text>')
    others = len(series) - len([r for r in series if r in highlight])
    if others:
        parts.append(f'<text x="{ml + pw + 6}" y="{mt + ph - 4}" style="fill:{NORMAL}">{others} other ranks</text>')
    parts.append("</svg>")
    note = ""
    if clipped:
        note += f'<p class="note">{clipped} outlier point(s) above {_fmt_tick(y_top)} ms drawn at the top.</p>'
    if len(ranks) > len(shown):
        note += f'<p class="note">{len(ranks) - len(shown)} more ranks not drawn: {escape(compress_ranks(ranks[len(shown):]))}</p>'
    return f"<section><h2>Iteration time in the window</h2>{''.join(parts)}{note}</section>"


def _luminance(color: str) -> float:
    """WCAG 2 relative luminance of a "#rrggbb" colour."""
    def channel(c: int) -> float:
        v = c / 255
        return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)


def contrast(fg: str, bg: str) -> float:
    """WCAG 2 contrast ratio of two "#rrggbb" colours (1 to 21; AA asks 4.5 for normal text)."""
    hi, lo = sorted((_luminance(fg), _luminance(bg)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def label_ink(background: str) -> str:
    """White or near-black, whichever reads better on ``background`` (a label on a coloured bar)."""
    return "#ffffff" if contrast("#ffffff", background) >= contrast(INK, background) else INK


INK = "#1d2330"  # the page's text colour


# the step picture's parts, in drawing order, with their colours
_PART_COLORS = {"host": "#8f60ba", "compute": "#2a79b0", "waiting": "#cb4b0b", "communication": "#288444",
                "other": "#c7c7c7"}  # each with a label ink of AA contrast (``label_ink``)


def _step_section(report: Report) -> str:
    return ("<section><h2>One step</h2>" + _step_svg(report)
            + '<p class="note">Each lane is one rank\'s median step, split by the share of the window its '
              "critical path spent in each part (host: Python and op dispatch; waiting: the waits the "
              "findings measured; communication: the rest of its collectives). Shares in a fixed order, "
              "not a timeline.</p></section>")


def _step_svg(report: Report, width: int = 900) -> str:
    lanes = report.step_lanes
    lane_h, gap, ml, mr, mt = 30, 14, 170, 20, 34
    height = mt + len(lanes) * (lane_h + gap) + 36
    pw = width - ml - mr
    top = _nice_max(max((lane.step_ms for lane in lanes), default=1.0))
    culprits = {r for f in report.findings[:1] if f.kind != "common" for r in f.ranks}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="one step of each chosen rank">']
    lx = ml
    for name, color in _PART_COLORS.items():
        parts.append(f'<rect x="{lx}" y="8" width="12" height="12" fill="{color}"/>'
                     f'<text x="{lx + 16}" y="18">{name}</text>')
        lx += 30 + 8 * len(name)
    for t in _ticks(top):
        x = ml + pw * t / top
        parts.append(f'<line x1="{x:.1f}" y1="{mt - 4}" x2="{x:.1f}" y2="{height - 30}" stroke="#eee"/>')
        parts.append(f'<text x="{x:.1f}" y="{height - 16}" text-anchor="middle">{_fmt_tick(t)}</text>')
    parts.append(f'<text x="{ml + pw / 2:.1f}" y="{height - 2}" text-anchor="middle">ms of one step</text>')
    for i, lane in enumerate(lanes):
        y = mt + i * (lane_h + gap)
        bad = lane.rank in culprits
        style = f"fill:{ABNORMAL};font-weight:700" if bad else ""
        parts.append(f'<text x="{ml - 8}" y="{y + 13}" text-anchor="end" style="{style}">rank {lane.rank}</text>')
        parts.append(f'<text x="{ml - 8}" y="{y + 27}" text-anchor="end" class="note" '
                     f'style="fill:#5f6b7a;font-size:11px">{escape(lane.role)}</text>')
        x = float(ml)
        for name, ms in lane.parts:
            w = pw * ms / top
            if w <= 0:
                continue
            parts.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{lane_h}" '
                         f'fill="{_PART_COLORS.get(name, "#999")}"><title>rank {lane.rank} {escape(name)}: '
                         f'{ms:.3g} ms</title></rect>')
            if w > 44:
                ink = label_ink(_PART_COLORS.get(name, "#999"))
                parts.append(f'<text x="{x + w / 2:.1f}" y="{y + lane_h / 2 + 4:.1f}" text-anchor="middle" '
                             f'style="fill:{ink}">{ms:.3g}</text>')
            x += w
        parts.append(f'<text x="{x + 4:.1f}" y="{y + lane_h / 2 + 4:.1f}">{lane.step_ms:.3g} ms</text>')
    parts.append("</svg>")
    return "".join(parts)
