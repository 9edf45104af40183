"""The fault benchmark's --quick run (clean + slow-compute + slow-dataloader), in the accuracy tier:
three 4-worker jobs with their agents take minutes on a 2-core host (over 5 under load), and each
report must come within 60 s.

It runs the real harness: 4-worker torchrun jobs of perftracker/examples/train.py, one network namespace per
worker where the machine allows it (single-host mode otherwise, which the harness announces), a
node agent per host, a localizer, faults, triggers and scoring.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO


# generous limits: the harness ends its node agents itself, but killed from outside (by pytest-timeout's
# 300 s default, once on a loaded host) it left them running
@pytest.mark.timeout(900)
def test_quick_fault_suite() -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO), PERFTRACKER_DISABLE="1")
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "faults.py"), "--quick"],
        capture_output=True, text=True, timeout=840, env=env, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "MODE:" in proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(result) >= {"scenarios", "precision", "recall", "clean_false_findings",
                           "max_detection_delay_iters", "max_report_s"}
    # every quick scenario ran (none of them needs network namespaces) and produced a report
    assert result["scenarios"] == 3 and result["skipped"] == 0, proc.stderr[-3000:]
    assert 0 < result["max_report_s"] < 60, proc.stderr[-3000:]
    table = proc.stderr[proc.stderr.rfind("scenario "):]
    assert "no report" not in table and "Error" not in table, table
    for name in ("clean-s0", "slow-compute-rank", "slow-dataloader-all"):
        assert name in table, table
    assert 0.0 <= result["precision"] <= 1.0 and 0.0 <= result["recall"] <= 1.0
    # Accuracy is measured, not asserted here: on a 2-core machine the 4 workers share 2 cores and the
    # figures move with the load (docs/fault-benchmark.md). The harness must still score every run.
    print(table)
    print(proc.stdout.strip().splitlines()[-1])
