"""No silent dead ends (issue 16): when the node agent cannot run, a plain `import perftracker` job says
so in one line on its stderr, once, and trains on.

The broken install is real: the agent's interpreter gets a PYTHONPATH entry whose `aiohttp` module
raises ModuleNotFoundError on import, exactly as a missing package does. The training process never
imports aiohttp, so only the autostarted agent fails.
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
        r = subprocess.run([sys.executable, str(REPO / "tests" / "integrations" / "single_process.py"),
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


@pytest.mark.parametrize("env_var, value", [("PERFTRACKER_WINDOW_S", "abc"), ("PERFTRACKER_WINDOW_STACKS", "bogus")])
def test_a_bad_setting_is_one_line_and_training_goes_on(tmp_path: Path, env_var: str, value: str) -> None:
    """A typo in a setting is the user's, not a bug: one line that names the variable and the value,
    no traceback, and the script runs to its end."""
    run_dir = short_run_dir("badcfg")
    env = env_for_tests(PERFTRACKER_RUN_DIR=str(run_dir), PERFTRACKER_AUTOSTART_AGENT="0", **{env_var: value})
    try:
        r = subprocess.run([sys.executable, "-c", "import perftracker; print('trained')"], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and r.stdout.strip() == "trained", r.stderr[-3000:]
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
        assert lines[0].startswith(f"perftracker: {env_var}={value!r}") and "detection is off" in lines[0]
    finally:
        cleanup(run_dir)
