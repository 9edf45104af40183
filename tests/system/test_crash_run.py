"""Crashes end to end (issue 22): `perftracker run` on a real single-process job of
perftracker/examples/train.py that raises, exits non-zero, or fails before its first iteration, and
one that ends normally (the capture chain, the agent's view of an exit and the crash verdict:
tests/component/test_crash.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def _perftracker_run_status(tmp_path: Path, *train_args: str) -> tuple[int, str]:
    from tests.agent_helpers import env_for_tests

    train = Path(__file__).resolve().parents[2] / "perftracker" / "examples" / "train.py"
    out = subprocess.run([sys.executable, "-m", "perftracker", "run", "--", sys.executable, str(train), "--quiet",
                          *train_args], cwd=tmp_path, env=env_for_tests(), capture_output=True, text=True,
                         timeout=240)
    return out.returncode, out.stdout


def _perftracker_run(tmp_path: Path, *train_args: str) -> str:
    return _perftracker_run_status(tmp_path, *train_args)[1]


@pytest.mark.timeout(300)
def test_single_process_crash_gives_a_crash_report_and_a_normal_exit_none(tmp_path: Path) -> None:
    crashed = _perftracker_run(tmp_path, "--iters", "100000", "--fault", "raise:at_iter=20")
    assert "(crash, crash: rank 0 RuntimeError: injected fault" in crashed, crashed
    assert "crash: rank 0 (a single-process job) failed with RuntimeError: injected fault: raise at iteration" \
        in crashed and "perftracker/examples/train.py:" in crashed and "in crash via main > forward" in crashed, crashed
    assert "hang" not in crashed.split("done, complete:", 1)[-1], crashed
    (tmp_path / "normal").mkdir()
    normal = _perftracker_run(tmp_path / "normal", "--iters", "30")  # another runs dir: a fresh store
    assert "no session was triggered" in normal, normal


@pytest.mark.timeout(300)
def test_single_process_nonzero_exit_under_perftracker_run_is_a_crash_with_its_status(tmp_path: Path) -> None:
    # at iteration 2 the channel has not registered yet (it looks every 0.5 s): it registers at exit
    code, out = _perftracker_run_status(tmp_path, "--iters", "100000", "--fault", "exit:at_iter=2,code=3")
    assert code == 3, out
    assert "crash: rank 0 (a single-process job) ended with exit status 3, at iteration 2" in out, out
    assert "hang" not in out.split("done, complete:", 1)[-1], out


@pytest.mark.timeout(300)
def test_single_process_crash_before_its_first_iteration_is_a_crash(tmp_path: Path) -> None:
    code, out = _perftracker_run_status(tmp_path, "--iters", "100000", "--fault", "raise:at_iter=0")
    assert code != 0, out
    assert "crash: rank 0 (a single-process job) failed with RuntimeError: injected fault: raise at iteration 0" \
        in out and "before its first iteration completed" in out, out
    assert "hang" not in out.split("done, complete:", 1)[-1], out
