"""Plain-English sentences."""

from __future__ import annotations

from perftracker.localizer.diagnose.method.expect import OPEN_BOX
from perftracker.localizer.diagnose.words.explain import (
    Consequence,
    describe_finding,
    describe_ranks,
    describe_report,
    pct,
)

from perftracker.model import Box, Category, Triple

PY_BOX = Box(Triple(0, 0, 0), Triple(0.01, 1, 1))


def test_pct_and_ranks() -> None:
    assert [pct(0.12), pct(0.025), pct(0.01), pct(0.0004), pct(0.0)] == ["12%", "2.5%", "1%", "0.04%", "0%"]
    assert describe_ranks([3], 8) == "rank 3"
    assert describe_ranks([0, 1, 2, 3], 8) == "ranks 0-3"
    assert describe_ranks(list(range(8)), 8) == "all ranks"
    assert describe_ranks(list(range(3, 2560, 9)), 2560) == "285 of 2,560 ranks (3, 12, 21, …)"


def test_throttled_gpu_sentence() -> None:
    s = describe_finding(label="compute kernels", key="gemm", category=Category.COMPUTE, resource="sm",
                         kind="specific", ranks=[0, 1, 2, 3], n_workers=64,
                         observed=Triple(0.42, 0.36, 0.1), median=Triple(0.2, 0.8, 0.1), expected=OPEN_BOX,
                         tests=("differential",), gpu=True)
    assert s == ("ranks 0-3: compute kernel compute kernels holds the critical path 2.1× longer than on other "
                 "ranks, at 45% of their SM utilization — slow or throttled GPU")


def test_slow_input_sentence() -> None:
    s = describe_finding(label="socket.recv_into", key="main;torch/utils/data/dataloader.py:__next__;recv_into",
                         category=Category.PYTHON, resource="cpu", kind="common", ranks=list(range(16)),
                         n_workers=16, observed=Triple(0.12, 0.05, 0.01), median=Triple(0.12, 0.05, 0.01),
                         expected=PY_BOX, tests=("expectation",), hint="slow input pipeline/storage", gpu=True)
    assert s == ("all ranks: Python socket.recv_into in data loading holds 12% of the window (expected ≤ 1%) "
                 "— slow input pipeline/storage")


def test_random_pattern_is_summarized_not_listed() -> None:
    ranks = list(range(5, 1000, 7))
    s = describe_finding(label="gc.collect", key="main;gc:collect", category=Category.PYTHON, resource="cpu",
                         kind="random", ranks=ranks, n_workers=1000, observed=Triple(0.03, 0.9, 0.0),
                         median=Triple(0.001, 0.9, 0.0), expected=PY_BOX, tests=("expectation",),
                         hint="garbage-collection pauses", beta_spread=(0.015, 0.07))
    assert s.startswith(f"{len(ranks)} of 1,000 ranks, scattered: Python gc.collect holds 1.5%–7% of the window")
    assert "random per-worker pattern (garbage-collection pauses)" in s
    assert "12, 19" not in s


def test_function_only_one_rank_runs_and_consequence() -> None:
    s = describe_finding(label="time.sleep", key="main;time:sleep", category=Category.PYTHON, resource="cpu",
                         kind="specific", ranks=[5], n_workers=64, observed=Triple(0.15, 0, 0),
                         median=Triple(0, 0, 0), expected=OPEN_BOX, tests=("differential",),
                         consequences=[Consequence("AllReduce", 0.3)])
    assert s.startswith("rank 5: Python time.sleep holds 15% of the window, where other ranks barely run it (0%)")
    assert "the process sleeps on the critical path" in s
    assert s.endswith("; it holds AllReduce only 0.3× as long as other ranks (the other ranks wait for it there)")


def test_pcie_traffic_sentence() -> None:
    s = describe_finding(label="Memcpy PtoP", key="Memcpy PtoP", category=Category.MEMORY, resource="pcie",
                         kind="specific", ranks=[3, 17, 40], n_workers=2560, observed=Triple(0.02, 0.7, 0.06),
                         median=Triple(0.02, 0.06, 0.03), expected=OPEN_BOX, tests=("differential",), gpu=True)
    assert "ranks 3,17,40: memory op Memcpy PtoP" in s and "11.7× their PCIe utilization" in s
    assert "NVLink" in s


def test_report_summary() -> None:
    assert describe_report(0, "", 1000, [("GEMM", 0.34), ("flash", 0.14)]) == (
        "no abnormal function on 1,000 ranks (top of the critical path: GEMM 34%, flash 14%)")
    assert describe_report(3, "rank 1: x", 8, []) == "rank 1: x (+2 more)"


def test_python_frames_are_shortened_in_sentences() -> None:
    from perftracker.localizer.diagnose.words.explain import frame_text

    site = "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/torch/autograd/graph.py(966): _engine_run_backward"
    assert frame_text(site) == "_engine_run_backward (torch/autograd/graph.py:966)"
    assert frame_text("/work/main/perftracker/examples/train.py(243): main") == "main (examples/train.py:243)"
    assert frame_text("/usr/lib/python3.11/threading.py(10): run") == "run (threading.py:10)"
    assert frame_text("aten::mm") == "aten::mm"


def test_one_rank_summary_names_the_rank_and_says_nothing_was_compared() -> None:
    s = describe_report(0, "", 1, [("aten::mm", 0.47), ("aten::tanh", 0.051)], only_rank=0)
    assert s.startswith("rank 0 (the only rank): its critical path is held by aten::mm 47%, aten::tanh 5.1%")
    assert "no other rank to compare it with" in s
    # with more ranks the summary stays "no abnormal function"
    assert describe_report(0, "", 2, [("aten::mm", 0.47)]).startswith("no abnormal function on 2 ranks")


def test_wait_clauses_and_the_no_finding_summary_shorten_python_frames() -> None:
    from perftracker.localizer.diagnose.words.explain import waits_text

    from perftracker.model import Wait

    c10d = "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py(4191): all_gather"
    s = waits_text([Wait(function=c10d, ranks=(0,), share=0.17)], "it", 2)
    assert s == "; rank 0 waits for it 17% of the window in all_gather (torch/distributed/distributed_c10d.py:4191)"
    assert "site-packages" not in describe_report(0, "", 2, [(c10d, 0.3)])
    # a collective that is not a Python frame is shown as it is
    assert waits_text([Wait(function="AllReduce", ranks=(1, 2), share=0.1)], "them", 4).endswith("in AllReduce")
