"""Every benchmark at least starts (issue 45: bench/summarize.py had stopped running, unnoticed).

Three tiers, and every file under bench/ must be in one of them (a new benchmark fails this test
until it is placed):
- ``JSON``: run on a tiny input (``--quick``); the last stdout line must be one JSON object with
  the keys the benchmark promises (tests/accuracy/test_bench_json.py: about 40 s, out of CI's run);
- ``HELP``: scripts that need hardware (a GPU), a long run or a cluster: ``--help`` must exit 0
  (the script imports and parses its arguments);
- ``IMPORT``: libraries and scripts without arguments: the module must import.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"

JSON: dict[str, tuple[list[str], set[str]]] = {
    "localize.py": (["--quick"], {"workers", "localize_s", "speedup_vs_reference", "identical"}),
    "summarize.py": (["--quick"], {"window_events", "summarize_s", "events_per_s", "speedup_vs_hta",
                                   "pattern_bytes_per_worker"}),
    "overhead.py": (["--quick"], {"ratio_1ms", "ratio_50ms", "hook_ns", "per_iteration_ns"}),
}
HELP = {
    "datagen.py", "detector.py", "faults.py", "gpu_check.py", "gpu_faults.py", "gpu_job.py", "gpu_probe.py",
    "hardening.py", "hf_job.py", "hta_compare.py", "load.py", "localize_small_n.py", "multinode.py",
    "onset_bound.py", "plot_gpu_fault.py", "stack_reader_cost.py", "window_build.py",
}
IMPORT = {"__init__.py", "synthetic.py", "hardening_third.py", "fork_cost.py", "record_series.py"}


def test_every_benchmark_is_placed_in_a_tier() -> None:
    files = {p.name for p in BENCH.glob("*.py")}
    placed = set(JSON) | HELP | IMPORT
    assert files - placed == set(), f"benchmarks in no tier of {__file__}: {sorted(files - placed)}"


@pytest.mark.parametrize("name", sorted(HELP))
def test_benchmark_starts(name: str) -> None:
    if not (BENCH / name).exists():
        pytest.skip(f"bench/{name} is not in this checkout")
    proc = subprocess.run([sys.executable, str(BENCH / name), "--help"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "usage" in proc.stdout.lower()


@pytest.mark.parametrize("name", sorted(IMPORT))
def test_benchmark_module_imports(name: str) -> None:
    module = "bench" if name == "__init__.py" else f"bench.{name[:-3]}"
    proc = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
