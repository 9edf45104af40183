"""Renderers: text (rich), JSON (+ JSON Schema), self-contained HTML."""

from __future__ import annotations

import io
import json
import re
from html.parser import HTMLParser

import jsonschema
import pytest
from perftracker.localizer.render import html as html_render
from perftracker.localizer.render import json as json_render
from perftracker.localizer.render import text as text_render
from report_samples import SLOW_RANK, clean_report, hang_report, slow_compute_report

from perftracker.model import Report


def _text(report: Report, **kw: object) -> str:
    buf = io.StringIO()
    text_render.render(report, buf, **kw)  # type: ignore[arg-type]
    return buf.getvalue()


def _html(report: Report) -> str:
    buf = io.StringIO()
    html_render.render(report, buf)
    return buf.getvalue()


# ---------------------------------------------------------------------------------------------- text


def test_text_header_and_findings_grouped_by_function() -> None:
    report = slow_compute_report()
    out = _text(report, width=200)
    assert "\x1b[" not in out  # no color codes when writing to a file
    trigger = "slowdown at iteration 850 (+106% over 101.0 ms), detected on rank 3"  # the typed detection, formatted
    for needle in (report.job, report.session, "20 s", trigger, "ranks reported", "0-7 (8)"):
        assert needle in out, needle
    # one panel per function, titled with category and label, in report order
    assert re.search(r"compute\s+aten::addmm", out)
    assert out.index("aten::addmm") < out.index("gloo:all_reduce")
    # sentence, test, compressed ranks
    assert report.findings[0].sentence in out
    assert "test differential" in out and "test expectation" in out
    assert "ranks 0-2,4-7 (7)" in out
    # the pattern table: observed vs median vs expected range
    row = next(line for line in out.splitlines() if "\u03b2 critical share" in line and "0.620" in line)
    assert "0.290" in row and "[0, 1]" in row
    row2 = next(line for line in out.splitlines() if "\u03b2 critical share" in line and "[0, 0.15]" in line)
    assert "0.310" in row2
    assert "No abnormal functions" not in out


def test_text_two_findings_on_one_function_share_one_panel() -> None:
    report = slow_compute_report()
    f0 = report.findings[0]
    extra = type(f0)(**{**f0.__dict__, "ranks": (5,), "sentence": "rank 5: a second finding on addmm"})
    report = type(report)(**{**report.__dict__, "findings": (f0, extra, report.findings[1])})
    out = _text(report, width=200)
    assert out.count("compute  aten::addmm") == 1
    assert "rank 5: a second finding on addmm" in out


def test_text_no_findings_lists_top_functions_and_missing_ranks() -> None:
    report = clean_report()
    out = _text(report, width=160)
    assert "No abnormal functions." in out
    assert "top critical-path functions" in out
    for t in report.top_functions:
        assert t.label in out
    assert "0.410" in out and "0.930" in out
    assert re.search(r"ranks missing\s+3 \(1\)", out)


def test_text_hang_table_groups_ranks_by_state() -> None:
    out = _text(hang_report(), width=200)
    lines = out.splitlines()
    culprit = next(line for line in lines if "culprit" in line)
    assert re.search(r"culprit\s+2\s", culprit) and "load_batch" in culprit
    waiting = next(line for line in lines if "waiting" in line)
    assert "0-1,3-5,7" in waiting and "allreduce" in waiting
    silent = next(line for line in lines if "silent" in line)
    assert "process stopped" in silent
    assert out.index("culprit") < out.index("waiting")  # culprit first
    assert "No abnormal functions" not in out


def test_text_color_when_asked() -> None:
    out = _text(slow_compute_report(), color=True)
    assert "\x1b[" in out


# ---------------------------------------------------------------------------------------------- json


@pytest.mark.parametrize("make", [slow_compute_report, clean_report, hang_report])
def test_json_round_trips_and_validates_against_schema(make) -> None:  # type: ignore[no-untyped-def]
    report = make()
    buf = io.StringIO()
    json_render.render(report, buf)
    data = json.loads(buf.getvalue())
    jsonschema.Draft202012Validator(json_render.load_schema()).validate(data)
    assert Report.from_dict(data) == Report.from_dict(report.to_dict())


def test_schema_rejects_bad_documents() -> None:
    validator = jsonschema.Draft202012Validator(json_render.load_schema())
    good = slow_compute_report().to_dict()
    bad_beta = json.loads(json.dumps(good))
    bad_beta["findings"][0]["observed"]["beta"] = 1.5
    missing = json.loads(json.dumps(good))
    del missing["session"]
    bad_cat = json.loads(json.dumps(good))
    bad_cat["findings"][0]["category"] = "gpu"
    extra = json.loads(json.dumps(good))
    extra["surprise"] = 1
    for doc in (bad_beta, missing, bad_cat, extra):
        assert not validator.is_valid(doc)
    assert validator.is_valid(good)


# ---------------------------------------------------------------------------------------------- html


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _parse(doc: str) -> _Collector:
    c = _Collector()
    c.feed(doc)
    return c


def test_html_is_self_contained() -> None:
    for report in (slow_compute_report(), clean_report(), hang_report()):
        doc = _html(report)
        parsed = _parse(doc)
        names = {t for t, _ in parsed.tags}
        assert "script" not in names and "link" not in names and "img" not in names and "iframe" not in names
        for _tag, attrs in parsed.tags:
            for k, v in attrs.items():
                if k in ("src", "href") and v:
                    raise AssertionError(f"external reference {k}={v}")
        assert "http://" not in doc.replace('xmlns="http://www.w3.org/2000/svg"', "")
        assert "https://" not in doc and "@import" not in doc and "url(" not in doc


def test_html_finding_scatter_highlights_abnormal_ranks() -> None:
    report = slow_compute_report()
    doc = _html(report)
    parsed = _parse(doc)
    text = " ".join(parsed.text)
    assert report.findings[0].sentence in text
    assert report.summary in text
    svgs = doc.count("<svg")
    assert svgs == len(report.findings) + 1  # one scatter per finding + the iteration series
    first = doc[doc.index("<svg") : doc.index("</svg>")]
    circles = re.findall(r'<circle cx="[^"]+" cy="[^"]+" r="[^"]+" fill="([^"]+)"[^>]*><title>rank (\d+):', first)
    assert len(circles) == len(report.findings[0].points)
    red = {int(rank) for color, rank in circles if color == html_render.ABNORMAL}
    assert red == {SLOW_RANK}
    assert f">rank {SLOW_RANK}</text>" in first
    # the slow rank sits lower (less utilization) and further right (more critical path) than the rest
    pos = {int(r): (float(x), float(y)) for x, y, r in re.findall(r'<circle cx="([^"]+)" cy="([^"]+)" r="[^"]+" fill="[^"]+"[^>]*><title>rank (\d+):', first)}
    others = [v for r, v in pos.items() if r != SLOW_RANK]
    assert all(pos[SLOW_RANK][0] > x and pos[SLOW_RANK][1] > y for x, y in others)


def test_html_escapes_untrusted_text() -> None:
    report = slow_compute_report()
    f0 = report.findings[0]
    evil = type(f0)(**{**f0.__dict__, "key": "<script>alert(1)</script>", "label": "<b>x</b>", "sentence": "a < b & <i>c</i>"})
    report = type(report)(**{**report.__dict__, "findings": (evil,), "job": "<img src=x>"})
    doc = _html(report)
    assert "<script>" not in doc and "<img" not in doc and "<i>c</i>" not in doc
    assert "a &lt; b &amp; &lt;i&gt;c&lt;/i&gt;" in doc


def test_html_hang_table_and_no_findings() -> None:
    doc = _html(hang_report())
    assert "Ranks by state" in doc
    assert 'class="state-culprit">culprit</td><td class="nw">2</td>' in doc
    assert "0-1,3-5,7" in doc
    clean = _html(clean_report())
    assert "No abnormal functions" in clean and "_single_tensor_sgd" in clean
    assert clean.count("<svg") == 1  # iteration series only


def test_html_iteration_series_draws_every_rank() -> None:
    report = slow_compute_report()
    doc = _html(report)
    lines = re.findall(r'<polyline points="([^"]+)" fill="none" stroke="([^"]+)"[^>]*><title>rank (\d+)</title>', doc)
    assert {int(r) for _, _, r in lines} == set(report.iteration_ms)
    for pts, color, r in lines:
        assert len(pts.split()) == len(report.iteration_ms[int(r)])
        assert (color == html_render.ABNORMAL) == (int(r) == SLOW_RANK)


# ---------------------------------------------------------------------------------------------- real output


def _real_reports() -> list[Report]:
    """Reports made by the real localizer: synthetic patterns with a throttled rank, a clean job,
    and a hang from snapshots."""
    import time

    import numpy as np
    from perftracker.localizer.diagnose.incidents.hang import localize_hang
    from perftracker.localizer.diagnose.localize import localize

    from bench.synthetic import inject_throttled_compute, simulate_job, to_pattern_sets
    from perftracker.model import Frame, HangSnapshot

    slow = simulate_job(32, seed=3)
    inject_throttled_compute(slow, np.array([13]))
    clean = simulate_job(16, seed=4)
    now = time.time_ns()
    wait = (Frame("perftracker/examples/train.py", 97, "train_step"), Frame("<lib>/torch/autograd/graph.py", 823, "_engine_run_backward"))
    snaps = [HangSnapshot("j", r, 4, "h", 100 + r, now, 311, 62.0, wait, kernel_state="S futex_do_wait") for r in (0, 1, 3)]
    snaps.append(HangSnapshot("j", 2, 4, "h", 102, now, 311, 63.0, (Frame("perftracker/examples/train.py", 74, "load_batch"),),
                              current_op="time.sleep", kernel_state="S hrtimer_nanosleep"))
    hang = localize_hang(snaps, {}, [0, 1, 2, 3], now_ns=now)
    assert hang is not None
    return [localize(to_pattern_sets(slow)), localize(to_pattern_sets(clean)), hang]


def test_real_localizer_output_validates_and_renders() -> None:
    validator = jsonschema.Draft202012Validator(json_render.load_schema())
    slow, clean, hang = _real_reports()
    assert slow.findings and not clean.findings and hang.hang_states
    for report in (slow, clean, hang):
        buf = io.StringIO()
        json_render.render(report, buf)
        errors = sorted(validator.iter_errors(json.loads(buf.getvalue())), key=str)
        assert not errors, errors[0]
        text = _text(report, width=160)
        assert report.session in text
        doc = _html(report)
        assert report.summary and _parse(doc)  # parses
    assert "13" in _text(slow, width=200) and "rank 13</text>" in _html(slow)
    assert "No abnormal functions." in _text(clean)
    assert "culprit" in _text(hang, width=200)


def test_long_frame_paths_are_shortened_for_display_only() -> None:
    from perftracker.localizer.render import short_frame

    long = "/usr/lib/python3.11/site-packages/torch/autograd/graph.py(966): _engine_run_backward"
    assert short_frame(long) == "graph.py(966): _engine_run_backward"
    assert short_frame("/a/train.py(1): <module>;/a/b/train.py(243): main") == "train.py(1): <module>;train.py(243): main"
    for same in ("aten::addmm", "gloo:all_reduce", "<frozen importlib._bootstrap>(1165): _find_and_load", "## backward ##"):
        assert short_frame(same) == same
    report = slow_compute_report()
    f0 = report.findings[0]
    f = type(f0)(**{**f0.__dict__, "key": "/x/train.py(1): <module>;" + long, "label": long})
    report = type(report)(**{**report.__dict__, "findings": (f,)})
    out = _text(report, width=200)
    assert "graph.py(966): _engine_run_backward" in out and "site-packages" not in out
    doc = _html(report)
    assert f'title="/x/train.py(1): &lt;module&gt;;{long}"' in doc  # the full key stays available
    assert "<span>graph.py(966): _engine_run_backward</span>" in doc
    assert Report.from_dict(json.loads(json.dumps(report.to_dict()))).findings[0].key.endswith(long)  # JSON untouched


def test_html_says_when_the_plot_is_a_sample() -> None:
    report = slow_compute_report()
    assert "The plot shows" not in _html(report)  # all 8 ranks plotted
    f0 = report.findings[0]
    few = type(f0)(**{**f0.__dict__, "points": f0.points[:5]})
    report = type(report)(**{**report.__dict__, "findings": (few,)})
    assert "The plot shows 5 of 8 ranks" in _html(report)
