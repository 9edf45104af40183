"""The command line's conventions, through the real `python -m perftracker` process: --version, -v
anywhere, one-line I/O errors before any work, colour only on a terminal (a real pty) and never with
NO_COLOR, output at the terminal's width, --format on listings, export-trace of a Kineto trace."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from perftracker.localizer.render.json import render as render_json
from report_samples import slow_compute_report

from tests.conftest import REPO

ANSI = re.compile(r"\x1b\[([0-9;]*)m")


def colours(text: str) -> list[str]:
    """The SGR sequences in ``text`` that set a colour (NO_COLOR allows bold and dim, not colour)."""
    def is_colour(params: str) -> bool:
        return any(p.isdigit() and (30 <= int(p) <= 49 or 90 <= int(p) <= 107) for p in params.split(";"))
    return [m.group(0) for m in ANSI.finditer(text) if is_colour(m.group(1))]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS", "TERM")}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "perftracker", *args], capture_output=True, text=True,
                          timeout=120, env=_env(**env), cwd=REPO)


def in_pty(*args: str, columns: int = 80, **env: str) -> str:
    """stdout and stderr of the command run on a real pseudo-terminal ``columns`` wide."""
    import fcntl
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "perftracker", *args], stdin=slave, stdout=slave, stderr=slave,
                            env=_env(TERM="xterm-256color", **env), cwd=REPO, close_fds=True)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    proc.wait(30)
    os.close(master)
    return b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")


def _report_file(tmp_path: Path) -> Path:
    path = tmp_path / "report.json"
    with open(path, "w", encoding="utf-8") as fh:
        render_json(slow_compute_report(), fh)
    return path


def test_version_is_the_package_version() -> None:
    r = cli("--version")
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"].get("version")
    import perftracker

    assert r.returncode == 0 and r.stdout.strip() == f"perftracker {perftracker.__version__}"
    assert version is None, "one version number: pyproject takes it from perftracker.__version__"


def test_verbose_anywhere_on_the_command_line(tmp_path: Path) -> None:
    """-v before or after the command (counts add up): the report command's INFO/DEBUG logs appear."""
    src = _report_file(tmp_path)
    quiet = cli("report", "--file", str(src), "--format", "json")
    after = cli("report", "--file", str(src), "--format", "json", "-vv")
    both = cli("-v", "report", "-v", "--file", str(src), "--format", "json")
    assert quiet.returncode == after.returncode == both.returncode == 0
    assert "DEBUG" not in quiet.stderr
    assert "DEBUG" in after.stderr and "DEBUG" in both.stderr


def test_unwritable_output_is_one_line_before_any_work(tmp_path: Path, dlrm_dir: Path) -> None:
    src = _report_file(tmp_path)
    cases = [
        ("report", "--file", str(src), "-o", str(tmp_path / "no" / "such" / "dir" / "r.txt")),
        ("report", "--file", str(src), "-o", str(tmp_path)),
        ("analyze", str(dlrm_dir), "-o", "/proc/perftracker-report.txt"),
        ("export-trace", "--raw", str(sorted(dlrm_dir.glob("*.json.gz"))[0]), "-o", "/proc/trace.json"),
    ]
    for args in cases:
        r = cli(*args)
        assert r.returncode == 1, (args, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("perftracker: error: -o "), (args, r.stderr)
        assert "[1/" not in r.stderr  # failed before summarizing any trace


def test_colour_only_on_a_terminal_without_no_color_at_its_width(tmp_path: Path) -> None:
    src = str(_report_file(tmp_path))
    on_tty = in_pty("report", "--file", src, columns=80)
    assert colours(on_tty), on_tty[:400]
    plain = ANSI.sub("", on_tty)
    assert "perftracker report" in plain and "rank" in plain
    assert max(len(line) for line in plain.splitlines()) <= 80
    assert max(len(line) for line in plain.splitlines()) > 70  # uses the width it has
    narrow = ANSI.sub("", in_pty("report", "--file", src, columns=60))
    assert max(len(line) for line in narrow.splitlines()) <= 60
    no_color = in_pty("report", "--file", src, columns=80, NO_COLOR="1")
    assert not colours(no_color) and "perftracker report" in no_color
    piped = cli("report", "--file", src)
    assert piped.returncode == 0 and not ANSI.search(piped.stdout) and "perftracker report" in piped.stdout
    # errors: the level is coloured on a terminal, plain in a pipe
    err_tty = in_pty("report", "--file", str(tmp_path / "missing.json"))
    assert colours(err_tty) and "error" in err_tty
    err = cli("report", "--file", str(tmp_path / "missing.json"))
    assert err.stderr.startswith("perftracker: error: --file") and not ANSI.search(err.stderr)


def test_sessions_format_json_and_the_deprecated_json_flag(tmp_path: Path) -> None:
    from perftracker.localizer.store.sqlite_store import SessionRecord, Store

    store_path = tmp_path / "localizer.sqlite"
    store = Store(store_path)
    store.insert_session(SessionRecord(seq=0, session="s-1", job="job-a", kind="slowdown", reason="manual",
                                       window_s=2.0, state="open", opened_ns=time.time_ns(),
                                       deadline_ns=time.time_ns() + 10**9, expected=(0, 1)))
    store.close()
    new = cli("sessions", "--store", str(store_path), "--format", "json")
    old = cli("sessions", "--store", str(store_path), "--json")
    assert new.returncode == old.returncode == 0
    assert [s["session"] for s in json.loads(new.stdout)] == ["s-1"] == [s["session"] for s in json.loads(old.stdout)]
    assert "deprecated" in old.stderr and "deprecated" not in new.stderr
    text = cli("sessions", "--store", str(store_path), COLUMNS="80")
    assert text.returncode == 0 and "s-1" in text.stdout and "job-a" in text.stdout
    assert max(len(line) for line in text.stdout.splitlines()) <= 80
    assert "--json" not in cli("sessions", "--help").stdout


@pytest.mark.parametrize("columns", [80, 120])
def test_sessions_table_is_one_line_per_session_in_the_terminal_width(tmp_path: Path, columns: int) -> None:
    """Long reasons and job names are cut with an ellipsis, never folded over several lines; --limit
    counts sessions (0: all) and refuses a negative count."""
    from perftracker.localizer.store.sqlite_store import SessionRecord, Store

    store_path = tmp_path / "localizer.sqlite"
    store = Store(store_path)
    now = time.time_ns()
    for i in range(3):
        store.insert_session(SessionRecord(
            seq=0, session=f"20261127-0400{i:02d}-abcdef", job="train-gpt2-finetune-with-a-long-name", kind="on-demand",
            reason="rank 3: slowdown at iteration 1234 (+26% over 53.4 ms) " * 3, window_s=2.0, state="open",
            opened_ns=now + i, deadline_ns=now + 10**9, expected=tuple(range(16))))
    store.close()
    out = ANSI.sub("", in_pty("sessions", "--store", str(store_path), columns=columns))
    lines = [ln for ln in out.splitlines() if ln.strip() and not set(ln.strip()) <= {"─"}]
    assert len(lines) == 1 + 3, out  # the header and one line per session
    assert max(len(ln.rstrip()) for ln in lines) <= columns, out
    assert all("20261127-0400" in ln and "…" in ln for ln in lines[1:]), out
    assert len(json.loads(cli("sessions", "--store", str(store_path), "--format", "json", "--limit", "2").stdout)) == 2
    assert len(json.loads(cli("sessions", "--store", str(store_path), "--format", "json", "--limit", "0").stdout)) == 3
    bad = cli("sessions", "--store", str(store_path), "--limit", "-1")
    assert bad.returncode == 2 and "0 or more" in bad.stderr


def test_export_trace_takes_a_kineto_trace(tmp_path: Path, dlrm_dir: Path) -> None:
    src = sorted(dlrm_dir.glob("*.json.gz"))[3]
    out = tmp_path / "rank3.json"
    r = cli("export-trace", "--raw", str(src), "-o", str(out))
    assert r.returncode == 0, r.stderr
    trace = json.loads(out.read_text())
    assert trace["otherData"]["rank"] == 3 and trace["otherData"]["source"] == "kineto"
    names = {e.get("args", {}).get("name") for e in trace["traceEvents"] if e.get("ph") == "M"}
    assert "critical path" in names
    assert sum(1 for e in trace["traceEvents"] if e.get("cat") == "critical_path") > 0
