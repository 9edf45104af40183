"""Issue 33, the pure parts: safe text output (items 4, 5 and U+202E), the one name pattern (items 7
and 10), bounded and checked Kineto input (items 8 and 9) and report files with bad numbers (minor).
Each case has one input that must be refused or escaped and one that must pass unchanged."""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import math
from pathlib import Path

import pytest
from perftracker.agent.daemon.helper_processes import ProcessingError
from perftracker.agent.daemon.window_session import session_dir_name
from perftracker.agent.kineto import (
    MAX_RANK,
    RankInfo,
    load_trace_json,
    rank_from_filename,
    resolve_rank,
    trace_max_bytes,
    window_from_trace,
)
from perftracker.localizer.render import write
from perftracker.localizer.service.validate import RequestError, parse_name, parse_registration
from report_samples import hang_report, slow_compute_report

from perftracker.errors import ConfigError, SchemaError, TraceError
from perftracker.model import Report
from perftracker.model.names import check_name, is_name, safe_text

OSC52 = "\x1b]52;c;cm0gLXJmIH4=\x07"  # write "rm -rf ~" to the clipboard
TITLE = "\x1b]0;PWNED\x07"  # set the window title
RLO = "\u202e"  # right-to-left override
CONTROLS = (OSC52, TITLE, RLO, "\x9b31m", "\x7f", "\u2066")


# ---------------------------------------------------------------- the sanitizer
def test_safe_text_shows_control_characters_and_bidi_overrides_as_escapes() -> None:
    assert safe_text(f"a{OSC52}b") == "a\\x1b]52;c;cm0gLXJmIH4=\\x07b"
    assert safe_text(f"x{RLO}y\u2069z") == "x\\u202ey\\u2069z"
    assert safe_text("\x9b\x7f\x00") == "\\x9b\\x7f\\x00"
    assert safe_text("a\tb\nc") == "a\\x09b\\x0ac"
    assert safe_text("a\tb\nc\x1b", newlines=True) == "a\tb\nc\\x1b"
    for ok in ("model.forward[/layer]", "β=0.31 μ=0.9 σ≈0", "aten::addmm", "ncclKernel<float>", "数据加载", "",
               "\u200d\u00e9"):
        assert safe_text(ok) == ok  # ordinary text (markup-like brackets, Greek, CJK, joiners) untouched


# ---------------------------------------------------------------- the one name pattern (items 7, 10)
def test_names_fully_match_one_pattern_without_a_trailing_newline() -> None:
    for ok in ("teama-x", "20261122-125301-7f3a", "s-20261122-125301-7f3a", "job:1@a+b=c_d.e", "x" * 200, "..."):
        assert is_name(ok) and check_name(ok, "job") == ok
    for bad in ("teama-x\n", "../../pwn/planted-by-localizer", "a/b", ".", "..", "", "x" * 201, "a b", "a\x1b",
                f"a{RLO}", None, 3):
        assert not is_name(bad)
        with pytest.raises(SchemaError, match="not a valid name"):
            check_name(bad, "session id")
    with pytest.raises(ProcessingError):  # the agent: a session id becomes a directory name
        session_dir_name("s1\n")
    assert session_dir_name("s1") == "s1"


def test_the_agent_checks_worker_names_with_the_same_full_match() -> None:
    from perftracker.agent.daemon.workers import BadWorkerMessage, check_worker_message

    reg = {"type": "register", "protocol": 1, "job": "teama-x", "rank": 0, "world_size": 1, "local_rank": 0,
           "pid": 5, "training_tid": 5, "host": "h"}
    done = {"type": "window_done", "session": "s1", "raw_path": "/x", "start_ns": 0, "end_ns": 1, "error": ""}
    check_worker_message(reg)
    check_worker_message(done)
    for bad in ({**reg, "job": "teama-x\n"}, {**reg, "job": "team/a"}, {**done, "session": "s1\n"},
                {**done, "session": ".hidden"}):
        with pytest.raises(BadWorkerMessage):
            check_worker_message(bad)


def test_the_service_refuses_a_job_name_with_a_trailing_newline() -> None:
    body = {"job": "teama-x", "agent_id": "a", "host": "n",
            "workers": [{"rank": 0, "local_rank": 0, "world_size": 1, "pid": 1, "tid": 1, "host": "n"}]}
    assert parse_registration(body).job == "teama-x"
    with pytest.raises(RequestError, match="not a valid name"):
        parse_registration({**body, "job": "teama-x\n"})
    with pytest.raises(RequestError, match="not a valid name"):
        parse_name("s1\n", "session")
    assert parse_name("s1", "session") == "s1"


# ---------------------------------------------------------------- safe output (items 4, 5, U+202E)
def _hostile_report() -> Report:
    r = slow_compute_report()
    f = r.findings[0]
    name = f"model.forward[/layer]{TITLE}"
    f = dataclasses.replace(f, key=name, label=name, sentence=f"rank 3 is slow in {name} {RLO}cba")
    hostile = f"loss spiked [/x] {OSC52} {RLO}evil"
    trigger = dataclasses.replace(r.trigger, reason=hostile) if r.trigger is not None else None  # what is shown
    return dataclasses.replace(r, trigger_reason=hostile, trigger=trigger, job=f"job{RLO}",
                               findings=(f, *r.findings[1:]))


@pytest.mark.parametrize("report", [_hostile_report(), hang_report()], ids=["hostile", "hang"])
def test_text_report_to_a_file_escapes_controls_and_never_reads_markup(report: Report) -> None:
    out = io.StringIO()
    write(report, "text", out)  # what `report ... -o r.txt` does: the renderer's own Console
    text = out.getvalue()
    assert not any(c in text for c in ("\x1b", "\x07", RLO, "\x9b"))
    if report.trigger_reason.startswith("loss"):
        assert "loss spiked [/x] \\x1b]52;c;cm0gLXJmIH4=\\x07 \\u202eevil" in text
        assert "model.forward[/layer]\\x1b]0;PWNED\\x07" in text  # the name, as it is: no MarkupError
    else:
        assert "rank 2" in text and "\\x" not in text  # an ordinary report is unchanged


def test_text_report_on_the_cli_console_escapes_controls() -> None:
    from perftracker.cli import output

    buf = io.StringIO()
    con = output.console(file=buf)
    write(_hostile_report(), "text", buf, console=con)
    con.print(f"a str printed by a command: {OSC52}[/x]")
    text = buf.getvalue()
    assert "\x1b]" not in text and RLO not in text
    assert "a str printed by a command: \\x1b]52;c;cm0gLXJmIH4=\\x07[/x]" in text


def test_html_report_shows_bidi_overrides_and_controls() -> None:
    out = io.StringIO()
    write(_hostile_report(), "html", out)
    page = out.getvalue()
    assert RLO not in page and "\x1b" not in page
    assert "\\u202eevil" in page and "model.forward[/layer]\\x1b]0;PWNED\\x07" in page
    clean = io.StringIO()
    write(slow_compute_report(), "html", clean)
    assert "\\x" not in clean.getvalue() and "aten::addmm" in clean.getvalue()


# ---------------------------------------------------------------- report files (minor findings)
def _report_file(tmp_path: Path, **changes: object) -> Path:
    d = {**slow_compute_report().to_dict(), **changes}
    p = tmp_path / "r.json"
    p.write_text(json.dumps(d))
    return p


@pytest.mark.parametrize("changes, match", [
    ({"ranks_reported": ["x"]}, r"ranks_reported\[0\]: expected an integer"),
    ({"ranks_missing": [1.5]}, r"ranks_missing\[0\]: expected an integer"),
    ({"iteration_ms": {"0": [math.nan]}}, "NaN is not a number"),
    ({"iteration_ms": {"0": ["nan"]}}, r"iteration_ms\[0\]\[0\]: expected a finite number"),
    ({"iteration_ms": {"x": [1.0]}}, "iteration_ms"),
])
def test_report_file_with_bad_numbers_is_a_schema_error(tmp_path: Path, changes: dict[str, object],
                                                       match: str) -> None:
    # `report --file` reads it (its one error line on the command line: the component tests)
    from perftracker.cli.report import _from_file

    with pytest.raises(SchemaError, match=match):
        _from_file(_report_file(tmp_path, **changes), "latest")


def test_a_good_report_file_still_reads(tmp_path: Path) -> None:
    from perftracker.cli.report import _from_file

    good = slow_compute_report().to_dict()
    assert _from_file(_report_file(tmp_path), "latest").to_dict() == good
    assert Report.from_dict(good).to_dict() == good


# ---------------------------------------------------------------- Kineto input (items 8, 9)
def _trace(rank: int = 1, **first_kernel: object) -> dict[str, object]:
    events: list[dict[str, object]] = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 7, "tid": 7, "ts": 1000.0, "dur": 900.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 7, "ts": 1010.0, "dur": 100.0},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 1100.0, "dur": 300.0,
         "args": {"device": 0}},
        {"ph": "X", "cat": "kernel", "name": "nccl:all_reduce", "pid": 0, "tid": 8, "ts": 1500.0, "dur": 200.0,
         "args": {"device": 0}},
    ]
    events[2].update(first_kernel)
    return {"traceEvents": events, "distributedInfo": {"rank": rank, "world_size": 2}}


def _window(doc: dict[str, object], path: Path = Path("rank1.json")):  # type: ignore[no-untyped-def]
    return window_from_trace(doc, path, resolve_rank(doc, path))  # type: ignore[arg-type]


def test_a_sound_trace_gives_its_window() -> None:
    raw = _window(_trace())
    assert (raw.meta.rank, raw.meta.window_start_ns, raw.meta.window_end_ns) == (1, 1_000_000, 1_900_000)
    assert raw.meta.iteration_ms == (0.9,)
    epoch = _trace()  # real traces' times: microseconds since the epoch
    for ev in epoch["traceEvents"]:  # type: ignore[attr-defined]
        ev["ts"] += 1694128201426556.0
    meta = _window(epoch).meta
    assert abs(meta.window_end_ns - meta.window_start_ns - 900_000) < 1000  # float microseconds near 1.7e15


@pytest.mark.parametrize("bad", [
    {"ts": math.nan}, {"ts": math.inf}, {"ts": 1e300}, {"ts": 1e30}, {"ts": 1e18}, {"dur": math.nan},
    {"dur": math.inf}, {"dur": 1e20}, {"tid": 2**70}, {"args": {"device": 40000}},
])
def test_non_finite_or_out_of_range_numbers_make_the_file_a_trace_error(bad: dict[str, object]) -> None:
    with pytest.raises(TraceError, match="rank1.json: .*(out of range|range)"):
        _window(_trace(**bad))


def test_a_negative_duration_drops_that_event_only() -> None:
    """Kineto before pytorch/kineto#646 wrote an unset end as dur = -ts: the event is dropped (and
    counted in a warning, tests/unit/test_kineto_formats.py), the file kept."""
    raw = _window(_trace(dur=-5.0))
    assert len(raw) == 3 and "gemm" not in [raw.names[int(i)] for i in raw.col("name_id")]


def test_a_profiler_step_with_a_nan_duration_is_a_trace_error_not_an_abort() -> None:
    doc = _trace()
    doc["traceEvents"][0]["dur"] = math.nan  # type: ignore[index]
    with pytest.raises(TraceError, match="ProfilerStep#3"):
        _window(doc)
    far = _trace()
    far["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "late", "pid": 7, "tid": 7,  # type: ignore[attr-defined]
                               "ts": 1000.0 + 3 * 86_400e6, "dur": 1.0})
    with pytest.raises(TraceError, match="more than a day"):  # finite, in range, and still a wrong window
        _window(far)


def test_ranks_are_bounded_in_traces_flags_and_file_names() -> None:
    for rank in (10**12, MAX_RANK, -1):
        with pytest.raises(TraceError, match="out of range"):
            resolve_rank(_trace(rank=rank), "t.json")
    with pytest.raises(TraceError, match="world_size"):
        resolve_rank({"traceEvents": [], "distributedInfo": {"rank": 0, "world_size": 10**12}}, "t.json")
    with pytest.raises(TraceError, match="out of range"):
        resolve_rank({"traceEvents": []}, "t.json", rank=10**12)
    assert resolve_rank(_trace(rank=MAX_RANK - 1), "t.json") == RankInfo(MAX_RANK - 1, 2, "distributedInfo")
    assert rank_from_filename("rank999999999999.json") is None
    assert rank_from_filename("node1_rank3.json") == 3


def test_gzip_traces_are_read_up_to_the_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = tmp_path / "rank1.pt.trace.json.gz"
    good.write_bytes(gzip.compress(json.dumps(_trace()).encode()))
    size = len(gzip.decompress(good.read_bytes()))
    assert load_trace_json(good, max_bytes=size)["distributedInfo"] == {"rank": 1, "world_size": 2}
    bomb = tmp_path / "rank2.pt.trace.json.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as fh:
        for _ in range(64):
            fh.write(b" " * 2**20)
    assert bomb.stat().st_size < 200_000
    with pytest.raises(TraceError, match="larger than 1,048,576 bytes after decompression"):
        load_trace_json(bomb, max_bytes=2**20)
    plain = tmp_path / "rank3.json"
    plain.write_text(json.dumps(_trace()) + " " * 100)
    with pytest.raises(TraceError, match="on disk"):
        load_trace_json(plain, max_bytes=size)
    monkeypatch.setenv("PERFTRACKER_TRACE_MAX_BYTES", str(2**20))
    assert trace_max_bytes() == 2**20
    with pytest.raises(TraceError, match="PERFTRACKER_TRACE_MAX_BYTES"):
        load_trace_json(bomb)
    monkeypatch.setenv("PERFTRACKER_TRACE_MAX_BYTES", "lots")
    with pytest.raises(ConfigError, match="PERFTRACKER_TRACE_MAX_BYTES"):
        trace_max_bytes()
    monkeypatch.delenv("PERFTRACKER_TRACE_MAX_BYTES")
    assert trace_max_bytes() == 256 * 2**20
