"""Issue 47 / issue 48 item 4: one module ranks findings, renderers never reorder, labels identify,
the evidence agrees with the headline (one denominator, saving within the cost, whole rank lists)."""

from __future__ import annotations

import dataclasses
import io
import json
import re

from perftracker.localizer.diagnose.evidence.host_bound import HOST_KEY
from perftracker.localizer.diagnose.verdict.group_findings import MOVING_KEY
from perftracker.localizer.diagnose.verdict.ranking import (
    at_least_saving,
    finding_tier,
    more_tail,
    order_note,
    rank,
)
from perftracker.localizer.diagnose.words.headline import dress, dress_report, evidence_of
from perftracker.localizer.diagnose.words.labels import distinct_labels
from perftracker.localizer.render import write

from perftracker.model import Box, Category, Finding, Report, Triple, Wait

OPEN = Box(Triple(0, 0, 0), Triple(1, 1, 1))
MATERIAL = 0.05


def _f(key: str, *, ranks: tuple[int, ...] = (2,), kind: str = "specific", tests: tuple[str, ...] = ("differential",),
       impact: float = 0.1, saves: float = 0.0, label: str = "", waits: tuple[Wait, ...] = (),
       beta: float = 0.2, median: float = 0.05) -> Finding:
    return Finding(key=key, label=label or key, category=Category.COMPUTE, ranks=ranks, kind=kind, tests=tests,
                   observed=Triple(beta, 0.0, 0.0), median=Triple(median, 0.0, 0.0), expected=OPEN,
                   sentence=f"rank 2: {key} — more work or a slower GPU on these ranks (load imbalance)",
                   impact=impact, impact_s=impact, waits=waits, saves_share=saves, saves_s=saves)


def test_a_material_rank_specific_cause_leads_a_costlier_common_one_and_the_tail_says_so() -> None:
    specific = _f("a", impact=0.098, saves=0.094)
    common = _f("b", ranks=tuple(range(8)), kind="common", tests=("expectation",), impact=0.44, saves=0.44)
    small = _f("c", ranks=(7,), impact=0.013)  # below the material share: tier 1
    ordered = rank([small, common, specific], MATERIAL)
    assert [f.key for f in ordered] == ["a", "b", "c"]
    assert [finding_tier(f, MATERIAL) for f in ordered] == [0, 1, 1]
    assert more_tail(ordered) == " (+2 more; #2 costs 44%)"
    assert "holds on most ranks" in order_note(ordered[1], ordered[:1])
    assert order_note(ordered[2], ordered[:2]) == ""  # cheaper than everything above it
    # the headline's finding is the costliest: the tail says only how many more
    assert more_tail(rank([specific, small], MATERIAL)) == " (+1 more)"
    assert more_tail([specific]) == ""


def test_equal_tiers_go_by_cost_and_a_saving_counts_as_cost() -> None:
    a = _f("a", impact=0.15, saves=0.0)
    b = _f("b", impact=0.12, saves=0.16)  # the step records saw more than the estimate
    ordered = rank([a, b], MATERIAL)
    assert [f.key for f in ordered] == ["b", "a"]
    assert ordered[0].impact == 0.16  # a saving never exceeds the cost
    assert at_least_saving(a) is a
    # just below and just above: the order flips where the saving crosses the other's impact
    assert [f.key for f in rank([a, _f("b", impact=0.12, saves=0.149)], MATERIAL)] == ["a", "b"]
    assert [f.key for f in rank([a, _f("b", impact=0.12, saves=0.151)], MATERIAL)] == ["b", "a"]


def test_the_impact_line_says_when_it_is_the_saving() -> None:
    raised = at_least_saving(_f("m", impact=0.15, saves=0.16))
    lines = evidence_of(raised, 8)
    impact = next(line for line in lines if line.startswith("impact:"))
    assert "what fixing it saves" in impact
    saves = next(line for line in lines if line.startswith("saves:"))
    assert "of the window" in saves and "of the step" not in saves
    plain = evidence_of(_f("m", impact=0.15, saves=0.1), 8)
    assert any(line.startswith("impact:") and "the most one rank loses to it" in line for line in plain)


def test_a_finding_on_every_rank_never_says_the_others_wait() -> None:
    f = _f(MOVING_KEY, ranks=tuple(range(64)), kind="random", tests=("waits",), impact=0.15)
    lines = evidence_of(f, 64)
    assert not any("the others wait" in line for line in lines)
    assert not any("the ranks that wait" in line for line in lines)
    some = evidence_of(dataclasses.replace(f, ranks=tuple(range(1, 64, 2))), 64)
    assert any("the others wait for these ranks" in line for line in some)


def test_rank_lists_in_the_evidence_are_whole() -> None:
    odd = tuple(range(1, 64, 2))
    f = _f("k", ranks=odd, tests=("waits",), waits=(Wait("SendRecv", tuple(range(0, 64, 2)), 0.24),))
    text = "\n".join(evidence_of(f, 64))
    assert ",".join(str(r) for r in odd) in text
    assert ",".join(str(r) for r in range(0, 64, 2)) in text
    assert "…" not in text


def test_a_made_pattern_is_described_not_shown_by_its_key() -> None:
    f = dataclasses.replace(_f(HOST_KEY, ranks=tuple(range(8)), kind="common", tests=("expectation",)),
                            label="GPU waits for the host", category=Category.PYTHON)
    lines = evidence_of(f, 8)
    assert not any(line.startswith("function:") for line in lines)
    assert lines[0].startswith("measure: the GPU waits for the host")
    assert evidence_of(_f("aten::mm"), 8)[0] == "function: compute aten::mm"


def test_two_call_paths_of_one_function_get_labels_that_tell_them_apart() -> None:
    keys = ["## forward ##;DDP.forward", "## forward ##;DDP.forward;DDP.forward", "x.py(3): main;y.py(9): step",
            "aten::mm"]
    labels = ["DDP.forward", "DDP.forward", "step", "aten::mm"]
    assert distinct_labels(keys, labels) == ["DDP.forward from ## forward ##", "DDP.forward from DDP.forward",
                                             "step", "aten::mm"]
    # the same key twice is one call path: no caller added
    assert distinct_labels(["a;f", "a;f"], ["f", "f"]) == ["f", "f"]
    # callers that agree one level up: the next level tells them apart
    assert distinct_labels(["a;m;f", "b;m;f"], ["f", "f"]) == ["f from m from a", "f from m from b"]


def _report(findings: list[Finding]) -> Report:
    return Report(job="j", session="s-1", kind="slowdown", created_ns=1, trigger_reason="t", window_s=1.0,
                  ranks_reported=tuple(range(8)), findings=tuple(findings))


def test_every_renderer_lists_the_findings_in_the_reports_order() -> None:
    """Two findings of one function around another: the terminal used to print both under one panel,
    so #3 came second there and third in JSON and HTML."""
    findings = [dress(f, 8) for f in (_f("aten::mm", ranks=(2,), impact=0.3), _f("aten::bmm", ranks=(5,), impact=0.2),
                                       _f("aten::mm", ranks=(6,), impact=0.1))]
    report = dress_report(_report(findings), 8)
    titles = [f.title for f in report.findings]
    out = {}
    for fmt in ("text", "json", "html"):
        buf = io.StringIO()
        write(report, fmt, buf, **({"width": 200} if fmt == "text" else {}))
        out[fmt] = buf.getvalue()
    got_json = [f["title"] for f in json.loads(out["json"])["findings"]]
    assert got_json == titles
    for fmt in ("text", "html"):
        where = [out[fmt].find(t) for t in titles[1:]]
        assert all(w >= 0 for w in where), (fmt, where)
        assert where == sorted(where), fmt
    numbers = [int(n) for n in re.findall(r"#(\d) ", out["text"])]
    assert numbers == [2, 3]


def test_unmeasured_mu_and_sigma_are_null_and_read_back() -> None:
    """Offline traces without samples: μ, σ null in the JSON (not 0.0), read back as a Report equal to it;
    a report with one measured μ keeps its numbers; a finding's spread is its own field."""
    import jsonschema
    from perftracker.localizer.render.json import load_schema

    f = dataclasses.replace(_f("aten::mm"), points=((2, 0.2, 0.0), (3, 0.05, 0.0)))
    offline = dataclasses.replace(_report([f]), kind="offline")
    d = offline.to_dict()
    jsonschema.validate(d, load_schema())
    g = d["findings"][0]
    assert g["observed"]["mu"] is None and g["median"]["sigma"] is None and g["points"][0][2] is None
    assert g["expected"]["hi"]["mu"] == 1  # configured, not measured: kept
    assert g["spread"] == g["kind"] == "specific" and d["kind"] == "offline"
    assert Report.from_dict(d) == offline and not offline.samples_measured
    measured = dataclasses.replace(offline, findings=(dataclasses.replace(f, observed=Triple(0.2, 0.4, 0.0)),))
    assert measured.samples_measured and measured.to_dict()["findings"][0]["median"]["mu"] == 0.0
    live = _report([f])  # a window always measures (0 is a measured 0)
    assert live.to_dict()["findings"][0]["observed"]["mu"] == 0.0


def _hex6(c: str) -> str:
    return c if len(c) == 7 else "#" + "".join(ch * 2 for ch in c[1:])


def test_every_html_label_meets_wcag_aa_contrast() -> None:
    """White labels on the green and grey lanes failed AA (3.2 and 1.7); every text colour of the page
    and of its charts, on what it is drawn on, is now at least 4.5:1."""
    from perftracker.localizer.render import html

    from perftracker.model import Lane

    lanes = tuple(Lane(r, "culprit" if r == 2 else "typical", 100.0,
                       tuple((name, 20.0) for name in html._PART_COLORS)) for r in (2, 3))
    f = dataclasses.replace(_f("aten::mm"), points=((2, 0.2, 0.5), (3, 0.05, 0.4)),
                            expected=Box(Triple(0, 0, 0), Triple(0.1, 0.9, 1)))
    report = dataclasses.replace(_report([dress(f, 8)]), step_lanes=lanes,
                                 iteration_ms={2: (10.0, 20.0, 21.0), 3: (10.0, 11.0, 10.5)})
    buf = io.StringIO()
    html.render(report, buf)
    page = buf.getvalue()
    on_bar = re.findall(r'<rect [^>]*fill="(#[0-9a-f]{6})"><title>[^<]*</title></rect><text [^>]*style="fill:(#[0-9a-f]{6})"',
                        page)
    assert len(on_bar) == 2 * len(html._PART_COLORS), on_bar  # every part of both lanes is labelled
    for bg, fg in on_bar:
        assert html.contrast(fg, bg) >= 4.5, (fg, bg)
    on_white = [c for c in re.findall(r'<text [^>]*style="fill:(#[0-9a-f]{6})', page)
                if not any(c == fg for _, fg in on_bar)]
    on_white += [html.ABNORMAL, html.NORMAL, "#333333"]  # the chart labels' own colours and the default
    for fg in on_white:
        assert html.contrast(fg, "#ffffff") >= 4.5, fg
    css = dict(re.findall(r"--(\w+):(#[0-9a-f]{3,6})", html._CSS))
    bg_page = _hex6(css["bg"])
    for name in ("fg", "muted", "bad"):
        for bg in ("#ffffff", bg_page):
            assert html.contrast(_hex6(css[name]), bg) >= 4.5, (name, bg)
    chip_red = re.search(r"\.chips span\.r \{ background: (#[0-9a-f]{6}); color: (#[0-9a-f]{6})", html._CSS)
    assert chip_red is not None and html.contrast(chip_red.group(2), chip_red.group(1)) >= 4.5
    for state in re.findall(r"\.state-\w+ \{ color: (#[0-9a-f]{6})", html._CSS):
        assert html.contrast(state, "#ffffff") >= 4.5, state
    # the check can fail: the old white on the communication lane
    assert html.contrast("#ffffff", "#31a354") < 4.5


def test_an_offline_report_draws_no_empty_iteration_chart() -> None:
    from perftracker.localizer.render import html

    one = dataclasses.replace(_report([]), kind="offline", iteration_ms={0: (14.5,), 1: (19.9,)})
    buf = io.StringIO()
    html.render(one, buf)
    page = buf.getvalue()
    assert "No chart: each rank has one step" in page and "polyline" not in page and "trigger →" not in page
    many = dataclasses.replace(one, iteration_ms={0: (14.5, 15.0), 1: (19.9, 20.1)})
    buf = io.StringIO()
    html.render(many, buf)
    assert "polyline" in buf.getvalue() and "trigger →" not in buf.getvalue()
    live = dataclasses.replace(many, kind="slowdown")
    buf = io.StringIO()
    html.render(live, buf)
    assert "trigger →" in buf.getvalue()


def test_a_saving_past_the_detected_slowdown_says_why() -> None:
    """A step slowed +88% loses 47% of itself to the slowdown: a 'saves 57%' under that trigger line
    (the README's demo) now says why it is larger; at 46% it says nothing."""
    from perftracker.localizer.diagnose.words.headline import (
        slowdown_bound_note,
        with_slowdown_bound,
    )

    from perftracker.model.trigger import Detection

    det = Detection(rank=2, reason="slowdown", ratio=1.88, baseline_ms=42.9)
    past = _f("aten::bmm", impact=0.6, saves=0.57)
    note = slowdown_bound_note(past, det)
    assert note.startswith("bound: the detector saw the step +88% over 42.9 ms") and "at most 47%" in note
    assert slowdown_bound_note(dataclasses.replace(past, saves_share=0.46), det) == ""
    assert slowdown_bound_note(dataclasses.replace(past, saves_share=0.475), det) == ""  # within 1 point
    assert slowdown_bound_note(past, None) == ""
    report = dataclasses.replace(_report([past]), trigger=det)
    assert with_slowdown_bound(report).findings[0].evidence[-1] == note
    assert with_slowdown_bound(with_slowdown_bound(report)) == with_slowdown_bound(report)  # said once
