"""The group of each gloo collective in offline CPU traces (perftracker.agent.gloo_groups, issue 28).

Real format: tests/fixtures/gloo_dp2pp2 holds the gloo events and ``distributedInfo`` of a real
DP2 x PP2 job on 4 gloo ranks (tests/framework_jobs/pp_dp_gloo.py, torch 2.13, recorded on this
2-core host: a clean run and one with rank 2 slowed), cut down to those fields. Each rule also has a
hand-built case that must be assigned and a twin that must not.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from perftracker.agent.gloo_groups import RankCalls, assign, gloo_calls

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gloo_dp2pp2"


def _job(tag: str) -> list[RankCalls]:
    return [gloo_calls(json.loads((FIXTURES / f"{tag}_rank{r}.json").read_text()), r) for r in range(4)]


@pytest.mark.parametrize("tag", ["clean", "slow_rank2"])
def test_real_dp2_pp2_all_reduce_goes_to_each_ranks_data_parallel_group(tag: str) -> None:
    job = _job(tag)
    dp_of = {r.rank: next(g for g, m in r.groups if m in ((0, 2), (1, 3))) for r in job}
    a = assign(job)
    for r in range(4):
        assert a.groups[(r, "gloo:all_reduce")] == dp_of[r]
    # the members of one group agree, and the two data-parallel groups differ
    assert a.groups[(0, "gloo:all_reduce")] == a.groups[(2, "gloo:all_reduce")] != a.groups[(1, "gloo:all_reduce")]


@pytest.mark.parametrize("tag", ["clean", "slow_rank2"])
def test_real_dp2_pp2_send_recv_stay_unassigned_each_rank_is_in_two_pairs(tag: str) -> None:
    a = assign(_job(tag))
    for r in range(4):
        for name in ("gloo:send", "gloo:recv"):
            assert (r, name) not in a.groups
            assert "2 2-rank groups" in a.unassigned[(r, name)]


def _calls(rank: int, groups: dict[str, tuple[int, ...]], **spans: list[tuple[float, float]]) -> RankCalls:
    return RankCalls(rank, tuple((g, m) for g, m in groups.items() if rank in m),
                     {k.replace("_", ":", 1): np.array(v, dtype=np.float64).reshape(-1, 2) for k, v in spans.items()})


WORLD_DP = {"w": (0, 1, 2, 3), "a": (0, 1), "b": (2, 3)}


def test_a_group_refuted_by_causality_leaves_the_one_that_fits() -> None:
    """Ranks 0,1 all-reduce at t=0-10, ranks 2,3 at t=20-30: WORLD is refuted (rank 2 arrives after
    rank 0 left), each pair fits."""
    job = [_calls(r, WORLD_DP, gloo_all_reduce=[(0.0, 10.0)] if r < 2 else [(20.0, 30.0)]) for r in range(4)]
    a = assign(job)
    assert [a.groups[(r, "gloo:all_reduce")] for r in range(4)] == ["a", "a", "b", "b"]


def test_calls_that_fit_two_groups_are_ambiguous_not_guessed() -> None:
    """The twin: all four overlap, so WORLD and the pairs all fit; nothing is assigned."""
    job = [_calls(r, WORLD_DP, gloo_all_reduce=[(0.0 + r, 10.0 + r)]) for r in range(4)]
    a = assign(job)
    assert not a.groups
    assert all("ambiguous" in a.unassigned[(r, "gloo:all_reduce")] for r in range(4))


def test_causality_at_the_threshold() -> None:
    """The last arrival at the first leaver's end fits; 1 µs later refutes it, unless the clocks
    are allowed that tolerance."""
    def job(late: float) -> list[RankCalls]:
        return [_calls(0, {"g": (0, 1)}, gloo_all_reduce=[(0.0, 10.0)]),
                _calls(1, {"g": (0, 1)}, gloo_all_reduce=[(late, late + 5.0)])]
    assert assign(job(10.0)).groups == {(0, "gloo:all_reduce"): "g", (1, "gloo:all_reduce"): "g"}
    assert not assign(job(11.0)).groups
    assert len(assign(job(11.0), clock_tol_us=1.0).groups) == 2


def test_propagation_a_member_held_by_one_group_settles_its_partner() -> None:
    """Ranks 2 and 3 never overlap, so each has one fitting group: (0, 2) and (1, 3). Ranks 0 and 1
    fit (0, 1) too, alone ambiguous; held by their partners, they follow them."""
    groups = {"p01": (0, 1), "p23": (2, 3), "d02": (0, 2), "d13": (1, 3)}
    spans = {0: (0.0, 10.0), 1: (2.0, 12.0), 2: (9.0, 11.0), 3: (11.5, 13.0)}
    job = [_calls(r, groups, gloo_all_reduce=[spans[r]]) for r in range(4)]
    a = assign(job)
    assert [a.groups.get((r, "gloo:all_reduce")) for r in range(4)] == ["d02", "d13", "d02", "d13"]


def test_different_call_counts_rule_a_group_out() -> None:
    job = [_calls(0, {"g": (0, 1)}, gloo_all_reduce=[(0.0, 10.0), (20.0, 30.0)]),
           _calls(1, {"g": (0, 1)}, gloo_all_reduce=[(0.0, 10.0)])]
    a = assign(job)
    assert not a.groups and "no group" in a.unassigned[(0, "gloo:all_reduce")]


def test_p2p_goes_to_the_ranks_only_pair_when_the_peer_has_the_matching_calls() -> None:
    groups = {"dp": (0, 2, 4, 6), "pp": (0, 1)}
    send = [(0.0, 1.0), (5.0, 6.0)]
    job = [_calls(0, groups, gloo_send=send), _calls(1, groups, gloo_recv=send)]
    a = assign(job)
    assert a.groups == {(0, "gloo:send"): "pp", (1, "gloo:recv"): "pp"}
    # the twin: the peer made one recv for two sends (a window cut them, or they went elsewhere)
    twin = assign([_calls(0, groups, gloo_send=send), _calls(1, groups, gloo_recv=send[:1])])
    assert not twin.groups and "made 1 gloo:recv for 2 gloo:send" in twin.unassigned[(0, "gloo:send")]


def test_malformed_entries_are_skipped() -> None:
    doc = {"distributedInfo": {"pg_config": [{"pg_name": "0", "ranks": [0, 1]}, {"pg_name": True, "ranks": [0]},
                                             {"pg_name": "x", "ranks": "0,1"}, "junk"]},
           "traceEvents": [{"ph": "X", "name": "gloo:all_reduce", "ts": 1.0, "dur": 2.0},
                           {"ph": "X", "name": "gloo:all_reduce", "ts": "bad", "dur": 2.0},
                           {"ph": "X", "name": "gloo:all_reduce", "ts": 1.0, "dur": -1.0},
                           {"ph": "X", "name": "aten::mm", "ts": 1.0, "dur": 2.0}, 7]}
    rc = gloo_calls(doc, 0)
    assert rc.groups == (("0", (0, 1)),)
    assert rc.calls["gloo:all_reduce"].tolist() == [[1.0, 3.0]]
    assert set(rc.calls) == {"gloo:all_reduce"}


def _trace(tmp_rank: int = 0) -> dict[str, object]:
    """A real-format torch 2.13 gloo trace of one all-reduce and one send: the caller's Python
    frames and c10d op on the main thread (tid 100), the gloo events on gloo's worker thread
    (tid 200), an unrelated matmul."""
    def x(name: str, cat: str, tid: int, ts: float, dur: float) -> dict[str, object]:
        return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur, "args": {}}
    return {"distributedInfo": {"backend": "gloo", "rank": tmp_rank, "world_size": 4,
                                "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1, 2, 3]},
                                              {"pg_name": "1", "pg_desc": "PIPELINE_PARALLEL_GROUP", "ranks": [0, 1]},
                                              {"pg_name": "3", "pg_desc": "DATA_PARALLEL_GROUP", "ranks": [0, 2]}]},
            "traceEvents": [
                x("pp_dp_gloo.py(96): main", "python_function", 100, 0.0, 1000.0),
                x("aten::mm", "cpu_op", 100, 10.0, 50.0),
                x("torch/distributed/c10d_logger.py(80): wrapper", "python_function", 100, 100.0, 300.0),
                x("torch/distributed/distributed_c10d.py(3155): all_reduce", "python_function", 100, 102.0, 296.0),
                x("c10d::allreduce_", "cpu_op", 100, 104.0, 10.0),
                x("gloo:all_reduce", "user_annotation", 200, 110.0, 280.0),
                x("torch/distributed/c10d_logger.py(80): wrapper", "python_function", 100, 500.0, 100.0),
                x("torch/distributed/distributed_c10d.py(2712): send", "python_function", 100, 502.0, 96.0),
                x("c10d::send", "cpu_op", 100, 504.0, 10.0),
                x("gloo:send", "user_annotation", 200, 510.0, 80.0),
            ]}


def test_offline_rows_give_the_call_its_group_and_leave_unassigned_calls_alone(tmp_path: Path) -> None:
    from perftracker.agent import kineto

    from perftracker.cli.gloo_offline import with_gloo_groups

    path = tmp_path / "rank0.json"
    doc = _trace()
    path.write_text(json.dumps(doc))
    raw = kineto.window_from_trace(doc, path, kineto.resolve_rank(doc, path), job="j", session="s")
    rows = with_gloo_groups(raw, {"gloo:all_reduce": "3"}).meta.comm
    named = {(r[0], r[3], r[4]) for r in rows}
    assert named == {("gloo:all_reduce", "3", "allreduce"), ("c10d::allreduce_", "3", "allreduce"),
                     ("torch/distributed/distributed_c10d.py(3155): all_reduce", "3", "allreduce"),
                     ("torch/distributed/c10d_logger.py(80): wrapper", "3", "allreduce")}
    # the send (no group: the rank is in two pairs) and the matmul get no row, nor the second wrapper
    assert not any(r[1] >= 500_000 for r in rows)
    # nothing assigned: the window is unchanged
    assert with_gloo_groups(raw, {}) is raw


def test_analyze_applies_gloo_groups_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    from perftracker.cli.gloo_offline import ENV, enabled

    monkeypatch.delenv(ENV, raising=False)
    assert not enabled()
    monkeypatch.setenv(ENV, "0")
    assert not enabled()
    monkeypatch.setenv(ENV, "1")
    assert enabled()
