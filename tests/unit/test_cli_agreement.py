"""Issue 47: flags that work together or are refused with one line (exit 2), formats from the
renderers' registry, one name per concept (old spellings hidden, warned, still working), exit codes,
and `status` showing the sessions."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from perftracker.localizer.render import FORMATS, REGISTRY, format_of_path
from perftracker.localizer.store.records import SessionRecord
from perftracker.localizer.store.sqlite_store import Store

from perftracker.cli import formats, status
from perftracker.cli.exits import EXIT_TIMEOUT, EXIT_USAGE
from perftracker.cli.main import build_parser, main
from perftracker.errors import UsageError
from perftracker.model import Report


def _args(fmt: str | None = None, out: str | None = None, brief: bool = False) -> argparse.Namespace:
    return argparse.Namespace(format=fmt, output=out, brief=brief)


def test_the_format_follows_o_and_a_mismatch_is_refused() -> None:
    assert formats.resolve_format(_args(out="r.html")) == "html"
    assert formats.resolve_format(_args(out="R.JSON")) == "json"
    assert formats.resolve_format(_args(out="r.txt")) == "text"
    assert formats.resolve_format(_args(out="report.out")) == "text"  # a suffix of no format: text
    assert formats.resolve_format(_args()) == "text"
    assert formats.resolve_format(_args("html", "r.html")) == "html"
    assert formats.resolve_format(_args("json", "r.out")) == "json"
    with pytest.raises(UsageError, match="disagree"):
        formats.resolve_format(_args("json", "r.html"))


def test_brief_is_text_or_refused() -> None:
    assert formats.resolve_format(_args(brief=True)) == "text"
    assert formats.resolve_format(_args(brief=True, out="brief.txt")) == "text"
    for a in (_args("json", brief=True), _args("html", brief=True), _args(out="x.json", brief=True)):
        with pytest.raises(UsageError, match="--brief prints text"):
            formats.resolve_format(a)


def test_the_cli_choices_are_the_registry() -> None:
    assert FORMATS == tuple(REGISTRY) == ("text", "json", "html")
    assert format_of_path("a.htm") == "html" and format_of_path("a") is None
    for cmd in ("analyze", "report"):
        parser = build_parser([cmd])
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[cmd]
        fmt = next(a for a in sub._actions if "--format" in a.option_strings)
        assert tuple(fmt.choices) == FORMATS, cmd


def _report_file(tmp_path: Path) -> Path:
    report = Report(job="j", session="s-1", kind="slowdown", created_ns=1, trigger_reason="t", window_s=1.0,
                    ranks_reported=(0, 1))
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report.to_dict()))
    return path


def test_report_o_html_writes_html_and_mismatches_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _report_file(tmp_path)
    out = tmp_path / "out.html"
    assert main(["report", "--file", str(src), "-o", str(out)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert main(["report", "--file", str(src), "--format", "json", "-o", str(tmp_path / "x.html")]) == EXIT_USAGE
    assert not (tmp_path / "x.html").exists()
    assert main(["report", "--file", str(src), "--brief", "--format", "json"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "disagree" in err and "--brief prints text" in err
    # the session named with --file must be the file's (or latest)
    assert main(["report", "--file", str(src), "s-2"]) == 1
    assert main(["report", "--file", str(src), "s-1", "--format", "json"]) == 0


def test_old_spellings_still_work_hidden_and_warned(capsys: pytest.CaptureFixture[str]) -> None:
    agent = build_parser(["agent"])
    args = agent.parse_args(["agent", "--localizer-url", "http://h:1", "--keep-files"])
    assert args.localizer_url == "http://h:1" and args.keep_files is True
    assert "deprecated; use --url" in capsys.readouterr().err
    args = agent.parse_args(["agent", "--url", "http://h:2", "--keep-windows"])
    assert args.localizer_url == "http://h:2" and args.keep_files is True
    demo = build_parser(["demo"])
    assert demo.parse_args(["demo", "--workers", "3"]).workers == 3
    assert demo.parse_args(["demo", "--nproc-per-node", "5"]).workers == 5
    helptext = demo.format_help() + agent.format_help()
    assert "--workers" not in build_parser(["demo"])._subparsers._group_actions[0].choices["demo"].format_help()
    assert "--localizer-url" not in build_parser(["agent"])._subparsers._group_actions[0].choices["agent"].format_help()
    assert helptext


def test_a_trigger_that_times_out_has_its_own_exit_code() -> None:
    from perftracker.cli.trigger import wait_for_report

    class Up:
        def get_session(self, session: str) -> dict[str, object]:
            return {"state": "open", "uploaded": [], "expected": [0], "deadline_ns": 0}

    code, text = wait_for_report(Up(), "s-1", 0.0, Path("/nonexistent"))
    assert code == EXIT_TIMEOUT != EXIT_USAGE and "still open" in text


def test_status_shows_the_newest_sessions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = Store(tmp_path / "localizer.sqlite")
    try:
        for i in range(7):
            store.insert_session(SessionRecord(seq=0, session=f"s-{i}", job="job-a", kind="slowdown",
                                               reason=f"slowdown {i}", window_s=20.0, state="done",
                                               opened_ns=i + 1, deadline_ns=i + 2, expected=(0, 1)))
    finally:
        store.close()
    ns = argparse.Namespace(run_dir=str(tmp_path / "run"), runs_dir=str(tmp_path), format="text")
    assert status.run(ns) == 0
    out = capsys.readouterr().out
    shown = [line for line in out.splitlines() if line.startswith("  s-")]
    assert [line.split()[0] for line in shown] == ["s-2", "s-3", "s-4", "s-5", "s-6"]
    assert "no profile-window costs recorded" in out
    assert status.run(argparse.Namespace(run_dir=str(tmp_path / "run"), runs_dir=str(tmp_path / "none"),
                                         format="text")) == 0
    assert "no sessions recorded" in capsys.readouterr().out


def test_one_visible_name_per_concept_across_commands() -> None:
    """Within the whole CLI, an option's destination (what it sets) has one visible spelling: the agent's
    --localizer-url and run's --keep-windows against the agent's --keep-files were two names for one thing."""
    parser = build_parser([], load_all=True)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    names: dict[str, set[str]] = {}
    for p in sub.choices.values():
        for a in p._actions:
            if a.option_strings and a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction):
                names.setdefault(a.dest, set()).add(max(a.option_strings, key=len))
    assert {d: n for d, n in names.items() if len(n) > 1} == {}
    assert names["localizer_url"] == {"--url"} and names["runs_dir"] == {"--data-dir"}
    assert names["keep_files"] == names["keep_windows"] == {"--keep-windows"}
    assert names["workers"] == {"--nproc-per-node"} == names["nproc_per_node"]
