"""`import perftracker` in a real process: it activates from the environment unless disabled, and
never in perftracker's own processes, which say their role in PERFTRACKER_ROLE (perftracker/role.py)
(the Runtime contract in this process: tests/unit/test_runtime.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def _import_in_subprocess(env: dict[str, str]) -> dict[str, object]:
    code = "import json, perftracker; print(json.dumps(perftracker.status()))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return {"status": json.loads(out.stdout.strip().splitlines()[-1]), "stderr": out.stderr}


def test_import_activates_from_env_unless_disabled(clean_env: dict[str, str]) -> None:
    on = _import_in_subprocess(dict(clean_env, PERFTRACKER_DETECTOR_MODE="paper"))
    assert on["status"]["active"] is True and on["status"]["mode"] == "paper"  # type: ignore[index]
    off = _import_in_subprocess(dict(clean_env, PERFTRACKER_DISABLE="1"))
    assert off["status"]["active"] is False  # type: ignore[index]
    bad = _import_in_subprocess(dict(clean_env, PERFTRACKER_BLOCKED_FACTOR="lots"))
    assert bad["status"]["active"] is False  # type: ignore[index]
    assert "PERFTRACKER_BLOCKED_FACTOR" in str(bad["stderr"])


def test_perftrackers_own_processes_do_not_activate() -> None:
    """perftracker's own processes (the node agent and its sampler and summarizer processes, the
    localizer, the console script) import perftracker but never train: no detection, no agent. Each
    says its role in PERFTRACKER_ROLE, set by whoever starts it; the console script is known by its
    program name; any other process is a training process."""
    code = "import perftracker.runtime.runtime as r; print(r.get_runtime() is None)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFTRACKER_")}
    for role in ("agent", "sampler", "localizer"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=dict(env, PERFTRACKER_ROLE=role), timeout=120)
        assert out.stdout.strip() == "True", (role, out.stderr[-500:])
    console = f"import sys; sys.argv[0] = '/usr/local/bin/perftracker'; {code}"
    out = subprocess.run([sys.executable, "-c", console], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.strip() == "True", out.stderr[-500:]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.strip() == "False", out.stderr[-500:]  # a plain script does activate
