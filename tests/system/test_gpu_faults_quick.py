"""The GPU fault bench (bench/gpu_faults.py) end to end: two scenarios of bench/gpu_scenarios on the
real dlrm traces, mutated and run through `perftracker analyze`'s code path (a process pool), then
scored (the trace mutator's rules: tests/unit/test_tracefault.py)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_two_suite_scenarios_run_end_to_end(tmp_path: Path, dlrm_dir: Path) -> None:
    from bench import gpu_faults
    from bench.tracefault.scenario import load_gpu_scenario

    outs = [gpu_faults.run_one(load_gpu_scenario(REPO / "bench" / "gpu_scenarios" / f, dlrm_dir), tmp_path, 2)
            for f in ("clean.toml", "slow-gpu-r2.toml")]
    clean, fault = outs
    assert not clean.error and not fault.error
    assert clean.mutation is not None and abs(clean.mutation.slowdown) < 1e-9
    assert fault.mutation is not None and 0.10 <= fault.mutation.slowdown <= 0.40
    assert clean.report is not None and fault.report is not None
    assert fault.score.expected == {(2, "compute")}
    row = gpu_faults.table(outs).splitlines()[-1]
    assert row.startswith("slow-gpu-r2") and "%" in row
    summary = gpu_faults.summary(outs)
    assert set(summary) >= {"scenarios", "precision", "recall", "headline_correct", "clean_false_findings", "analyze_s_max"}
    assert summary["scenarios"] == 2
