"""The first look (localizer/diagnose/incidents/first_look.py, issue 30): per-rank phase times from the hooks
name a rank and a phase, or leave it to the window. Twins: found / not found, near the bar."""

from __future__ import annotations

import numpy as np
import pytest
from perftracker.localizer.diagnose.incidents.first_look import PHASES, FirstLookOptions, first_look

from perftracker.runtime import phase_times


def _job(seed: int, ranks: int = 4, steps: int = 40, data: float = 5.0, step: float = 10.0, rest: float = 85.0,
         extra: dict[tuple[int, int], float] | None = None) -> dict[int, np.ndarray]:
    """Each rank's steps × (data, step, rest) in ms, with 3 % noise; ``extra[(rank, phase)]`` adds
    ms to one rank's phase and, as a synchronous job does, lets the other ranks wait that long in
    the rest (their collectives)."""
    rng = np.random.default_rng(seed)
    out = {}
    for r in range(ranks):
        base = np.array([data, step, rest])
        for (er, p), ms in (extra or {}).items():
            if r == er:
                base[p] += ms
            else:
                base[2] += ms
        out[r] = base * rng.normal(1.0, 0.03, size=(steps, 3))
    return out


def test_phase_names_are_the_runtimes() -> None:
    assert PHASES == phase_times.PHASES


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_one_rank_slow_in_data_loading_is_named_and_a_clean_job_is_not(seed: int) -> None:
    got = first_look(_job(seed, extra={(2, 0): 40.0}))
    assert got.named and got.ranks == (2,) and got.phase == "data loading" and got.kind == "one_rank"
    assert got.share == pytest.approx(40.0 / 140.0, rel=0.15)  # the job's step is 100 + 40 ms
    assert "rank 2" in got.title and len(got.title) <= 120
    clean = first_look(_job(seed))
    assert not clean.named and clean.needs_window


@pytest.mark.parametrize("seed", [4, 5])
def test_one_rank_slow_in_its_optimizer_step_is_named(seed: int) -> None:
    got = first_look(_job(seed, extra={(1, 1): 30.0}))
    assert got.ranks == (1,) and got.phase == "optimizer step"


@pytest.mark.parametrize("seed", [6, 7, 8])
def test_near_the_bar(seed: int) -> None:
    # the bar: 10 % of the step; the step is 100 ms + the excess (the peers wait it out)
    bar = FirstLookOptions().min_share
    below, above = 0.9 * bar * 100 / (1 - 0.9 * bar), 1.1 * bar * 100 / (1 - 1.1 * bar)
    assert not first_look(_job(seed, extra={(3, 0): below})).named
    assert first_look(_job(seed, extra={(3, 0): above})).ranks == (3,)


def test_two_ranks_slow_in_the_same_phase_are_not_one_rank() -> None:
    got = first_look(_job(9, ranks=8, extra={(2, 0): 40.0, (5, 0): 35.0}))
    assert not got.named


@pytest.mark.parametrize("seed", [10, 11])
def test_a_rank_slower_in_forward_backward_needs_the_window(seed: int) -> None:
    rng = np.random.default_rng(seed)
    job = _job(seed)
    job[0] = job[0] + np.array([0.0, 0.0, 50.0]) * rng.normal(1.0, 0.03, size=(40, 1))
    got = first_look(job)
    assert not got.named and got.needs_window and "rank 0" in got.reason


@pytest.mark.parametrize("seed", [12, 13])
def test_every_rank_slower_in_data_loading_is_named_with_the_before_and_not_without(seed: int) -> None:
    before = _job(seed)
    now = _job(seed + 100, data=45.0)
    got = first_look(now, before)
    assert got.kind == "all_ranks" and got.ranks == (0, 1, 2, 3) and got.phase == "data loading"
    assert got.reference_ms == pytest.approx(5.0, rel=0.1) and got.ms == pytest.approx(45.0, rel=0.1)
    assert not first_look(now).named  # the same times without the before: nothing stands out across ranks
    # twin: every rank slower in forward/backward instead
    slower_rest = _job(seed + 100, rest=125.0)
    assert not first_look(slower_rest, before).named


def test_too_few_steps_names_nothing() -> None:
    got = first_look({r: a[:5] for r, a in _job(14, extra={(2, 0): 40.0}).items()})
    assert not got.named and "steps" in got.reason


def test_runtime_hooks_measure_the_phases() -> None:
    """The hooks' ledger with an injected clock: data 7 ms, step 3 ms, rest 20 ms per step."""
    pt = phase_times.PhaseTimes()
    t = 0
    for _ in range(5):
        pt.data_entered(t)
        t += 7_000_000
        pt.data_returned(t)
        t += 20_000_000
        pre = t
        t += 3_000_000
        pt.step_done(pre, t)
    got = pt.recent_ms()
    assert got.shape == (4, 3)
    assert np.allclose(got, [[7.0, 3.0, 20.0]] * 4)



def _reference_rows(events: list[int]) -> list[tuple[int, int, int]]:
    """The phase ledger's rows by its definition, one instant at a time (the stateful code the
    hooks ran before issue 45)."""
    from perftracker.runtime.hooks import DATA_DONE, DATA_NEXT, STEP_PRE

    rows, enter, data, pre = [], -1, 0, -1
    for e in events:
        code, t = e & 3, e >> 2
        if code == DATA_NEXT:
            enter = t
        elif code == DATA_DONE:
            if enter >= 0:
                data += t - enter
                enter = -1
        elif code == STEP_PRE:
            pre = t
        else:
            rows.append((t, data, t - pre if 0 <= pre <= t else 0))
            data = 0
    return rows


def test_phase_times_from_the_event_log_equal_the_one_by_one_ledger() -> None:
    """The hooks log coded instants (perftracker/runtime/hooks.py), the runtime feeds them in
    chunks, the rows are computed when read: they equal the one-by-one ledger's, with two data
    waits per step, steps with no data wait, a DataLoader entry that never returns (StopIteration),
    a return without an entry, and a ring that has dropped its oldest instants."""
    from perftracker.runtime.hooks import DATA_DONE, DATA_NEXT, STEP_POST, STEP_PRE

    rng = np.random.default_rng(7)
    events: list[int] = []
    t = 1_000_000
    for step in range(300):
        for _ in range(0 if step % 7 == 3 else 2):
            t += int(rng.integers(1, 5_000_000))
            events.append((t << 2) | DATA_NEXT)
            if step % 11 == 5:  # the iterator ran out: no return, a new entry follows
                continue
            t += int(rng.integers(1, 5_000_000))
            events.append((t << 2) | DATA_DONE)
        if step % 13 == 6:
            events.append((t << 2) | DATA_DONE)  # a return whose entry was already counted
        t += int(rng.integers(1, 20_000_000))
        events.append((t << 2) | STEP_PRE)
        t += int(rng.integers(0, 3_000_000))
        events.append((t << 2) | STEP_POST)
    want = _reference_rows(events)
    pt = phase_times.PhaseTimes(maxlen=1000, events_maxlen=100_000)
    cuts = sorted({int(c) for c in rng.integers(0, len(events), 12)}) + [len(events)]
    start = 0
    for cut in cuts:
        pt.feed(events[start:cut])
        start = cut
    assert pt.rows == want and len(want) == 300
    assert pt.pre_ns == max(e >> 2 for e in events if e & 3 == STEP_PRE) == pt.post_ns - (want[-1][2])
    assert pt.recent_ms()[:, 0].min() == 0.0 and pt.recent_ms()[:, 0].max() > 0.0
    # a ring that dropped its oldest instants: the last 100 steps are still exact
    small = phase_times.PhaseTimes(maxlen=100, events_maxlen=600)
    small.feed(events)
    assert small.rows == want[-100:]
    assert np.array_equal(small.recent_ms(), phase_times.phases_ms(want[-100:]))
