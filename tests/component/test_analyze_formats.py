"""``perftracker analyze``'s directory reading (summarize_dir, worker processes) on layouts real
jobs write: torch.profiler's schedule with repeat > 1 (two traces per rank), two processes that
claim one rank, and the reader's warnings about a file reaching the user. Fixtures:
tests/fixtures/kineto_formats/README.md."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from perftracker.cli.analyze import summarize_dir
from perftracker.errors import InputError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "kineto_formats"
CYCLES = sorted((FIX / "tb_cycles").iterdir())


def test_profiling_cycles_keep_the_latest_per_rank() -> None:
    """Two cycles per rank (``{host}_{pid}.{time}.pt.trace.json``) aborted the whole run with
    'rank 0 appears twice'; now each rank's latest cycle is analysed and the earlier one listed."""
    warned: list[str] = []
    summ = summarize_dir(FIX / "tb_cycles", jobs=2, warn=warned.append)
    assert [ps.rank for ps in summ.sets] == [0, 1]
    latest = {0: "vm_18722.1795851501632384929.pt.trace.json", 1: "vm_18723.1795851501633456999.pt.trace.json"}
    earlier = {f.name for f, _, _ in summ.skipped}
    assert earlier == {"vm_18722.1795851501611161084.pt.trace.json", "vm_18723.1795851501609196098.pt.trace.json"}
    for ps in summ.sets:
        doc = json.loads((FIX / "tb_cycles" / latest[ps.rank]).read_text())
        first = min(e["ts"] for e in doc["traceEvents"] if e.get("ph") == "X")
        assert abs(ps.window_start_ns - round(first * 1000)) < 1000  # the kept window is the latest file's
    assert summ.ranks_skipped == []  # no rank is missing: each was read
    assert len(warned) == 2 and all("earlier profiling cycle" in w for w in warned)


def test_one_cycle_is_not_a_duplicate() -> None:
    """The twin: one cycle per rank reads without a warning."""
    warned: list[str] = []
    d = FIX / "gloo_cpu"
    summ = summarize_dir(d, jobs=2, warn=warned.append)
    assert [ps.rank for ps in summ.sets] == [0, 1] and summ.skipped == []
    # the fixture's two ranks were cut to 6 ms each from different times: only the step alignment's
    # note says so (tests/unit/test_step_align.py), nothing about duplicates
    assert warned == ["ranks not aligned: their traces do not overlap in time (one host, no ProfilerStep marks)"]


def test_two_processes_claiming_one_rank_still_fail(tmp_path: Path) -> None:
    """Traces of one rank from two processes (distributedInfo wrong, or two runs in one
    directory): no choice would be right, so it stays an error that says why."""
    docs = [json.loads((FIX / "gloo_cpu" / f"rank{r}.json").read_text()) for r in (0, 1)]
    docs[1]["distributedInfo"] = docs[0]["distributedInfo"]
    for i, doc in enumerate(docs):
        (tmp_path / f"host{i}.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match=r"rank 0 appears twice: .*two processes \(pids 18722, 18723\)"):
        summarize_dir(tmp_path, jobs=2)


def test_disjoint_traces_named_for_different_ranks_fail(tmp_path: Path) -> None:
    """Disjoint windows that claim one rank while their names give two: the names are the ranks
    (traces recorded before init_process_group), so the error points at --rank-from-filename."""
    rank0_cycles = [f for f in CYCLES if f.name.startswith("vm_18722")]
    for i, f in enumerate(rank0_cycles):
        shutil.copy(f, tmp_path / f"rank{i}.pt.trace.json")
    with pytest.raises(InputError, match="--rank-from-filename"):
        summarize_dir(tmp_path, jobs=2)
    summ = summarize_dir(tmp_path, prefer_filename=True, jobs=2)
    assert [ps.rank for ps in summ.sets] == [0, 1]


def test_reader_warnings_reach_the_user(tmp_path: Path) -> None:
    """A worker process's log records were lost: a file read with bad bytes replaced said nothing."""
    for r in (0, 1):
        shutil.copy(FIX / "gloo_cpu" / f"rank{r}.json", tmp_path / f"rank{r}.json")
    p = tmp_path / "rank1.json"
    p.write_bytes(p.read_bytes().replace(b'"aten::addmm"', b'"aten::addmm caf\xe9"', 1))
    warned: list[str] = []
    summ = summarize_dir(tmp_path, jobs=2, warn=warned.append)
    assert [ps.rank for ps in summ.sets] == [0, 1]
    reader = [w for w in warned if not w.startswith("ranks not aligned")]  # the fixture's ranks: different times
    assert len(reader) == 1 and "rank1.json" in reader[0] and "not valid UTF-8" in reader[0]


def test_brief_prints_the_headline_and_titles(capsys: pytest.CaptureFixture[str]) -> None:
    """`report --brief` existed; `analyze` (what a newcomer runs first) printed only the full report."""
    from perftracker.cli.main import main

    assert main(["analyze", str(FIX / "gloo_cpu"), "--brief", "-j", "2"]) == 0
    brief = capsys.readouterr().out.splitlines()
    assert main(["analyze", str(FIX / "gloo_cpu"), "--format", "json", "-j", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert brief[0] == report["headline"] and len(brief) == 1 + len(report["findings"])
    assert all(f["title"] in line for f, line in zip(report["findings"], brief[1:], strict=True))
