"""What fixing a culprit would save, by replaying the recorded steps (issue 28; localizer/diagnose/verdict/replay.py).

The records are written by a small job model below, not by the replay: a DP × PP2 job where, per
step, a stage-0 rank computes ``a`` ms, sends to its stage-1 partner (1 ms), computes 5 ms and
all-reduces with the other stage-0 ranks (2 ms); a stage-1 rank receives, computes 12 ms and
all-reduces with the other stage-1 ranks (2 ms). Stage 0 sets the pace: a period of a + 8 ms, so
rank 0 at a = 10 + x, every other stage-0 rank at 10, saves x / (18 + x) when fixed.
"""

from __future__ import annotations

import numpy as np
import pytest
from perftracker.localizer.diagnose.verdict.replay import (
    CONSISTENT,
    off_recorded,
    predecessors,
    replay_saving,
)

from perftracker.model.step_record import RecordVersionError, StepRecord

MS = 1000  # the record's unit is µs


def _job(a: dict[int, float], dp: int = 4, steps: int = 6, host_ms: dict[int, float] | None = None,
         pause: dict[int, dict[int, float]] | None = None, link: dict[int, float] | None = None
         ) -> list[StepRecord]:
    """Records of a DP ``dp`` × PP2 job (rank = 2 d + stage) whose stage-0 ranks compute ``a[r]`` ms
    (default 10) before their send, by a forward pass of the job's dependencies. ``pause``: rank ->
    {step: ms more before its send in that step}; ``link``: rank -> how many times as long the
    transfers of every instance it is in take (a slow link: its partner's and its group's too)."""
    n = 2 * dp
    slow = link or {}
    rows: list[list[tuple[int, int, int, int, int, int, int, int]]] = [[] for _ in range(n)]
    free = np.zeros(n)  # when each rank's previous instance ended
    bounds: list[list[float]] = [[0.0] for _ in range(n)]
    for k in range(steps):
        send_end = {}
        for d in range(dp):
            r0, r1 = 2 * d, 2 * d + 1
            work = a.get(r0, 10.0) + (pause or {}).get(r0, {}).get(k, 0.0)
            arrive0 = free[r0] + work
            arrive1 = free[r1]  # the recv is posted at once
            end = max(arrive0, arrive1) + 1.0 * max(slow.get(r0, 1.0), slow.get(r1, 1.0))
            rows[r0].append((1, 1, k, r0, r1, int(arrive0 * MS), int((end - arrive0) * MS), int(work * MS)))
            rows[r1].append((1, 1, k, r0, r1, int(arrive1 * MS), int((end - arrive1) * MS), 0))
            send_end[d] = end
        for stage, compute in ((0, 5.0), (1, 12.0)):
            arrive = {2 * d + stage: send_end[d] + compute for d in range(dp)}
            end = max(arrive.values()) + 2.0 * max(slow.get(r, 1.0) for r in arrive)
            for r, t in arrive.items():
                rows[r].append((0, 0, k, -1, -1, int(t * MS), int((end - t) * MS), int(compute * MS)))
                free[r] = end
        for r in range(n):
            bounds[r].append(free[r])
    out = []
    for r in range(n):
        steps_us = tuple(int(x * MS) for x in np.diff(bounds[r]))
        host = tuple(int(h * MS) for h in [host_ms[r]] * steps) if host_ms and r in host_ms else ()
        if host_ms and not host:
            host = tuple(int(h * MS) for h in [host_ms.get(-1, 0.0)] * steps)
        rs = sorted(rows[r], key=lambda x: x[5])
        out.append(StepRecord(steps_us, (f"dp{r % 2}", f"pp{r // 2}"), ("DATA_PARALLEL_GROUP:allreduce", "PIPE:send"),
                              tuple(rs), host))
    return out


def _stage(dp: int = 4) -> np.ndarray:
    return np.array([r % 2 for r in range(2 * dp)])


@pytest.mark.parametrize("x", [2.0, 6.0, 20.0])
def test_a_slowed_rank_saves_its_share_of_the_period(x: float) -> None:
    r = replay_saving(_job({0: 10.0 + x}), [0], _stage())
    assert r is not None and not r.inconclusive
    assert r.saves == pytest.approx(x / (18.0 + x), abs=0.01)
    assert r.steps >= 3


def test_a_clean_job_saves_nothing_whoever_is_named() -> None:
    recs = _job({})
    for culprit in range(8):
        r = replay_saving(recs, [culprit], _stage())
        assert r is not None and not r.inconclusive
        assert r.saves == pytest.approx(0.0, abs=0.005)


def test_a_standing_late_rank_is_not_fixed_with_the_culprit() -> None:
    """Rank 4 is 4 ms late in every step of its own accord, rank 0 6 ms: fixing rank 0 brings the
    period from 24 to 22 ms (8%), not to 18 (25%): rank 4 still holds the all-reduce."""
    r = replay_saving(_job({0: 16.0, 4: 14.0}), [0], _stage())
    assert r is not None and not r.inconclusive
    assert r.saves == pytest.approx(2.0 / 24.0, abs=0.01)
    both = replay_saving(_job({0: 16.0, 4: 14.0}), [0, 4], _stage())
    assert both is not None and both.saves == pytest.approx(6.0 / 24.0, abs=0.01)


def test_a_stage_one_rank_is_compared_with_stage_one() -> None:
    """Stage 1 has slack (its cycle is 15 ms of stage 0's 18): a stage-1 rank named as a culprit saves
    nothing, even though its gaps differ from stage 0's."""
    r = replay_saving(_job({}), [1], _stage())
    assert r is not None and r.saves == pytest.approx(0.0, abs=0.005)


def test_the_host_floor_bounds_the_saving() -> None:
    """Every host needs 22 ms of its own per step: with rank 0 fixed the step cannot go below 22 ms
    (the period 24 -> 22: 8%), whatever the GPU-side replay says (24 -> 18)."""
    recs = _job({0: 16.0}, host_ms={-1: 22.0})
    r = replay_saving(recs, [0], _stage())
    assert r is not None and r.saves == pytest.approx(2.0 / 24.0, abs=0.01)
    # the culprit's own host is its peers' once fixed: a culprit host of 23.5 ms does not hold it up
    recs = _job({0: 16.0}, host_ms={0: 23.5, -1: 17.0})
    r = replay_saving(recs, [0], _stage())
    assert r is not None and r.saves == pytest.approx(6.0 / 24.0, abs=0.01)
    # a cause on its GPU leaves its host as it is: its own 23.5 ms still bound the step
    gpu = replay_saving(recs, [0], _stage(), host=False)
    assert gpu is not None and gpu.saves == pytest.approx(0.5 / 24.0, abs=0.01)


@pytest.mark.parametrize("scale, conclusive", [(1 + 0.9 * CONSISTENT, True), (1 + 1.1 * CONSISTENT, False),
                                               (1 - 0.9 * CONSISTENT, True), (1 - 1.1 * CONSISTENT, False)])
def test_the_replay_must_reproduce_the_recorded_steps(scale: float, conclusive: bool) -> None:
    recorded = np.array([18000.0, 18000.0, 24000.0, 18000.0])
    assert (off_recorded(recorded * scale, recorded) <= CONSISTENT) is conclusive


def test_no_like_peer_is_inconclusive_and_no_record_is_none() -> None:
    recs = _job({0: 16.0})
    # every other stage-0 rank ran other instances (a different group description)
    other = [StepRecord(r.steps_us, r.groups, ("OTHER:allreduce", "OTHER:send"), r.rows) if i % 2 == 0 and i else r
             for i, r in enumerate(recs)]
    r = replay_saving(other, [0], _stage())
    assert r is not None and r.inconclusive.startswith("no peer")
    missing: list[StepRecord | None] = [None, *recs[1:]]
    assert replay_saving(missing, [0], _stage()) is None


def test_instances_that_do_not_line_up_are_inconclusive() -> None:
    """Rank 1's all-reduces are numbered one on from its group's: each waits for another step's."""
    recs = _job({0: 16.0})
    r1 = recs[1]
    bad = tuple((g, k, seq + 1 if k == 0 else seq, s, d, a, du, c) for g, k, seq, s, d, a, du, c in r1.rows)
    recs[1] = StepRecord(r1.steps_us, r1.groups, r1.kinds, bad, r1.host_us)
    r = replay_saving(recs, [0], _stage())
    assert r is not None and r.inconclusive != ""


def test_a_send_and_its_recv_numbered_apart_are_one_transfer() -> None:
    """Issue 44: a trace's point-to-point ``seq`` counts each rank's own operations (on a pipeline
    deeper than two stages a send and its recv carry different numbers): the k-th of a directed
    channel on the sender is the k-th on the receiver, and the replay finds the same saving."""
    recs = _job({0: 16.0})
    want = replay_saving(recs, [0], _stage())
    for r in range(len(recs)):
        rec = recs[r]
        moved = tuple((g, k, seq + 100 * (r + 1) if s >= 0 else seq, s, d, a, du, c)
                      for g, k, seq, s, d, a, du, c in rec.rows)
        recs[r] = StepRecord(rec.steps_us, rec.groups, rec.kinds, moved, rec.host_us)
    got = replay_saving(recs, [0], _stage())
    assert want is not None and got is not None and not got.inconclusive
    assert got.saves == pytest.approx(want.saves) and got.saves == pytest.approx(6.0 / 24.0, abs=0.01)


def test_predecessors_skip_instances_still_running() -> None:
    """A send and a recv launched together follow the same instance, not each other."""
    arrival = np.array([0.0, 10.0, 10.0, 30.0])
    end = np.array([5.0, 20.0, 25.0, 31.0])
    assert predecessors(arrival, end).tolist() == [-1, 0, 0, 2]


def test_record_round_trips_and_refuses_another_version() -> None:
    rec = _job({0: 16.0}, dp=2, steps=3, host_ms={-1: 5.0})[0]
    assert StepRecord.from_dict(rec.to_dict()) == rec
    d = rec.to_dict() | {"v": 99}
    with pytest.raises(RecordVersionError):
        StepRecord.from_dict(d)


def test_a_large_job_replays_a_bounded_part_of_it() -> None:
    """DP600 x PP2: the culprit's data-parallel group has 600 members; at most MAX_RANKS are
    replayed (the rest taken as on time, which they are here), and only their chains are built."""
    import time

    from perftracker.localizer.diagnose.verdict.replay import MAX_RANKS, _connected

    recs = _job({0: 16.0}, dp=600, steps=4)
    assert len(_connected(recs, [0])) == MAX_RANKS
    t0 = time.process_time()
    r = replay_saving(recs, [0], _stage(600))
    assert time.process_time() - t0 < 10.0
    assert r is not None and r.saves == pytest.approx(6.0 / 24.0, abs=0.01)


@pytest.mark.parametrize("first", [0, 1])
def test_a_pause_every_other_step_counts_in_every_step_of_the_record(first: int) -> None:
    """Rank 0 pauses 12 ms in every other step (from step ``first``) of 6: three pauses, 36 ms over
    6 x 18 + 36 ms, a saving of 25% whichever steps hold them. Left out, the record's first step
    would read 2 pauses in 5 steps (21%) or 3 in 5 (29%)."""
    recs = _job({}, pause={0: {k: 12.0 for k in range(first, 6, 2)}})
    r = replay_saving(recs, [0], _stage())
    assert r is not None and not r.inconclusive and r.steps == 6
    assert r.saves == pytest.approx(36.0 / 144.0, abs=0.01)
    clean = replay_saving(_job({}), [0], _stage())
    assert clean is not None and clean.saves == pytest.approx(0.0, abs=0.005)


@pytest.mark.parametrize("factor", [1.5, 3.0])
def test_a_slow_link_in_instances_its_peers_share_needs_its_port_to_say_the_saving(factor: float) -> None:
    """Rank 0's link makes every instance it is in ``factor`` times as long: its send (1 ms) and its
    stage's all-reduce (2 ms), which its like peers (ranks 2, 4, 6) are in too. The period grows by
    3 (factor - 1) ms. Its peers' transfers of the same all-reduce are as slow as its own, so the
    like-peer replay sees only the send; with the port's healthy share (1 / factor of the time)
    the replay gives the whole excess, and with a port stalled like its peers' (a share of 1)
    nothing."""
    recs = _job({}, link={0: factor})
    excess = 3.0 * (factor - 1.0)
    want = excess / (18.0 + excess)
    peers = replay_saving(recs, [0], _stage(), host=False)
    assert peers is not None and peers.saves == pytest.approx((factor - 1.0) / (18.0 + excess), abs=0.01)
    port = replay_saving(recs, [0], _stage(), host=False, link_scale={0: 1.0 / factor})
    assert port is not None and not port.inconclusive and port.saves == pytest.approx(want, abs=0.01)
    same = replay_saving(recs, [0], _stage(), host=False, link_scale={0: 1.0})
    assert same is not None and same.saves == pytest.approx(0.0, abs=0.005)
