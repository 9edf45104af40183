"""What removing a heavy pipeline stage's excess saves, replayed (issue 44): on a four-stage 1F1B
pipeline (tests/pipeline_traces.py, DP2 x PP4, the last stage computing twice as long) the stage's
compute between its transfers is brought to the other stages' level and the recorded steps are
replayed through the schedule's dependencies; the saving is checked against the trace mutator's
re-timing of the same change (its truth), as `perftracker analyze` reports it."""

from __future__ import annotations

from pathlib import Path

import pytest
from perftracker.localizer.diagnose.method.arrays import pattern_sets_to_arrays
from perftracker.localizer.diagnose.verdict.group_findings import STAGE_KEY
from perftracker.localizer.diagnose.verdict.replay import pipeline_compute_us, replay_scaled
from perftracker.localizer.diagnose.verdict.savings import stage_scale

import tests.pipeline_traces as pt
from bench.tracefault.faults import GpuFault
from bench.tracefault.mutate import mutate_dir
from perftracker.cli.analyze import localize_summaries, summarize_dir


def _summaries(d: Path, steps: int = 6):  # type: ignore[no-untyped-def]
    pt.write_pipeline(d, steps, dp=2)
    return summarize_dir(d, False, 1, progress=None, warn=lambda *_: None)


def test_the_heavy_stage_replayed_at_the_others_level_saves_what_the_mutator_measures(tmp_path: Path) -> None:
    summ = _summaries(tmp_path)
    arr = pattern_sets_to_arrays(summ.sets)
    assert arr.stage is not None and arr.stage.tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    # per step: stages 1 and 2 compute 6 x (10 + 20) µs between their transfers, the last 6 x 60
    assert pipeline_compute_us(arr.step_records[1]) == pytest.approx(180.0, abs=2.0)
    assert pipeline_compute_us(arr.step_records[3]) == pytest.approx(360.0, abs=2.0)
    scale = stage_scale(arr, [3, 7])
    assert isinstance(scale, dict) and scale == pytest.approx({3: 0.5, 7: 0.5}, abs=0.01)
    r = replay_scaled(arr.step_records, scale)
    assert r is not None and not r.inconclusive
    truth = 1.0 - mutate_dir(tmp_path, None, [GpuFault("slow_gpu", (3, 7), {"factor": 0.5})]).step_out_us \
        / mutate_dir(tmp_path, None).step_out_us
    assert truth > 0.3  # the last stage paces the pipeline: halving it saves a third of the step
    assert r.saves == pytest.approx(truth, rel=0.1)
    report = localize_summaries(summ, tmp_path)
    stage = next(f for f in report.findings if f.key == STAGE_KEY)
    assert stage.ranks == (3, 7)
    assert stage.saves_basis.startswith("replayed over") and stage.saves_share == pytest.approx(truth, rel=0.1)
    assert 0.0 < stage.impact <= 1.0
    assert not any(set(w.ranks) & {3, 7} for w in stage.waits)  # the culprit is not its own waiter


def test_a_balanced_pipeline_has_no_stage_to_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pt, "LAST_STAGE_SCALE", 1.0)
    arr = pattern_sets_to_arrays(_summaries(tmp_path).sets)
    assert isinstance(stage_scale(arr, [3, 7]), str)  # no excess between its transfers
    assert not any(f.key == STAGE_KEY for f in localize_summaries(_summaries(tmp_path / "b"), tmp_path).findings)


def test_without_step_records_the_stage_keeps_its_estimate_and_says_why(tmp_path: Path) -> None:
    arr = pattern_sets_to_arrays(_summaries(tmp_path).sets)
    bare = type(arr)(**{**arr.__dict__, "step_records": tuple(None for _ in arr.step_records)})
    assert stage_scale(bare, [3, 7]) == "the workers sent no step records"
