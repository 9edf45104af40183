"""Terminal renderer (rich): header, findings in the report's order, hang table, top functions.

Writes a Report as it is; computes nothing beyond layout (grouping rows for display, compressing
rank lists into ranges; never reordering findings: consecutive findings of one function share a
panel, and the order is the report's, as in JSON and HTML). Colors only when ``color`` is true or the file is a terminal (and
``NO_COLOR`` is unset); the width is the terminal's, 80 columns when not a terminal.

Every string from the report (names, reasons, stacks) is shown as a ``rich.text.Text`` made by
``_t`` (``safe_text``: control characters and bidi overrides as visible escapes), never as rich
markup, so a function named ``model.forward[/layer]`` or a reason holding ``ESC ] 52`` is printed as
it is and cannot fail the render or drive the terminal.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TextIO

from perftracker.localizer.render.facts import (
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
from rich import box
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from perftracker.model import Finding, RankState, Report, Triple, compress_ranks
from perftracker.model.names import safe_text

_STATE_STYLE = {"culprit": "bold red", "silent": "bold magenta", "failed": "red", "waiting": "yellow",
                "running": "cyan", "paused": "cyan", "exited": "dim", "ok": "green"}
_DIMS = ("beta", "mu", "sigma")
_DIM_LABELS = {"beta": "\u03b2 critical share", "mu": "\u03bc utilization", "sigma": "\u03c3 util. std"}


def render(report: Report, file: TextIO, *, color: bool | None = None, width: int | None = None,
           console: Console | None = None) -> None:
    """Write ``report`` to ``file`` as rich terminal text, or print it on ``console`` (the CLI's: its
    terminal's width and colour rules). ``width`` None: the terminal's, else 80."""
    console = console or Console(
        file=file,
        width=width,
        force_terminal=color,
        no_color=True if color is False else None,  # None: rich honours NO_COLOR
        highlight=False,
        emoji=False,
        markup=False,
        soft_wrap=False,
    )
    console.print(_header(report))
    if report.kind in ("hang", "crash") or report.hang_states:
        console.print(_hang_table(report.hang_states))
    if report.kind == "crash":
        for s in report.hang_states:
            if s.state == "culprit" and s.signature:
                console.print(_stack_text(s))
    samples = has_samples(report)
    if report.findings:
        number = {id(f): i for i, f in enumerate(report.findings, 1)}
        for key, group in _group_by_function(report.findings):
            console.print(_function_panel(key, group, samples, number))
    elif report.kind not in ("hang", "crash"):
        console.print(Text("No abnormal functions.", style="bold green"))
        if report.top_functions:
            console.print(_top_table(report, samples))


def _t(text: str, style: str = "") -> Text:
    """Data as text: escaped (``safe_text``), never markup."""
    return Text(safe_text(text), style=style)


def _fmt_time(ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ns / 1e9))


def _ranks_text(ranks: Iterable[int]) -> str:
    rs = list(ranks)
    return f"{compress_ranks(rs)} ({len(rs)})" if rs else "none"


def _header(report: Report) -> Panel:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("job", _t(report.job))
    grid.add_row("session", _t(session_text(report)))
    grid.add_row("created", _fmt_time(report.created_ns))
    if report.window_s > 0:
        window = f"{report.window_s:.3g} s" if report.window_s >= 1 else f"{report.window_s * 1000:.3g} ms"
        grid.add_row("window", _t(window + (f"  profile {report.profile}" if report.profile else "")))
    grid.add_row("level", _t(level_text(report)))
    cost = cost_text(report)
    if cost:
        grid.add_row("window cost", _t(cost))
    together = together_text(report)
    if together:
        grid.add_row("fixing all", _t(together))
    grid.add_row("trigger", _t(trigger_text(report)))
    grid.add_row("ranks reported", _t(_ranks_text(report.ranks_reported)))
    missing = Text(_ranks_text(report.ranks_missing), style="bold red" if report.ranks_missing else "")
    grid.add_row("ranks missing", missing)
    steps = step_times_text(report)
    if steps:
        grid.add_row("step time", _t(steps))
    if report.since_fast is not None:  # the job's healthy baseline (issue 49)
        grid.add_row("since it was fast", _t(report.since_fast.note))
        if report.since_fast.paid:
            grid.add_row("did the fix pay", _t(report.since_fast.paid))
    parts: list[RenderableType] = [grid]
    if report.top_line:
        parts = [_t(report.top_line, style="bold"), Text(""), grid]
    return Panel(Group(*parts), title="perftracker report", title_align="left", box=box.ROUNDED)


def _group_by_function(findings: Iterable[Finding]) -> list[tuple[str, list[Finding]]]:
    """Runs of consecutive findings of one function, in the report's order (never regrouped)."""
    groups: list[tuple[str, list[Finding]]] = []
    for f in findings:
        if groups and groups[-1][0] == f.key:
            groups[-1][1].append(f)
        else:
            groups.append((f.key, [f]))
    return groups


def _num(x: float) -> str:
    return f"{x:.3f}"


def _outside(x: float, lo: float, hi: float) -> bool:
    return x < lo - 1e-12 or x > hi + 1e-12


def _pattern_table(f: Finding, samples: bool = True) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("")
    table.add_column(f"ranks {compress_ranks(f.ranks)}", justify="right")
    table.add_column("median rank", justify="right")
    table.add_column("expected", justify="right")
    mu_name, sigma_name = mu_names(f)
    labels = {**_DIM_LABELS, "mu": mu_name, "sigma": sigma_name}
    for dim in _DIMS if samples else _DIMS[:1]:
        obs = getattr(f.observed, dim)
        lo, hi = getattr(f.expected.lo, dim), getattr(f.expected.hi, dim)
        med = getattr(f.median, dim)
        style = "bold red" if _outside(obs, lo, hi) else "bold"
        table.add_row(labels[dim], Text(_num(obs), style=style), _num(med), Text(f"[{lo:g}, {hi:g}]"))
    return table


def _function_panel(key: str, group: list[Finding], samples: bool = True,
                    number: dict[int, int] | None = None) -> Panel:
    first = group[0]
    body: list[RenderableType] = []
    if ";" in first.key:  # a call stack: its frames (a made pattern's key is no place to show)
        body.append(_t(_short_stack(first.key), style="dim"))
    for f in group:
        n = (number or {}).get(id(f), 0)
        # the first finding's title is the report's headline, printed once, in the header
        body.append(_t(f"#{n}: the headline above" if n == 1 and f.title else
                       (f"#{n} " if n else "") + f.headline, style="bold"))
        if f.evidence:  # a version 2 finding: evidence lines and next steps replace the table
            body.append(_bullets(f.evidence, "·", "dim"))
            if f.next_steps:
                body.append(_t("what to check next", style="bold"))
                body.append(_bullets(f.next_steps, "-", ""))
            continue
        meta = Text()
        meta.append("test ", style="dim")
        meta.append(safe_text(", ".join(f.tests) or "-"), style="cyan")
        meta.append("   kind ", style="dim")
        meta.append(safe_text(f.kind), style="cyan")
        meta.append("   ranks ", style="dim")
        meta.append(_ranks_text(f.ranks), style="bold red")
        if f.impact > 0:
            meta.append("   impact ", style="dim")
            meta.append(impact_text(f), style="cyan")
        body.append(meta)
        body.append(_pattern_table(f, samples))
    title = Text()
    title.append(safe_text(first.category.value), style="magenta")
    title.append("  ")
    title.append(safe_text(short_frame(first.label or key)), style="bold")
    return Panel(Group(*body), title=title, title_align="left", box=box.ROUNDED, border_style="red")


def _bullets(lines: Iterable[str], mark: str, style: str) -> Table:
    """One line per item, wrapped lines indented under their first."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(width=2, justify="right")
    grid.add_column(style=style, overflow="fold")  # a long rank list wraps whole, never cut with "…"
    for line in lines:
        grid.add_row(mark, _t(line))
    return grid


def _short_stack(key: str, keep: int = 4) -> str:
    frames = [short_frame(f) for f in key.split(";")]
    if len(frames) <= keep:
        return " > ".join(frames)
    return "... > " + " > ".join(frames[-keep:])


def _hang_table(states: Iterable[RankState]) -> Table:
    table = Table(title="ranks by state", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("state")
    table.add_column("ranks")
    table.add_column("where")
    table.add_column("idle s", justify="right")
    table.add_column("last iter", justify="right")
    table.add_column("detail")
    rows: dict[tuple[str, str, str], list[RankState]] = {}
    for s in states:
        rows.setdefault((s.state, s.where, s.detail), []).append(s)
    order = list(_STATE_STYLE)
    ranked = sorted(rows.items(), key=lambda kv: order.index(kv[0][0]) if kv[0][0] in order else len(order))
    for (state, where, detail), members in ranked:
        idle = max(m.idle_s for m in members)
        last = max(m.last_iteration for m in members)
        table.add_row(
            _t(state, style=_STATE_STYLE.get(state, "")),
            compress_ranks([m.rank for m in members]),
            _t(where),
            f"{idle:.1f}" if idle > 0 else "-",
            str(last) if last >= 0 else "-",
            _t(detail),
        )
    return table


def _stack_text(state: RankState, limit: int = 30) -> Text:
    """A crash's stack (RankState.signature: "file:line:function;..." outermost first), innermost last."""
    frames = state.signature.split(";")
    text = Text(f"stack of rank {state.rank} (innermost last)\n", style="bold")
    if len(frames) > limit:
        text.append(f"  ... {len(frames) - limit} outer frames\n", style="dim")
    for fr in frames[-limit:]:
        file, _, rest = fr.rpartition(":")
        path, _, line = file.rpartition(":")
        text.append(f"  {safe_text(path)}:{safe_text(line)} in {safe_text(rest)}\n",
                    style="" if path.startswith("<") else "bold")
    return text


def _top_table(report: Report, samples: bool = True) -> Table:
    table = Table(title="top critical-path functions (median rank)", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("function")
    table.add_column("category")
    dims = _DIMS if samples else _DIMS[:1]
    for dim in dims:
        table.add_column(_DIM_LABELS[dim].split()[0], justify="right")
    for t in report.top_functions:
        m: Triple = t.median
        table.add_row(_t(short_frame(t.label or t.key)), _t(t.category.value), *(_num(getattr(m, d)) for d in dims))
    return table
