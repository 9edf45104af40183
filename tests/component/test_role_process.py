"""The role as real processes see it: perftracker's own programs never turn detection on."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _imports(args: list[str], extra_env: dict[str, str] | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFTRACKER_")}
    env.update(extra_env or {})
    out = subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stderr


@pytest.mark.parametrize("args", [["-m", "perftracker", "--version"],
                                  ["-m", "perftracker.agent", "--help"]])
def test_python_m_perftracker_is_not_a_training_process(args: list[str]) -> None:
    # activation would import the runtime (and torch); perftracker's own programs must not
    assert "perftracker.runtime.runtime" not in _imports(args)


def test_a_training_script_is_one() -> None:
    # the must-find twin: a plain `import perftracker` in a script activates (detection imports the
    # runtime), unless the environment says another role
    script = "import perftracker, sys; sys.exit(0 if perftracker.status()['active'] else 3)"
    env = {"PERFTRACKER_AUTOSTART_AGENT": "0"}
    assert "perftracker.runtime.runtime" in _imports(["-c", script], env)
    assert "perftracker.runtime.runtime" not in _imports(["-c", "import perftracker"],
                                                         {**env, "PERFTRACKER_ROLE": "agent"})
