"""The CLI reference is generated from argparse and committed (issue 35): it lists every command,
it equals what tools/cli_reference.py writes now, and the help it is made from keeps its promises
(an example per command, a default per option, one word per directory, old spellings still parsed)."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from perftracker.cli.main import COMMANDS, build_parser

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "docs" / "cli-reference.md"


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser([], load_all=True)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_command_is_in_the_reference() -> None:
    text = REFERENCE.read_text(encoding="utf-8")
    headings = re.findall(r"^## `perftracker ([\w-]+)`$", text, flags=re.M)
    assert headings == list(COMMANDS), headings
    for name, parser in _commands().items():
        section = text.split(f"## `perftracker {name}`", 1)[1].split("\n## ", 1)[0]
        for action in parser._actions:
            if action.help != argparse.SUPPRESS and action.option_strings and action.dest != "help":
                assert f"`{action.option_strings[0]}" in section, f"{name}: {action.option_strings[0]} not listed"


def test_the_committed_reference_is_the_generated_one() -> None:
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "cli_reference.py"), "--check"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, ("docs/cli-reference.md is stale: run `python tools/cli_reference.py`\n"
                                  + proc.stdout[-4000:] + proc.stderr[-2000:])


def test_every_help_has_examples_and_the_top_says_where_to_start() -> None:
    top = build_parser([]).format_help()
    assert "start with `perftracker demo`" in top
    for name, parser in _commands().items():
        assert "examples:" in (parser.description or ""), f"`perftracker {name} --help` shows no example"


def test_every_option_with_a_default_states_it() -> None:
    missing = []
    for name, parser in _commands().items():
        for a in parser._actions:
            if a.help == argparse.SUPPRESS or not a.option_strings or a.nargs == 0:
                continue  # hidden, positional, or a flag
            if a.default not in (None, argparse.SUPPRESS) and "default" not in (a.help or ""):
                missing.append(f"{name} {a.option_strings[0]}")
    assert not missing, "options whose --help hides their default: " + ", ".join(missing)


def test_session_ids_in_the_help_are_real_ones() -> None:
    real = re.compile(r"^\d{8}-\d{6}-[0-9a-f]{6}$")
    for name, parser in _commands().items():
        for example in re.findall(r"\b(?:s-)?\d{8}-\d{6}-[0-9a-z]+\b", parser.description or ""):
            assert real.match(example), f"{name}: {example} is not the shape of a session id"


@pytest.mark.parametrize("command", ["agent", "run", "demo", "trigger", "sessions", "report", "export-trace"])
def test_one_data_dir_option_and_its_old_spelling(command: str) -> None:
    parser = _commands()[command]
    shown = parser.format_help()
    assert "--data-dir" in shown and "--runs-dir" not in shown
    extra = ["--rank", "0", "-o", "x.json"] if command == "export-trace" else []
    new = build_parser([command]).parse_args([command, "--data-dir", "/d1", *extra])
    old = build_parser([command]).parse_args([command, "--runs-dir", "/d1", *extra])
    assert new.runs_dir == old.runs_dir == "/d1"


def test_run_and_demo_can_keep_windows() -> None:
    for command in ("run", "demo"):
        args = build_parser([command]).parse_args([command, "--keep-windows"])
        assert args.keep_windows is True


def test_keep_windows_moves_the_agents_windows_to_the_data_dir(tmp_path: Path) -> None:
    """What `run`/`demo --keep-windows` do when they stop the agent: its kept raw windows go from the
    temporary run dir to <data-dir>/windows/, where `export-trace latest` finds them."""
    from perftracker.cli.export_trace import find_raw_window
    from perftracker.cli.run import LocalAgent

    run_dir, data = tmp_path / "run", tmp_path / "data"
    (run_dir / "windows").mkdir(parents=True)
    data.mkdir()
    for rank in (0, 1):
        (run_dir / "windows" / f"20261128-020900-c5e6ca-rank{rank}.raw.npz").write_bytes(b"x")
    (run_dir / "windows" / "elsewhere-rank0.raw.npz").symlink_to(tmp_path / "nowhere")
    agent = LocalAgent(data, run_dir, proc=None, log_path=data / "agent.log", keep_windows=True)  # type: ignore[arg-type]
    moved = agent.save_windows()
    assert sorted(p.name for p in moved) == ["20261128-020900-c5e6ca-rank0.raw.npz",
                                             "20261128-020900-c5e6ca-rank1.raw.npz"]
    assert find_raw_window("latest", 1, str(tmp_path / "none"), str(data)) == data / "windows" / moved[1].name
    assert not (data / "windows" / "elsewhere-rank0.raw.npz").exists()  # a link is not moved
