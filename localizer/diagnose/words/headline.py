"""A finding's headline (``title``, at most 120 characters), its evidence lines and next steps, and
the report's headline: plain words first, internal terms (β, μ, the tests) in the evidence.

Pure functions over a built Finding (its numbers and its sentence's cause clause), so that every
finding kind gets them the same way, whoever built it (functions, waits, pipeline stages, moving
stragglers). The cause kind comes from ``next_steps.cause_kind``; docs/reports.md explains the terms.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from collections.abc import Mapping, Sequence

from perftracker.localizer.diagnose.evidence.host_bound import HOST_KEY, IDLE_KEY
from perftracker.localizer.diagnose.verdict.group_findings import MOVING_KEY, STAGE_KEY
from perftracker.localizer.diagnose.verdict.ranking import more_tail, order_note
from perftracker.localizer.diagnose.words.explain import describe_ranks, frame_text, pct
from perftracker.localizer.diagnose.words.labels import JOIN
from perftracker.localizer.diagnose.words.next_steps import cause_kind, cause_phrase, next_steps

from perftracker.model import LINK_KEY, Category, Finding, Report, compress_ranks
from perftracker.model.hardware import GPU_CLOCK_KEY
from perftracker.model.hardware import is_health as hardware_health
from perftracker.model.trigger import Detection

MAX_TITLE_CHARS = 120
_MAX_LABEL_CHARS = 40
_MAX_WHO_CHARS = 22
_FRAME = re.compile(r"^(?P<path>.+?)\((?P<line>\d+)\): (?P<fn>.+)$")
_TESTS = {
    "expectation": "expectation: outside the expected range of its category",
    "differential": "differential: unlike most other ranks",
    "waits": "waits: the others wait for these ranks at a collective",
}
_ALL_WAIT = "waits: the ranks wait for one another at a collective (no rank is late in every step)"
_KINDS = {
    "common": "common: most ranks (a job-wide cause)",
    "specific": "specific: these ranks and not the others (look at their hosts and inputs)",
    "random": "random: no fixed culprit; the share varies from rank to rank (or from step to step)",
}


def fit(text: str, limit: int = MAX_TITLE_CHARS) -> str:
    """``text`` cut to ``limit`` characters: at the last clause ("; ") that fits, else with "…"."""
    if len(text) <= limit:
        return text
    cut = text.rfind("; ", 0, limit)
    if cut >= limit // 2:
        return text[:cut]
    return text[:limit - 1].rstrip() + "…"


# a source place in an incident's text: a path (absolute, or <lib>/...) ending in file.py:LINE
_PLACE_RE = re.compile(r"(?:<\w+>)?(?:/[^\s/:;,()]+)*/([^\s/:;,()]+\.py:\d+)")


def fit_incident(summary: str, limit: int = MAX_TITLE_CHARS) -> str:
    """A hang or crash summary as a headline: each source place shortened to its file and line
    (``/work/job/train.py:34`` -> ``train.py:34``; the report keeps the whole path), then ``fit``."""
    return fit(_PLACE_RE.sub(r"\1", summary), limit)


def short_label(label: str, limit: int = _MAX_LABEL_CHARS) -> str:
    """A function's name for a headline: a Python frame's function with its file and line
    ("at (train.py:144)": a bare Python name such as ``at`` or ``step`` says little; the place is
    dropped when it does not fit), a C++ kernel without its argument list
    ("ncclKernel_AllReduce_RING_LL_Sum_float"), cut in the middle past ``limit``."""
    name, sep, caller = label.partition(JOIN)  # one call path of several: "f from g" (labels.py)
    if sep and len(label) > limit:  # keep the caller that tells the paths apart, shortened first
        return f"{short_label(name, limit)}{JOIN}{caller.rsplit('.', 1)[-1]}"
    m = _FRAME.match(label.rsplit(";", 1)[-1])  # a stack key "a.py(1): f;b.py(2): g": its innermost frame
    if m is not None:
        fn = " ".join(m.group("fn").split())
        placed = f"{fn} ({m.group('path').replace(chr(92), '/').rsplit('/', 1)[-1]}:{m.group('line')})"
        if len(placed) <= limit:
            return placed
        label = fn
    else:
        label = _cpp_name(label)
    label = " ".join(label.split())
    if len(label) <= limit:
        return label
    if ", " in label and len(label.split(", ", 1)[0]) <= limit:  # "ddp.reducer::wait, varying part (…)"
        return label.split(", ", 1)[0]
    name, sep, group = label.rpartition(" [")
    if sep and group.endswith("]") and len(group) < limit // 2:  # a per-group kernel keeps its group
        return short_label(name, limit - len(group) - 2) + " [" + group
    head = (limit - 1) * 2 // 3
    return label[:head] + "…" + label[-(limit - 1 - head):]


def _cpp_name(label: str) -> str:
    """A C++ symbol without its return type, argument list and template arguments:
    "void at::native::vectorized_elementwise_kernel<4, F<float>>(int, F)" ->
    "at::native::vectorized_elementwise_kernel"; a per-group suffix (" [EMBEDDING_GROUP]") stays."""
    name, sep, group = label.rpartition(" [")
    if not (sep and group.endswith("]")):
        name, group = label, ""
    text = name.strip()
    cut = text.replace("(anonymous namespace)::", "")
    if cut.endswith(")") and not cut.startswith("("):
        depth = 0
        for i in range(len(cut) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(cut[i], 0)
            if depth == 0:
                cut = cut[:i] if i > 0 else cut
                break
    for _ in range(8):  # nested template arguments, innermost first
        stripped = re.sub(r"<[^<>]*>", "", cut)
        if stripped == cut:
            break
        cut = stripped
    cut = cut.removeprefix("void ").strip()
    if cut and " " not in cut:  # a symbol: "Memcpy HtoD (Pageable -> Device)" keeps its words
        op = _kernel_op(name)
        text = cut
        if len(text) > _MAX_LABEL_CHARS and "::" in text:
            text = text.rsplit("::", 1)[-1]
        if op and op.lower() not in text.lower():
            text = f"{text} ({op})"
    elif len(text) > _MAX_LABEL_CHARS and "::" in text and " " not in text:
        text = text.rsplit("::", 1)[-1]
    return f"{text} [{group}" if group else text


_OP = re.compile(r"(?<![A-Za-z0-9])([A-Za-z][A-Za-z0-9]*?)(?:_kernel_cuda|_kernel_impl|Functor|Ops)(?![A-Za-z0-9_])")
_WRAPPERS = frozenset({"Binary", "AUnary", "BUnary", "Unary", "Reduce", "Func", "Binary_internal"})


def _kernel_op(symbol: str) -> str:
    """The operation a generic ATen kernel runs, named in its template arguments:
    "vectorized_elementwise_kernel<4, at::native::sqrt_kernel_cuda(…)::{lambda…}>" -> "sqrt",
    "…BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float>>" -> "Mul",
    "reduce_kernel<512, 1, ReduceOp<float, MeanOps<…>>>" -> "Mean"; "" when none is named (the
    innermost name that is not a generic wrapper)."""
    start = symbol.find("<")
    if start < 0:
        return ""
    names = [m for m in _OP.findall(symbol[start:]) if m not in _WRAPPERS]
    return names[-1] if names else ""


def _who(ranks: Sequence[int], n_workers: int) -> str:
    text = describe_ranks(list(ranks), n_workers)
    if len(text) <= _MAX_WHO_CHARS:
        return text
    rs = sorted(ranks)
    step = rs[1] - rs[0] if len(rs) >= 4 else 0
    if step > 1 and all(b - a == step for a, b in zip(rs, rs[1:], strict=False)):  # every other rank
        return f"ranks {rs[0]},{rs[1]},…,{rs[-1]}"
    return f"{len(ranks):,} of {n_workers:,} ranks"


def cause_clause(sentence: str) -> str:
    """The likely cause a sentence states after its dash, up to the next clause."""
    if " — " not in sentence:
        return sentence
    return sentence.split(" — ", 1)[1].split("; ", 1)[0]


def is_health(key: str) -> bool:
    """A health pattern (the host link, the GPU clock, a throttle reason, the InfiniBand port, peer
    traffic over PCIe): μ is its measure, not a utilization, and it is no function to spend time in."""
    return key == LINK_KEY or hardware_health(key)


def _plural(n: int, one: str, many: str) -> str:
    return one if n == 1 else many


def _core(f: Finding, who: str, n: int) -> str:
    """Who does what, and how much of the window it takes."""
    fn = short_label(f.label or f.key)
    obs, med = f.observed.beta, f.median.beta
    if f.key == STAGE_KEY:
        ratio = obs / med if med > 0 else 0.0
        what = f"{f.label} ({who})" if who != "all ranks" else f.label
        return f"{what} computes {ratio:.1f}× the other stages" if ratio else f"{what} computes more"
    if f.key == MOVING_KEY:
        return f"the slowest rank changes from step to step ({who})"
    if f.key == HOST_KEY:
        expected = f", expected ≤ {pct(f.expected.hi.beta)}" if f.expected.hi.beta < 1 else ""
        if who == "all ranks":
            return f"the GPU waits for the host {pct(obs)} of the window on all ranks ({expected.lstrip(', ')})"
        return f"{who}: the GPU waits for the host {pct(obs)} of the window ({pct(med)} median{expected})"
    if f.key == IDLE_KEY:
        return f"{who} {_plural(n, 'stalls', 'stall')} outside traced ops ({pct(obs)} vs {pct(med)} of the window)"
    if f.key == LINK_KEY:
        return f"{who}: TCP retransmits {pct(f.observed.mu)} of segments (median {pct(f.median.mu)})"
    if f.key == GPU_CLOCK_KEY:  # its label carries the facts: "GPU SM clock 1.10 of 1.98 GHz (thermal slowdown)"
        return f"{who}: {short_label(f.label or f.key, 60)}"
    if is_health(f.key):
        return f"{who}: {short_label(f.label or f.key, 48)} {pct(f.observed.mu)} (others {pct(f.median.mu)})"
    if f.kind == "random":
        return f"{fn} takes a varying share of the window on {who}, scattered"
    if f.tests == ("waits",) and f.category is Category.COLLECTIVE:
        coll = short_label(f.waits[0].function) if f.waits else fn
        return f"{who} {_plural(n, 'arrives', 'arrive')} last at {coll}"
    if f.kind == "common" and "expectation" in f.tests:
        hi = f.expected.hi.beta
        if obs > hi:
            return f"{who}: {fn} takes {pct(obs)} of the window (expected ≤ {pct(hi)})"
        return f"{who}: {fn} outside its expected range ({pct(obs)} of the window)"
    rm = f.observed.mu / f.median.mu if f.median.mu > 0 else None
    if f.category is Category.COMPUTE and rm is not None and rm <= 0.9 and obs <= med * 1.1 + 1e-9:
        return f"{who} {_plural(n, 'runs', 'run')} {fn} at {rm * 100:.0f}% of the others' utilization"
    if med < 1e-4 or obs >= med * 1.1:
        verb = _plural(n, "runs", "run")
        if med < 1e-4:
            return f"{who} {verb} extra {fn} ({pct(obs)} of the window, others {pct(med)})"
        return f"{who} {_plural(n, 'spends', 'spend')} {obs / med:.1f}× longer in {fn} ({pct(obs)} vs {pct(med)})"
    if obs <= med * 0.9:
        return f"{who} {_plural(n, 'spends', 'spend')} less in {fn} ({pct(obs)} vs {pct(med)}): the others wait"
    return f"{who}: {fn} unlike the other ranks ({pct(obs)} of the window)"


def _wait_part(f: Finding, n_workers: int) -> str:
    if not f.waits or f.key == MOVING_KEY:
        return ""
    w = f.waits[0]
    obj = _plural(len(f.ranks), "it", "them")
    return (f"; {_who(w.ranks, n_workers)} {_plural(len(w.ranks), 'waits', 'wait')} "
            f"{pct(w.share)} for {obj}")


def title_of(f: Finding, n_workers: int, limit: int = MAX_TITLE_CHARS) -> tuple[str, str]:
    """(the finding's headline of at most ``limit`` characters, its cause kind)."""
    clause = cause_clause(f.sentence)
    kind = cause_kind(clause, f.key)
    phrase = cause_phrase(kind, clause)
    who = _who(f.ranks, n_workers)
    core = _core(f, who, len(f.ranks))
    waits = _wait_part(f, n_workers)
    tail = f" — {phrase}" if phrase else ""
    saves = f"; fixing it saves ~{pct(f.saves_share)} of the window" if f.saves_share >= 0.01 else ""
    short = _compact(core)  # once fixing it has a price, that is the cost the title gives
    brief = f"; saves ~{pct(f.saves_share)} of the window" if saves else ""  # the saving kept, in fewer words
    for candidate in (core + waits + tail + saves, short + waits + tail + saves if saves else "",
                      core + tail + saves if saves else "", short + tail + saves if saves else "",
                      core + tail + brief if saves else "", short + tail + brief if saves else "",
                      core + waits + tail, core + tail, short + waits + tail, short + tail):
        if not candidate:
            continue
        if len(candidate) <= limit:
            return candidate, kind
    return fit(core, limit - len(tail)) + tail if len(tail) < limit // 2 else fit(core + tail, limit), kind


def _compact(core: str) -> str:
    """The headline's core without its parenthesised numbers (kept in the evidence)."""
    return re.sub(r" \([^()]*\)$", "", core)


def _range(lo: float, hi: float) -> str:
    if lo <= 0 and hi >= 1:
        return "any"
    if lo <= 0:
        return f"≤ {pct(hi)}"
    if hi >= 1:
        return f"≥ {pct(lo)}"
    return f"{pct(lo)}–{pct(hi)}"


def evidence_of(f: Finding, n_workers: int, samples: bool = True) -> tuple[str, ...]:
    """One fact per line: the pattern against the median rank and the expected range, the waits,
    the test that fired, the kind, the cost."""
    ranks = f"{'rank' if len(f.ranks) == 1 else 'ranks'} {compress_ranks(f.ranks)}"
    o, m, lo, hi = f.observed, f.median, f.expected.lo, f.expected.hi
    health = is_health(f.key)
    if health:  # a measure, not a function: its μ is the fact (its β is its category's time)
        what = "retransmitted share" if f.key == LINK_KEY else "the measure"
        return tuple([f"measure: {frame_text(f.label or f.key)}",
                      f"μ ({what}): {pct(o.mu)} on {ranks}; median rank {pct(m.mu)}{_expected(lo.mu, hi.mu)}",
                      *_common_evidence(f, n_workers)])
    lines = [_what_line(f)] if f.key not in (STAGE_KEY, MOVING_KEY) else []
    if f.key in (STAGE_KEY, MOVING_KEY) and len(f.ranks) >= n_workers:  # every rank: no one waits for the others
        lines.append(f"compute (β summed over the compute functions): {pct(o.beta)} of the window, "
                     f"the median of all {n_workers:,} ranks")
    elif f.key in (STAGE_KEY, MOVING_KEY):
        lines.append(f"compute (β summed over the compute functions): {pct(o.beta)} of the window on "
                     f"{ranks}; {pct(m.beta)} on the ranks that wait")
    else:
        lines.append(f"β (share of the window on the critical path): {pct(o.beta)} on {ranks}; median rank "
                     f"{pct(m.beta)}{_expected(lo.beta, hi.beta)}")
    if samples and (o.mu > 0 or m.mu > 0 or lo.mu > 0 or hi.mu < 1):
        lines.append(f"μ (utilization of its resource): {pct(o.mu)}; median rank {pct(m.mu)}{_expected(lo.mu, hi.mu)}")
        lines.append(f"σ (spread of that utilization): {pct(o.sigma)}; median rank {pct(m.sigma)}"
                     f"{_expected(lo.sigma, hi.sigma)}")
    return tuple(lines) + _common_evidence(f, n_workers)


_MEASURES = {  # a pattern the localizer makes (no function of the trace): what it measures, not its key
    HOST_KEY: "measure: the GPU waits for the host (no kernel runs while the host dispatches ops, loads data "
              "or runs Python), summed over the host ops",
    IDLE_KEY: "measure: a stall outside traced ops (no kernel ran and the host recorded no op)",
}


def _what_line(f: Finding) -> str:
    """The first evidence line: the function (its category and frames), or what a made pattern measures."""
    return _MEASURES.get(f.key) or f"function: {f.category.value} {frame_text(f.label or f.key)}"


def whole_ranks(ranks: Sequence[int], n_workers: int) -> str:
    """A rank list whole, as the evidence promises: "rank 3", "ranks 1,3,5,…" in full, "all 64 ranks"."""
    if len(ranks) == n_workers and n_workers > 1:
        return f"all {n_workers:,} ranks"
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {compress_ranks(ranks)}"


def _expected(lo: float, hi: float) -> str:
    """"; expected ≤ 10%", or nothing where any value is expected (only the other ranks judge it)."""
    return "" if lo <= 0 and hi >= 1 else f"; expected {_range(lo, hi)}"


def _common_evidence(f: Finding, n_workers: int) -> tuple[str, ...]:
    """The evidence lines every finding has after its pattern: waits, parts, tests, kind, cost."""
    lines: list[str] = []
    for w in f.waits:
        lines.append(f"waits: {whole_ranks(w.ranks, n_workers)} "
                     f"{_plural(len(w.ranks), 'waits', 'wait')} {pct(w.share)} of the window "
                     f"in {frame_text(w.function)}")
    for label, b in f.parts:
        lines.append(f"part: {frame_text(label)} {pct(b)} of the window (median)")
    everyone = len(f.ranks) >= n_workers > 1
    for t in f.tests:
        lines.append("test: " + (_ALL_WAIT if t == "waits" and everyone else _TESTS.get(t, t)))
    lines.append("kind: " + _KINDS.get(f.kind, f.kind))
    if f.impact > 0:
        seconds = f"{f.impact_s:.3g} s" if f.impact_s >= 1 else f"{f.impact_s * 1000:.3g} ms"
        how = ("what fixing it saves, more than the most one rank loses to it"
               if f.saves_share >= f.impact else "the most one rank loses to it: its own excess or one waiting rank's waits")
        lines.append(f"impact: {pct(f.impact)} of the window ({seconds}), {how}")
    if f.saves_share > 0:
        lines.append(f"saves: fixing it would save about {pct(f.saves_share)} of the window ({f.saves_basis or 'an estimate'})")
    return tuple(lines)


def dress(f: Finding, n_workers: int, samples: bool = True) -> Finding:
    """``f`` with its title, cause kind, evidence and next steps."""
    title, kind = title_of(f, n_workers)
    return dataclasses.replace(f, title=title, cause=kind, evidence=evidence_of(f, n_workers, samples),
                               next_steps=next_steps(kind, f.label or f.key))


SAME_STEP = 0.01  # step medians within this fraction of the longest are the longest (one step's timer noise)


def longest_step_note(f: Finding, iteration_ms: Mapping[int, Sequence[float]]) -> str:
    """Why a culprit that is not the rank with the longest steps is still the culprit ("" when it is)."""
    steps = {r: statistics.median(v) for r, v in iteration_ms.items() if v}
    if not steps or not f.ranks or f.kind == "common":
        return ""
    longest = max(steps, key=lambda r: (steps[r], -r))
    if longest in f.ranks:
        return ""
    mine = [steps[r] for r in f.ranks if r in steps]
    if mine and max(mine) >= steps[longest] * (1.0 - SAME_STEP):
        return ""  # the culprit's steps are as long as the longest: nothing to explain
    rank_word = "rank" if len(f.ranks) == 1 else "ranks"
    here = f" ({max(mine):.1f} ms on {rank_word} {compress_ranks(f.ranks)})" if mine else ""
    why = ("a step's time includes the time a rank waits for the others, and the others wait for these ranks"
           if f.waits else "a step's time includes waiting, and no test flags a function of that rank")
    return f"longest steps: rank {longest}, {steps[longest]:.1f} ms{here}, is not named: {why}"


def quiet_headline(n_workers: int, top: Sequence[tuple[str, float]]) -> str:
    """A report without findings: "no abnormal function on 4 ranks; critical path: f 40%, g 12%",
    as many of the top functions as fit."""
    text = f"no abnormal function on {n_workers:,} rank{'' if n_workers == 1 else 's'}"
    shown: list[str] = []
    for label, beta in top[:3]:
        item = f"{short_label(label, 32)} {pct(beta)}"
        candidate = f"{text}; critical path: {', '.join([*shown, item])}"
        if len(candidate) > MAX_TITLE_CHARS:
            break
        shown.append(item)
    return f"{text}; critical path: {', '.join(shown)}" if shown else text


def report_headline(findings: Sequence[Finding], n_workers: int, fallback: str) -> str:
    """The report's headline: the first finding's title and "(+N more)" (naming the costliest
    finding where it is not the first: ``ranking.more_tail``), at most 120 characters."""
    if not findings:
        return fit(fallback)
    more = more_tail(findings)
    first = findings[0]
    if len(first.headline) + len(more) <= MAX_TITLE_CHARS:
        return first.headline + more
    return title_of(first, n_workers, MAX_TITLE_CHARS - len(more))[0] + more


def slowdown_bound_note(f: Finding, trigger: Detection | None) -> str:
    """Why a finding's saving exceeds what the detected slowdown cost a slow step ("" where it does
    not, or no detection says): a step slowed by ratio r loses 1 - 1/r of itself to the slowdown, so
    removing the slowdown alone saves at most that (issue 47: the README's 'saves ~57%' under a
    '+88%' trigger line, whose bound is 47%)."""
    ratio = None if trigger is None else (trigger.ratio_when_sent or trigger.ratio)
    if ratio is None or ratio <= 1.0 or f.saves_share <= 0 or f.kind == "common":
        return ""
    bound = 1.0 - 1.0 / ratio
    if f.saves_share <= bound + SAY_BOUND:
        return ""
    base = f" over {trigger.baseline_ms:.3g} ms" if trigger is not None and trigger.baseline_ms else ""
    return (f"bound: the detector saw the step +{pct(ratio - 1.0)}{base}, so removing that slowdown saves at most "
            f"{pct(bound)} of a slow step; this saving ({pct(f.saves_share)}) is larger: it also counts time the "
            "step lost before the slowdown, or the estimate is too high")


SAY_BOUND = 0.01  # a saving this far past the slowdown's bound is said to be past it


def with_slowdown_bound(report: Report) -> Report:
    """``report`` with ``slowdown_bound_note`` on each finding whose saving passes the detection's bound
    (the detection is known once the session's record is joined to the report)."""
    findings = list(report.findings)
    changed = False
    for i, f in enumerate(findings):
        note = slowdown_bound_note(f, report.trigger)
        if note and note not in f.evidence:
            findings[i] = dataclasses.replace(f, evidence=f.evidence + (note,))
            changed = True
    return dataclasses.replace(report, findings=tuple(findings)) if changed else report


def dress_report(report: Report, n_workers: int, samples: bool = True) -> Report:
    """``report`` with every finding dressed, the culprit's longest-step note and the headline."""
    findings = [dress(f, n_workers, samples) for f in report.findings]
    if findings:
        note = longest_step_note(findings[0], report.iteration_ms)
        if note:
            findings[0] = dataclasses.replace(findings[0], evidence=findings[0].evidence + (note,))
    for i in range(1, len(findings)):
        note = order_note(findings[i], findings[:i])
        if note:
            findings[i] = dataclasses.replace(findings[i], evidence=findings[i].evidence + (note,))
    quiet = quiet_headline(n_workers, [(t.label or t.key, t.median.beta) for t in report.top_functions])
    if n_workers == 1 and not findings:
        quiet = report.summary  # the only rank: its summary says there was nothing to compare
    return dataclasses.replace(report, findings=tuple(findings), headline=report_headline(findings, n_workers, quiet))
