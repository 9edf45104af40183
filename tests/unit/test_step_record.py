"""The worker's step record (issue 28): what the summarizer writes, how it travels, what a reader
without it or with another version does."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from perftracker.agent.kineto import RankInfo, window_from_trace
from perftracker.agent.summarize.step_record import MAX_ROWS, MAX_STEPS
from perftracker.agent.summarize.summarizer import summarize_window
from perftracker.localizer.diagnose.method.arrays import pattern_sets_to_arrays
from perftracker.localizer.diagnose.verdict.replay import replay_saving

from perftracker.model import PatternSet
from perftracker.wire.patterns import batch_to_sets, decode_batch, encode_sets
from tests.unit.test_process_groups import _doc, _kernel


def _sets(steps: dict[int, list[float]]) -> list[PatternSet]:
    out = []
    for r in range(4):
        raw = window_from_trace(_doc(r, steps.get(r, [100.0] * 6)), Path(f"r{r}.json"), RankInfo(r, 4, "distributedInfo"))
        out.append(summarize_window(raw))
    return out


def test_the_summary_records_each_instance_of_the_last_steps() -> None:
    ps = _sets({})[2]
    rec = ps.step_record
    assert rec is not None and not rec.host_us  # GPU work alone: no host to bound the step
    # steps cut by the data-parallel all-reduce ends: 5 whole steps after the first
    assert len(rec.steps_us) == 5 and all(s == 125 for s in rec.steps_us)
    kinds = [rec.kinds[r[1]] for r in rec.rows]
    assert kinds.count("DATA_PARALLEL_GROUP:allreduce") == 5 and len(rec.rows) == 10
    send = next(r for r in rec.rows if rec.kinds[r[1]].endswith(":send"))
    assert (rec.groups[send[0]], send[3], send[4]) == ("pp2", 2, 3)  # the transfer's two ranks
    assert send[5] == 100 and send[6] == 5 and send[7] == 100  # arrival, time in it, compute before it


def test_the_record_travels_in_the_json_and_the_columnar_forms() -> None:
    sets = _sets({})
    back = batch_to_sets(decode_batch(encode_sets(sets)))
    assert [b.step_record for b in back] == [s.step_record for s in sets]
    assert PatternSet.from_bytes(sets[0].to_bytes()).step_record == sets[0].step_record


def test_a_record_is_bounded() -> None:
    ps = _sets({0: [100.0] * 200})[0]
    rec = ps.step_record
    assert rec is not None and len(rec.steps_us) <= MAX_STEPS and len(rec.rows) <= MAX_ROWS
    assert len(ps.to_bytes()) < 10_000


def test_an_upload_without_a_record_or_of_another_version_still_localizes(caplog: pytest.LogCaptureFixture) -> None:
    sets = _sets({0: [300.0] * 6})
    old = [PatternSet.from_dict({k: v for k, v in s.to_dict().items() if k != "step_record"}) for s in sets]
    assert all(s.step_record is None for s in old)
    assert pattern_sets_to_arrays(old).step_records == ()
    newer = []
    for s in sets:
        d = s.to_dict()
        d["step_record"] = {**d["step_record"], "v": 99}
        newer.append(PatternSet.from_dict(d))
    with caplog.at_level(logging.WARNING):
        again = [PatternSet.from_dict({**s.to_dict(), "step_record": {"v": 99}}) for s in sets]
    assert all(s.step_record is None for s in newer + again) and all(s.patterns for s in newer)
    assert "version 99" in caplog.text


def _job_docs(compute: dict[int, float], steps: int = 6) -> list[dict[str, Any]]:
    """Four ranks of one DP2 x PP2 job timed together: per step each rank computes (``compute``,
    default 100 µs), sends to its pipeline partner (5 µs; the recv is the partner's) and all-reduces
    with its data-parallel peer (20 µs after the later of the two arrives)."""
    docs = [_doc(r, [100.0] * steps) for r in range(4)]
    t = [0.0] * 4
    for d in docs:
        d["traceEvents"] = []
    for i in range(steps):
        sends = {}
        for r in range(4):
            c = compute.get(r, 100.0)
            docs[r]["traceEvents"].append(_kernel("gemm_kernel", t[r], c))
            sends[r] = t[r] + c
        for r in range(4):
            partner = r + 1 if r % 2 == 0 else r - 1
            src, dst = (r, partner) if r % 2 == 0 else (partner, r)
            start = sends[r]
            end = max(sends[r], sends[partner]) + 5.0
            docs[r]["traceEvents"].append(_kernel("ncclDevKernel_SendRecv", start, end - start, **{
                "Collective name": "send" if r % 2 == 0 else "recv", "Process Group Name": f"pp{r - r % 2}",
                "Process Group Ranks": str([r - r % 2, r - r % 2 + 1]), "Seq": i, "Src Rank": src, "Dst Rank": dst}))
            t[r] = end
        for r in range(4):
            peer = (r + 2) % 4
            end = max(t[r], t[peer]) + 20.0
            docs[r]["traceEvents"].append(_kernel("ncclDevKernel_AllReduce_Sum_f32", t[r], end - t[r], **{
                "Collective name": "allreduce", "Process Group Name": f"dp{r % 2}",
                "Process Group Description": "DATA_PARALLEL_GROUP",
                "Process Group Ranks": str([r % 2, r % 2 + 2]), "Seq": i}))
        t = [max(t[r], t[(r + 2) % 4]) + 20.0 for r in range(4)]
    return docs


def _job_arrays(compute: dict[int, float]) -> Any:
    sets = [summarize_window(window_from_trace(d, Path(f"r{r}.json"), RankInfo(r, 4, "distributedInfo")))
            for r, d in enumerate(_job_docs(compute))]
    return pattern_sets_to_arrays(sets)


def test_a_slow_rank_of_a_real_summary_replays_to_its_share() -> None:
    """Rank 0 computes 300 µs where the others compute 100: its pipeline partner waits at every
    transfer, and both data-parallel groups at every all-reduce. Per step 300 + 5 + 20 = 325 µs,
    125 once fixed: a saving of 200 / 325. Rank 2, its stage-0 peer, is what it is compared with."""
    arr = _job_arrays({0: 300.0})
    r = replay_saving(arr.step_records, [0], arr.stage)
    assert r is not None and not r.inconclusive
    assert r.saves == pytest.approx(200 / 325, abs=0.02)
    clean = _job_arrays({})
    c = replay_saving(clean.step_records, [0], clean.stage)
    assert c is not None and not c.inconclusive and c.saves == pytest.approx(0.0, abs=0.01)


def test_traces_that_are_not_one_jobs_timing_are_inconclusive() -> None:
    """Each rank's trace timed alone (rank 0 slow, nobody waiting for it): the instances name each
    other, but the replay of them does not give the recorded steps."""
    arr = pattern_sets_to_arrays(_sets({0: [300.0] * 6}))
    r = replay_saving(arr.step_records, [0], arr.stage)
    assert r is not None and "off the recorded" in r.inconclusive


def test_a_window_without_instances_has_no_record() -> None:
    doc = {"distributedInfo": {"rank": 0, "world_size": 1},
           "traceEvents": [_kernel("gemm", float(i * 10), 5.0) for i in range(20)]}
    raw = window_from_trace(doc, Path("r0.json"), RankInfo(0, 1, "distributedInfo"))
    assert summarize_window(raw).step_record is None


def test_the_report_says_the_replayed_saving_and_its_basis() -> None:
    """Through the localizer: the slow rank's finding carries the replayed saving, says so, and its
    headline line about it no longer calls it an estimate."""
    from perftracker.localizer.diagnose.localize import localize_arrays

    report = localize_arrays(_job_arrays({0: 300.0}))
    f = next(f for f in report.findings if f.ranks == (0,))
    assert f.saves_share == pytest.approx(200 / 325, abs=0.02)
    assert f.saves_basis.startswith("replayed over ")
    assert f.sentence.endswith(f"fixing it would save about {round(100 * f.saves_share)}% of the window")  # issue 47: every share is of the window
    assert all(r not in g.ranks for g in report.findings for r in (1, 2, 3) if g.kind != "common")


@pytest.mark.parametrize("apart, replayed", [(0.9, True), (1.1, False)])
def test_a_culprit_window_apart_from_the_others_keeps_the_estimate(apart: float, replayed: bool) -> None:
    """A culprit whose window runs longer than the others' by more than the replay's consistency bar
    (its GPU work drifting away from its own collectives) is not replayed: the estimate stays, and
    says why. Probed at 0.9x and 1.1x the bar."""
    import dataclasses

    from perftracker.localizer.diagnose.localize import localize_arrays
    from perftracker.localizer.diagnose.verdict.replay import CONSISTENT

    arr = _job_arrays({0: 300.0})
    w = arr.worker_window_s.copy()
    w[0] = float(np.median(w)) * (1.0 + apart * CONSISTENT)
    report = localize_arrays(dataclasses.replace(arr, worker_window_s=w))
    f = next(f for f in report.findings if f.ranks == (0,))
    assert f.saves_basis.startswith("replayed") is replayed
    if not replayed:
        assert "window runs" in f.saves_basis and f.saves_basis.startswith("an estimate")


def test_a_record_that_cannot_be_made_loses_only_the_record(monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    import perftracker.agent.summarize.summarizer as summarizer

    def broken(*_: object) -> None:
        raise IndexError("a malformed window")

    monkeypatch.setattr(summarizer, "step_record", broken)
    raw = window_from_trace(_doc(0, [100.0] * 6), Path("r0.json"), RankInfo(0, 4, "distributedInfo"))
    with caplog.at_level(logging.WARNING):
        ps = summarize_window(raw)
    assert ps.step_record is None and ps.patterns and ps.steps_ms
    assert "no step record" in caplog.text
