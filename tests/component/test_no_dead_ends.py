"""No silent dead ends (issue 16): a bad setting in the environment of a plain `import perftracker`
process is one line on its stderr, and training goes on (an agent that cannot run, end to end:
tests/system/test_agent_cannot_run.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from agent_helpers import cleanup, env_for_tests, short_run_dir


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

