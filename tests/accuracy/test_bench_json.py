"""The JSON tier of tests/system/test_bench_smoke.py: each benchmark that can run on a tiny input
(``--quick``) prints one JSON object with its promised keys on its last stdout line. Out of CI's run
(about 40 s: CI's 15 minutes); run it with ``python -m pytest -q tests/accuracy/test_bench_json.py``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.system.test_bench_smoke import BENCH, JSON, REPO


@pytest.mark.parametrize("name", sorted(JSON))
def test_benchmark_prints_its_json_on_a_tiny_input(name: str) -> None:
    args, keys = JSON[name]
    proc = subprocess.run([sys.executable, str(BENCH / name), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    out = json.loads(last)
    assert isinstance(out, dict) and keys <= set(out), (keys - set(out), last[:300])
