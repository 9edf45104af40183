"""Scenario parsing and scoring for the fault benchmark (bench/faults.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.faultkit.scenario import load_scenario, parse_scenario
from bench.faultkit.scoring import score
from perftracker.errors import ConfigError
from perftracker.model import Box, Category, Finding, RankState, Report, Triple

SCENARIOS = sorted((Path(__file__).resolve().parents[2] / "bench" / "scenarios").glob("**/*.toml"))

BASE = """
name = "t"
workers = 4
window_s = 5
trigger = "cli"
trigger_at_iter = 100
[[fault]]
kind = "cpu_quota"
ranks = [2]
fraction = 0.3
[[expect]]
ranks = [2]
category = "compute"
kind = "specific"
[[allow]]
ranks = "*"
category = "collective"
"""


def _finding(category: Category, ranks: tuple[int, ...], kind: str = "specific", key: str = "aten::mm") -> Finding:
    t = Triple(0.1, 0.5, 0.1)
    return Finding(key, key, category, ranks, kind, ("differential",), t, t, Box(t, t), "s")


def _report(*findings: Finding, hang: tuple[RankState, ...] = ()) -> Report:
    return Report("j", "s", "hang" if hang else "slowdown", 0, "cli", 5.0, (0, 1, 2, 3),
                  findings=findings, hang_states=hang)


def test_every_shipped_scenario_parses() -> None:
    assert len(SCENARIOS) >= 10
    names = {load_scenario(p).name for p in SCENARIOS}
    for needed in ("clean-s0", "clean-s1", "clean-s2", "slow-compute-rank", "slow-dataloader-all",
                   "slow-net-rank", "python-hotspot-all", "gc-stall-random", "onset-slow-compute", "hang-rank"):
        assert needed in names


def test_parse_resolves_ranks_and_params() -> None:
    s = parse_scenario(BASE)
    assert s.faults[0].ranks == (2,) and s.faults[0].params == {"fraction": 0.3}
    assert s.expect[0].ranks == (2,) and s.allow[0].ranks is None
    assert parse_scenario(BASE, workers_override=8).workers == 8


@pytest.mark.parametrize(
    "bad, msg",
    [
        (BASE.replace('kind = "cpu_quota"', 'kind = "melt"'), "fault[0].kind"),
        (BASE.replace("fraction = 0.3", "fraction = 3.0"), "fraction"),
        (BASE.replace("ranks = [2]\nfraction", "ranks = [9]\nfraction"), "outside"),
        (BASE.replace('category = "compute"', 'category = "disk"'), "category"),
        (BASE.replace('trigger = "cli"', 'trigger = "sometimes"'), "trigger"),
        (BASE + "\nbogus = 1\n", "unknown keys"),
        (BASE.replace("fraction = 0.3", "mbit = 3"), "takes"),
        ("name = ", "invalid TOML"),
    ],
)
def test_bad_scenarios_get_clear_errors(bad: str, msg: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(msg)):
        parse_scenario(bad, "x.toml")


def test_score_true_false_and_neutral() -> None:
    s = parse_scenario(BASE)
    rep = _report(
        _finding(Category.COMPUTE, (2,)),
        _finding(Category.COLLECTIVE, (0, 1, 3), kind="common", key="gloo:all_reduce"),
        _finding(Category.PYTHON, (0,)),
    )
    sc = score(s, rep)
    assert sc.tp == {(2, "compute")}
    assert sc.neutral == {(0, "collective"), (1, "collective"), (3, "collective")}
    assert sc.fp == {(0, "python")}
    assert sc.precision == pytest.approx(0.5) and sc.recall == 1.0


def test_score_kind_must_agree_and_missing_is_recall_loss() -> None:
    s = parse_scenario(BASE)
    sc = score(s, _report(_finding(Category.COMPUTE, (2,), kind="common")))
    assert sc.tp == set() and sc.fp == {(2, "compute")} and sc.recall == 0.0
    assert score(s, None).recall == 0.0 and score(s, None).precision == 1.0


def test_every_report_of_a_run_is_scored() -> None:
    """A detector that fired on noise before the onset, then at it: both reports count."""
    s = parse_scenario(BASE)
    before, at_onset = _report(), _report(_finding(Category.COMPUTE, (2,)))
    sc = score(s, [before, at_onset])
    assert sc.tp == {(2, "compute")} and sc.recall == 1.0 and sc.precision == 1.0
    sc = score(s, [_report(_finding(Category.PYTHON, (1,))), at_onset])
    assert sc.fp == {(1, "python")} and sc.precision == pytest.approx(0.5)
    assert score(s, []).recall == 0.0


def test_clean_scenario_any_finding_is_false_positive() -> None:
    s = parse_scenario('name = "c"\nworkers = 4\n')
    assert score(s, _report()).precision == 1.0
    sc = score(s, _report(_finding(Category.COMPUTE, (1,))))
    assert sc.fp == {(1, "compute")} and sc.precision == 0.0


def test_hang_states_score_as_hang_findings() -> None:
    s = parse_scenario('name = "h"\nworkers = 4\n[[expect]]\nranks = [2]\ncategory = "hang"\nname = "forward"\n')
    hang = (
        RankState(2, "culprit", "perftracker/examples/train.py:88 in forward (time.sleep)"),
        RankState(0, "waiting", "c10d allreduce"),
    )
    sc = score(s, _report(hang=hang))
    assert sc.tp == {(2, "hang")} and sc.fp == set() and sc.recall == 1.0
    wrong = (RankState(1, "culprit", "perftracker/examples/train.py:88 in forward"),)
    sc = score(s, _report(hang=wrong))
    assert sc.fp == {(1, "hang")} and sc.recall == 0.0


def test_baseline_key() -> None:
    """``baseline = true``: the harness's localizer takes the job's healthy baseline (issue 49)."""
    assert parse_scenario(BASE).baseline is False
    assert parse_scenario("baseline = true\n" + BASE).baseline is True
    with pytest.raises(ConfigError, match="baseline must be true or false"):
        parse_scenario('baseline = "yes"\n' + BASE, "x.toml")
    assert load_scenario(Path(__file__).resolve().parents[2] / "bench" / "scenarios" / "onset-slow-op-all.toml").baseline
