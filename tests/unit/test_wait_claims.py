"""Which cause a wait belongs to (issue 28): a rank late in its data-parallel group on the light
pipeline stage also waits at its pipeline send/recv, as every rank of that stage does for the heavy
stage. That wait explains its lateness only by what it waits there *beyond* the ranks that wait for
it: the stage explains the stage's p2p wait, not the data-parallel group's wait for one of its own
members that arrives last. Pure logic on hand-built arrays; each case has a twin that must not be
found, and one probe on each side of the bar (``_EXPLAINS`` = half the lateness)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from dp_pp_sets import dp_pp_set
from perftracker.localizer.diagnose.evidence.waits import LateGroup, WaitOptions, wait_roots
from perftracker.localizer.diagnose.localize import localize

from perftracker.model import PatternSet


def _lg(f: int, late: list[int], waiting: list[int], group: int, share: float) -> LateGroup:
    return LateGroup(f, np.array(late), np.array(waiting), share, group)


def _pipes(p2p: dict[int, float], n_dp: int = 4) -> list[LateGroup]:
    """Stage 0 (even ranks) waits for stage 1 at each pipeline's send/recv (function 0, group d)."""
    return [_lg(0, [2 * d + 1], [2 * d], d, p2p.get(2 * d, 0.2)) for d in range(n_dp)]


# --- wait_roots --------------------------------------------------------------------------------------

def test_a_rank_late_in_its_dp_group_is_its_root_when_its_peers_wait_at_the_p2p_as_much() -> None:
    dp = _lg(1, [4], [0, 2, 6], 10, 0.12)  # the stage-0 all-reduce (function 1) waits for rank 4
    groups = [*_pipes({}), dp]
    _, roots = wait_roots(groups)
    assert roots[4] == 4  # rank 4's p2p wait (0.2) is its peers' too: it explains nothing of its lateness


@pytest.mark.parametrize("extra, followed", [(0.0, False), (0.055, False), (0.065, True), (0.2, True)])
def test_only_the_wait_beyond_the_peers_explains_a_lateness(extra: float, followed: bool) -> None:
    # rank 4 waits at its send/recv `extra` more than its data-parallel peers; late 0.12 at the all-reduce
    groups = [*_pipes({4: 0.2 + extra}), _lg(1, [4], [0, 2, 6], 10, 0.12)]
    _, roots = wait_roots(groups)
    assert (roots[4] == 2) is followed  # group 2 is rank 4's pipeline


def test_peers_that_wait_at_no_p2p_leave_the_rule_as_it_was() -> None:
    # the peers' p2p waits are not material (no late group): the whole 0.2 is rank 4's own
    groups = [_lg(0, [5], [4], 2, 0.2), _lg(1, [4], [0, 2, 6], 10, 0.12)]
    assert wait_roots(groups)[1] == [0, 0]


# --- localize: DP4 x PP2, stage 1 heavy, rank 4 (stage 0) late at its all-reduce ------------------------

def _job(slow_s: float, p2p_extra: float = 0.0, n_dp: int = 4) -> list[PatternSet]:
    """Rank r = 2 d + s. Stage 1 computes 1.5x stage 0 (0.6 against 0.4 of the window); stage 0 waits for
    it at the pipeline send/recv (0.25). Rank 4 computes ``slow_s`` more and its stage-0 peers wait that
    long for it at the data-parallel all-reduce; it waits ``p2p_extra`` more than they do at its send/recv."""
    n = 2 * n_dp
    sets = []
    rng = np.random.default_rng(28)
    for r in range(n):
        d, s = divmod(r, 2)
        jitter = 1.0 + 0.01 * float(rng.standard_normal())
        gemm = (0.4 if s == 0 else 0.6) * jitter
        sendrecv = 0.25 if s == 0 else 0.05
        allreduce = 0.05
        if r == 4:
            gemm += slow_s
            sendrecv += p2p_extra
        elif s == 0:
            allreduce += slow_s
        sets.append(dp_pp_set(r, n, gemm, sendrecv, allreduce))
    return sets


def test_a_rank_late_on_the_light_stage_is_named_first_beside_the_stage() -> None:
    report = localize(_job(0.12))
    first = report.findings[0]
    assert first.ranks == (4,), [(f.key, f.ranks) for f in report.findings]
    assert {r for w in first.waits for r in w.ranks} == {0, 2, 6}  # its data-parallel peers wait for it
    stage = [f for f in report.findings if f.key == "pipeline stage imbalance"]
    assert stage and stage[0].ranks == (1, 3, 5, 7)
    assert not [f for f in report.findings if f.ranks and set(f.ranks) <= {0, 2, 6}]  # no victim on its own


def test_the_same_job_with_no_late_rank_names_the_stage_only() -> None:
    report = localize(_job(0.0))
    assert [f.key for f in report.findings if len(f.ranks) < 8] == ["pipeline stage imbalance"]


@pytest.mark.parametrize("slow_s, found", [(0.04, False), (0.07, True)])
def test_near_the_wait_bar(slow_s: float, found: bool) -> None:
    # the peers' wait for rank 4 is slow_s of the window: material from wait_min (0.05). Near the bar
    # it is found but costs less than the stage (0.2): the stage leads, by impact
    report = localize(_job(slow_s))
    named = [f for f in report.findings if f.ranks == (4,)]
    assert bool(named) is found
    if found:
        assert {r for w in named[0].waits for r in w.ranks} == {0, 2, 6}
    assert report.findings[0].key == "pipeline stage imbalance"


def test_a_rank_that_waits_at_the_p2p_well_beyond_its_peers_is_the_stage_s_victim() -> None:
    # rank 4 waits 0.1 more at its send/recv than its peers: its lateness (0.12) is its partner's doing,
    # and the partner is of the heavy stage: the stage takes the wait, no rank is named
    report = localize(_job(0.12, p2p_extra=0.1))
    assert not [f for f in report.findings if f.ranks == (4,)]
    assert report.findings[0].key == "pipeline stage imbalance"


# --- a steady late rank inside a step group whose slowest rank moves ------------------------------------

def _moving_steps(extra_ms: float, seed: int = 5) -> np.ndarray:
    """8 members x 40 steps of ~10 ms; each step one member (cycling) computes 3 ms more (moving work);
    member 2 computes ``extra_ms`` more in every step."""
    rng = np.random.default_rng(seed)
    s = 10.0 + 0.1 * rng.standard_normal((8, 40))
    s[np.arange(40) % 8, np.arange(40)] += 3.0
    s[2] += extra_ms
    return s


@pytest.mark.parametrize("extra_ms, steady", [(0.0, False), (0.2, False), (0.5, True), (1.0, True)])
def test_a_steady_excess_is_told_from_moving_work(extra_ms: float, steady: bool) -> None:
    from perftracker.localizer.diagnose.evidence.imbalance import moving_in_group, steady_excess

    s = _moving_steps(extra_ms)
    assert moving_in_group(s, WaitOptions())[0]  # the group's slowest rank moves, in every case
    window_s = 0.4
    wait = 0.05  # the wait a late group of member 2 would show (wait_min): half of it is 0.025 = 0.25 ms a step
    excess = steady_excess(s, np.zeros(8, dtype=np.int64), 0, np.array([2]), window_s)
    assert (excess >= 0.5 * wait) is steady
    assert steady_excess(s, np.zeros(8, dtype=np.int64), 0, np.array([5]), window_s) < 0.5 * wait
    assert steady_excess(None, None, 0, np.array([2]), window_s) == 0.0


def _moving_job(steady_ms: float, n_dp: int = 8, steps: int = 40) -> list[PatternSet]:
    """_job's layout (DP n_dp x PP2, stage 1 heavy) with per-step compute in each data-parallel
    group: every step one member (cycling) computes 8 ms more (moving work); rank 4 computes
    ``steady_ms`` more in every step. Its stage-0 peers wait 0.06 of the 1 s window for it at the
    all-reduce, as the β says, whatever the steps say."""
    sets = _job(0.06, n_dp=n_dp)
    rng = np.random.default_rng(7)
    out = []
    for ps in sets:
        r = ps.rank
        d, s = divmod(r, 2)
        base = 10.0 if s == 0 else 15.0
        x = base + 0.1 * rng.standard_normal(steps)
        x[np.arange(steps) % n_dp == d] += 8.0
        if r == 4:
            x += steady_ms
        out.append(dataclasses.replace(ps, steps_ms=tuple(float(v) for v in x), step_group=f"dp{s}"))
    return out


@pytest.mark.parametrize("steady_ms, named", [(0.0, False), (1.5, True)])
def test_a_steady_late_rank_keeps_its_wait_from_the_moving_cause(steady_ms: float, named: bool) -> None:
    # 1.5 ms x 40 steps = 0.06 of the window: the steps explain the all-reduce's wait (0.06) and the
    # group's means are still "even" for the moving test (1.5 < half of 8); without it the wait is the
    # moving work's
    report = localize(_moving_job(steady_ms))
    keys = [f.key for f in report.findings]
    assert any(k.startswith("moving imbalance") for k in keys), keys
    rank4 = [f for f in report.findings if f.ranks == (4,)]
    assert bool(rank4 and {r for w in rank4[0].waits for r in w.ranks} == set(range(0, 16, 2)) - {4}) is named
