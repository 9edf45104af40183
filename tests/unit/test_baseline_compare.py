"""The healthy baseline's comparison (issue 49): a job-wide slowdown in one op is named, an unchanged job is not."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from perftracker.localizer.diagnose.evidence.baseline import (
    BaselineRule,
    baseline_columns,
    compare,
    median_step_ms,
)
from perftracker.localizer.diagnose.method.arrays import FunctionInfo, PatternArrays
from perftracker.localizer.diagnose.verdict.since_fast import (
    NO_BASELINE,
    JobBaseline,
    age_words,
    with_since_fast,
)

from perftracker.model import Box, Category, Finding, Report, Triple

# ms per step of a clean 4-rank CPU job's critical-path functions
STEP = {"forward": 40.0, "backward": 30.0, "allreduce": 15.0, "collate_fn": 4.0, "optimizer": 6.0, "other": 5.0}
CATS = {"forward": Category.COMPUTE, "backward": Category.COMPUTE, "allreduce": Category.COLLECTIVE,
        "collate_fn": Category.PYTHON, "optimizer": Category.COMPUTE, "other": Category.PYTHON}


def arrays(ms: dict[str, float], ranks: list[int], seed: int, noise: float = 0.01, session: str = "s",
           extra_ms: dict[int, dict[str, float]] | None = None) -> PatternArrays:
    """Shares of a window from per-step times, with seeded per-rank noise on β (and on μ, σ)."""
    rng = np.random.default_rng(seed)
    names = list(ms)
    values = np.zeros((len(names), 3, len(ranks)))
    steps = {}
    for w, r in enumerate(ranks):
        t = {k: v + (extra_ms or {}).get(r, {}).get(k, 0.0) for k, v in ms.items()}
        total = sum(t.values())
        steps[r] = (total,) * 8
        for f, k in enumerate(names):
            values[f, 0, w] = np.clip(t[k] / total + rng.normal(0, noise), 0, 1)
            values[f, 1, w] = np.clip(0.8 + rng.normal(0, 0.05), 0, 1)
            values[f, 2, w] = np.clip(0.1 + rng.normal(0, 0.02), 0, 1)
    funcs = tuple(FunctionInfo(k, k, CATS.get(k, Category.PYTHON)) for k in names)
    return PatternArrays(job="j", session=session, ranks=np.array(ranks, dtype=np.int64), functions=funcs,
                         values=values, window_s=5.0, iteration_ms=steps)


def slowed(name: str, by_ms: float) -> dict[str, float]:
    return {**STEP, name: STEP[name] + by_ms}


RANKS = [0, 1, 2, 3]


def test_a_job_wide_slowdown_in_one_op_is_named_with_its_shares() -> None:
    then = arrays(STEP, RANKS, seed=1, session="base")
    now = arrays(slowed("collate_fn", 40.0), RANKS, seed=2)  # the step +40 %: collate 4 % -> 31 %
    changes = compare(then, now)
    assert [c.label for c in changes] == ["collate_fn"]
    c = changes[0]
    assert c.ranks == (0, 1, 2, 3) and c.compared == 4 and not c.new
    assert c.then.beta == pytest.approx(0.04, abs=0.015)
    assert c.now.beta == pytest.approx(44 / 140, abs=0.015)


def test_an_unchanged_job_gets_no_change_over_many_seeded_windows() -> None:
    false = sum(len(compare(arrays(STEP, RANKS, seed=2 * i, session="base"), arrays(STEP, RANKS, seed=2 * i + 1)))
                for i in range(300))
    assert false == 0


def test_a_job_that_slowed_alike_everywhere_names_no_function() -> None:
    """Every function 30 % slower (a slower clock): the shares are unchanged, no op grew."""
    then = arrays(STEP, RANKS, seed=3, session="base")
    now = arrays({k: 1.3 * v for k, v in STEP.items()}, RANKS, seed=4)
    assert compare(then, now) == []
    assert median_step_ms(now.iteration_ms) == pytest.approx(1.3 * median_step_ms(then.iteration_ms))


@pytest.mark.parametrize(("by_ms", "found"), [
    (2.7, False),  # optimizer 6 -> 8.7 ms: β 0.060 -> 0.084, Δ 0.024 < 0.03
    (3.6, True),  # 6 -> 9.6 ms: β 0.060 -> 0.093, Δ 0.033, ratio 1.55
])
def test_near_the_absolute_gate(by_ms: float, found: bool) -> None:
    then = arrays(STEP, RANKS, seed=5, noise=0.0, session="base")
    now = arrays(slowed("optimizer", by_ms), RANKS, seed=6, noise=0.0)
    assert bool(compare(then, now)) is found


@pytest.mark.parametrize(("ratio", "found"), [(1.25, False), (1.35, True)])
def test_near_the_ratio_gate(ratio: float, found: bool) -> None:
    """forward at β 0.40: a growth of 0.03 passes the absolute gate but not the ratio one."""
    then = arrays(STEP, RANKS, seed=7, noise=0.0, session="base")
    now = then.values.copy()
    now[0, 0, :] *= ratio
    cur = PatternArrays(job="j", session="s", ranks=then.ranks, functions=then.functions, values=now, window_s=5.0)
    assert bool(compare(then, cur)) is found


def test_one_rank_alone_is_the_differential_tests_case_not_the_baselines() -> None:
    then = arrays(STEP, RANKS, seed=8, session="base")
    now = arrays(STEP, RANKS, seed=9, extra_ms={2: {"collate_fn": 40.0}})
    assert compare(then, now) == []
    two = arrays(STEP, RANKS, seed=9, extra_ms={1: {"collate_fn": 40.0}, 2: {"collate_fn": 40.0}})
    assert [c.ranks for c in compare(then, two)] == [(1, 2)]  # half the ranks: job-wide enough


def test_a_function_the_baseline_never_ran_is_new() -> None:
    then = arrays(STEP, RANKS, seed=10, session="base")
    now = arrays({**STEP, "checkpoint_block": 12.0}, RANKS, seed=11)
    changes = compare(then, now)
    assert [(c.label, c.new) for c in changes] == [("checkpoint_block", True)]
    assert changes[0].then.beta == 0.0


def test_ranks_absent_from_the_baseline_compare_with_its_median_worker() -> None:
    then = arrays(STEP, [0, 1], seed=12, session="base")
    now = arrays(slowed("collate_fn", 40.0), [0, 1, 2, 3], seed=13)
    assert baseline_columns(then, now).tolist() == [0, 1, -1, -1]
    assert [c.ranks for c in compare(then, now)] == [(0, 1, 2, 3)]


def _report(findings: tuple[Finding, ...] = ()) -> Report:
    return Report(job="j", session="s", kind="slowdown", created_ns=0, trigger_reason="detector",
                  window_s=5.0, ranks_reported=(0, 1, 2, 3), findings=findings,
                  headline="no abnormal function on 4 ranks", summary="nothing abnormal")


HOUR_NS = 3600 * 10**9


def test_the_report_says_when_there_is_no_baseline() -> None:
    out = with_since_fast(_report(), arrays(STEP, RANKS, seed=14), None, now_ns=0)
    assert out.since_fast is not None and out.since_fast.note == NO_BASELINE and not out.since_fast.has_baseline
    assert out.findings == ()


def test_the_change_becomes_the_reports_finding_with_then_and_now() -> None:
    base = JobBaseline("base-1", 0, arrays(STEP, RANKS, seed=15, session="base-1"))
    now = arrays(slowed("collate_fn", 40.0), RANKS, seed=16)
    out = with_since_fast(_report(), now, base, now_ns=int(1.4 * HOUR_NS))
    assert len(out.findings) == 1
    f = out.findings[0]
    assert f.tests == ("baseline",) and f.kind == "common" and f.ranks == (0, 1, 2, 3) and f.label == "collate_fn"
    assert f.title.startswith("every rank spends 3") and "at the baseline, 1.4 h ago" in f.title
    assert "step 100.0 ms then, 140.0 ms now" in f.sentence
    assert f.saves_share == pytest.approx(40 / 140, abs=0.02)  # the 40 ms collate grew, of the 140 ms step
    assert out.headline == f.title and out.summary == f.sentence
    assert out.since_fast is not None and out.since_fast.step_ms_then == 100.0 and out.since_fast.step_ms_now == 140.0


def test_an_unchanged_job_keeps_its_report_and_says_nothing_grew() -> None:
    base = JobBaseline("base-1", 0, arrays(STEP, RANKS, seed=17, session="base-1"))
    report = _report()
    out = with_since_fast(report, arrays(STEP, RANKS, seed=18), base, now_ns=HOUR_NS)
    assert out.findings == () and out.headline == report.headline
    assert out.since_fast is not None and out.since_fast.note.startswith("no function's share grew since the baseline")


def test_a_change_an_existing_finding_names_adds_evidence_not_a_second_finding() -> None:
    base = JobBaseline("base-1", 0, arrays(STEP, RANKS, seed=19, session="base-1"))
    now = arrays(slowed("collate_fn", 40.0), RANKS, seed=20)
    t = Triple(0.3, 0.8, 0.1)
    existing = Finding(key="collate_fn", label="collate_fn", category=Category.PYTHON, ranks=(0, 1, 2, 3),
                       kind="common", tests=("expectation",), observed=t, median=t, expected=Box(t, t),
                       sentence="s", title="collate_fn outside its range")
    out = with_since_fast(_report((existing,)), now, base, now_ns=HOUR_NS)
    assert len(out.findings) == 1 and out.findings[0].evidence[-1].startswith("since it was fast: 4.4% at the baseline (1.0 h ago), 31% now")


def test_a_rank_specific_finding_stays_first() -> None:
    base = JobBaseline("base-1", 0, arrays(STEP, RANKS, seed=21, session="base-1"))
    now = arrays(slowed("collate_fn", 40.0), RANKS, seed=22)
    t = Triple(0.5, 0.8, 0.1)
    specific = Finding(key="forward", label="forward", category=Category.COMPUTE, ranks=(1,), kind="specific",
                       tests=("differential",), observed=t, median=t, expected=Box(t, t), sentence="s",
                       title="rank 1 slow in forward", impact=0.05)
    out = with_since_fast(_report((specific,)), now, base, now_ns=HOUR_NS)
    assert [f.label for f in out.findings] == ["forward", "collate_fn"]
    assert out.headline.startswith("rank 1 slow in forward")


def test_the_since_fast_line_round_trips_and_matches_the_report_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    base = JobBaseline("base-1", 0, arrays(STEP, RANKS, seed=23, session="base-1"))
    out = with_since_fast(_report(), arrays(slowed("collate_fn", 40.0), RANKS, seed=24), base, now_ns=HOUR_NS)
    d = json.loads(json.dumps(out.to_dict()))
    assert Report.from_dict(d).since_fast == out.since_fast
    schema = json.loads((Path(__file__).resolve().parents[2] / "localizer/render/report.schema.json").read_text())
    jsonschema.validate(d, schema)


def test_age_words() -> None:
    assert [age_words(s) for s in (40, 720, 5040, 200000)] == ["40 s", "12 min", "1.4 h", "2.3 days"]


def test_rule_is_tunable() -> None:
    then = arrays(STEP, RANKS, seed=25, noise=0.0, session="base")
    now = arrays(slowed("optimizer", 3.6), RANKS, seed=26, noise=0.0)
    assert compare(then, now, BaselineRule(min_delta=0.05)) == []


def test_waits_and_collectives_are_not_named() -> None:
    """A collective's share grows with any rank's lateness and CPU wait with the host's load: the
    baseline names what a rank runs itself (the first real run named ddp.reducer::wait on a loaded host)."""
    waits = {**STEP, "CPU wait (runnable, no core)": 5.0}
    then = arrays(waits, RANKS, seed=27, session="base")
    now = arrays({**waits, "allreduce": 60.0, "CPU wait (runnable, no core)": 50.0}, RANKS, seed=28)
    assert compare(then, now) == []
    assert {c.label for c in compare(then, now, BaselineRule(own_work_only=False))} == {
        "allreduce", "CPU wait (runnable, no core)"}


def _predicted(step_ms: float, saves: float) -> Report:
    t = Triple(0.3, 0.8, 0.1)
    f = Finding(key="forward", label="forward", category=Category.COMPUTE, ranks=(1,), kind="specific",
                tests=("differential",), observed=t, median=t, expected=Box(t, t), sentence="s",
                saves_share=saves, saves_basis="replayed over 8 steps")
    return Report(job="j", session="prev-1", kind="slowdown", created_ns=0, trigger_reason="detector", window_s=5.0,
                  ranks_reported=(0, 1), findings=(f,), iteration_ms={0: (step_ms,) * 4, 1: (step_ms,) * 4})


@pytest.mark.parametrize(("now_ms", "said"), [
    (100.0, "the step went from 140.0 ms to 100.0 ms, 29% less"),
    (136.0, ""),  # 2.9 % faster: not a new speed
    (150.0, "the step went from 140.0 ms to 150.0 ms, 7.1% more"),
])
def test_did_the_fix_pay(now_ms: float, said: str) -> None:
    from perftracker.localizer.diagnose.verdict.since_fast import fix_paid

    text = fix_paid(_predicted(140.0, 0.25), now_ms, now_ns=HOUR_NS // 5)
    assert text.endswith(said)
    if said:
        assert text.startswith("the previous report (session prev-1, 12 min ago) predicted that fixing forward "
                               "would save 25% of the step (replayed over 8 steps)")
    assert fix_paid(_predicted(140.0, 0.0), now_ms, now_ns=0) == ""  # no saving predicted
