"""No silent dead ends (issue 16), end to end: when the node agent cannot run, a plain `import
perftracker` job (tests/framework_jobs/single_process.py) says so in one line on its stderr, once, and
trains on.

The broken install is real: the agent's interpreter gets a PYTHONPATH entry whose `aiohttp` module
raises ModuleNotFoundError on import, exactly as a missing package does. The training process never
imports aiohttp, so only the autostarted agent fails. (A bad setting, in one process:
tests/component/test_no_dead_ends.py.)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from agent_helpers import REPO, cleanup, env_for_tests, short_run_dir


@pytest.mark.timeout(240)
def test_an_agent_that_cannot_run_gives_one_line_on_stderr(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "aiohttp.py").write_text("raise ModuleNotFoundError(\"No module named 'aiohttp'\", name='aiohttp')\n")
    run_dir = short_run_dir("dead")
    env = env_for_tests(PERFTRACKER_RUN_DIR=str(run_dir), PERFTRACKER_AUTOSTART_AGENT="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = f"{shadow}:{env['PYTHONPATH']}"
    try:
        r = subprocess.run([sys.executable, str(REPO / "tests" / "framework_jobs" / "single_process.py"),
                            "--steps", "2500", "--slow-from", "1000000"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=200)
        assert r.returncode == 0, r.stderr[-3000:]
        lines = [ln for ln in r.stderr.splitlines() if "perftracker" in ln and "USDT" not in ln]
        want = ("perftracker: no report will come: the node agent cannot run its localizer without the Python "
                "package 'aiohttp'")
        assert len(lines) == 1 and lines[0].startswith(want), r.stderr[-3000:]
        assert "pip install aiohttp" in lines[0]
        assert (run_dir / "agent.error").read_text().strip() == lines[0]
    finally:
        cleanup(run_dir)
