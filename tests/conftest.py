"""Shared test fixtures. Keep this small: fixtures used by one test module live in that module."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import psutil
import pytest

# the shared helpers (report_samples, agent_helpers, ...) live in tests/, beside this file; the tests
# in tests/unit, tests/component, tests/system and tests/accuracy import them by name
sys.path.insert(0, str(Path(__file__).resolve().parent))

REPO = Path(__file__).resolve().parents[1]
# The dlrm reference traces (8 real GPU ranks, facebookresearch/param's
# et_replay/tests/inputs/dlrm_kineto.tar.gz): PERFTRACKER_DLRM_DIR, else where CI lays them out,
# shared/data/dlrm_kineto beside the checkout.
DLRM_DIR = Path(os.environ.get("PERFTRACKER_DLRM_DIR") or REPO.parent / "shared" / "data" / "dlrm_kineto")
EXAMPLE_TRAIN = REPO / "perftracker" / "examples" / "train.py"

# Isolation of the whole suite (set in pytest_configure, before any test module imports perftracker):
# every process of the suite that imports perftracker without a run dir of its own (this pytest
# process, and subprocesses started with its environment) uses a private run dir and starts no node
# agent. Nothing then talks to a developer's agent at /tmp/perftracker-<uid>, and no test inherits an
# agent that another test autostarted. Tests of the autostart set PERFTRACKER_AUTOSTART_AGENT=1 (or
# strip PERFTRACKER_*, as clean_env and agent_helpers.env_for_tests(AUTOSTART=...) do) explicitly.
_SUITE_DIR: Path | None = None
_REAPED: list[str] = []  # "<test or 'session'>: pid N: cmdline" of processes the suite had to end


def pytest_configure(config: pytest.Config) -> None:
    global _SUITE_DIR
    _SUITE_DIR = Path(tempfile.mkdtemp(prefix="pt-suite-", dir="/tmp"))  # short: AF_UNIX paths < 108 bytes
    os.environ["PERFTRACKER_RUN_DIR"] = str(_SUITE_DIR / "run")
    os.environ["PERFTRACKER_AUTOSTART_AGENT"] = "0"


def _mentions(proc: psutil.Process, roots: tuple[str, ...]) -> bool:
    try:
        with proc.oneshot():
            text = " ".join(proc.cmdline())
            try:
                text += " " + proc.cwd() + " " + proc.environ().get("PERFTRACKER_RUN_DIR", "")
            except (psutil.AccessDenied, psutil.ZombieProcess):
                pass
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return any(r in text for r in roots)


def reap_processes(roots: Iterable[str | Path], who: str) -> list[str]:
    """SIGKILL every process (not this one or its ancestors) whose command line, working directory
    or PERFTRACKER_RUN_DIR lies under one of `roots` (directories this suite created): agents,
    localizers, torchrun workers or samplers a test left behind. Returns what it ended."""
    roots_t = tuple(str(r) for r in roots if r)
    if not roots_t:
        return []
    me = psutil.Process()
    spared = {me.pid, *(p.pid for p in me.parents())}
    ended = []
    for proc in psutil.process_iter():
        if proc.pid in spared or not _mentions(proc, roots_t):
            continue
        try:
            line = " ".join(proc.cmdline())[:200]
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        except (psutil.NoSuchProcess, psutil.TimeoutExpired, psutil.AccessDenied):
            continue
        ended.append(f"{who}: pid {proc.pid}: {line}")
    _REAPED.extend(ended)
    return ended


@pytest.fixture(scope="session", autouse=True)
def _no_process_outlives_the_suite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    yield
    base = tmp_path_factory.getbasetemp()
    try:
        import agent_helpers

        short = [str(d) for d in agent_helpers.SHORT_RUN_DIRS]
    except ImportError:
        short = []
    reap_processes([str(_SUITE_DIR or ""), str(base), *short], "end of the suite")
    if _SUITE_DIR is not None:
        shutil.rmtree(_SUITE_DIR, ignore_errors=True)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _REAPED:
        terminalreporter.section("processes left behind by tests (ended with SIGKILL)")
        for line in _REAPED:
            terminalreporter.write_line(line)


@pytest.fixture
def dlrm_dir() -> Path:
    if not DLRM_DIR.is_dir():
        pytest.fail(f"dlrm reference traces missing: {DLRM_DIR} (set PERFTRACKER_DLRM_DIR; CI clones main "
                    "with shared/data/dlrm_kineto beside it)")
    return DLRM_DIR


@pytest.fixture
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """An environment with no PERFTRACKER_* settings leaking in, and a private run dir. A subprocess
    started with it may autostart a node agent in that run dir: whatever still runs there (or in
    tmp_path) after the test is ended, so no agent outlives its test."""
    for k in list(os.environ):
        if k.startswith("PERFTRACKER_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("PERFTRACKER_RUN_DIR", str(tmp_path / "run"))
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    yield env
    reap_processes([str(tmp_path)], request.node.nodeid)


def python_exe() -> str:
    return sys.executable
