"""Shared test fixtures. Keep this small: fixtures used by one test module live in that module."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
DLRM_DIR = SHARED / "data" / "dlrm_kineto"
EXAMPLE_TRAIN = REPO / "examples" / "train.py"


@pytest.fixture
def dlrm_dir() -> Path:
    if not DLRM_DIR.is_dir():
        pytest.fail(f"reference traces missing: {DLRM_DIR} (CI clones main with ../shared beside it)")
    return DLRM_DIR


@pytest.fixture
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """An environment with no PERFTRACKER_* settings leaking in, and a private run dir."""
    for k in list(os.environ):
        if k.startswith("PERFTRACKER_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("PERFTRACKER_RUN_DIR", str(tmp_path / "run"))
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def python_exe() -> str:
    return sys.executable
