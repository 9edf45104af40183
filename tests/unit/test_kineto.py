"""perftracker.agent.kineto on real traces (shared dlrm 8-rank GPU traces) and bad files (a fresh
torch.profiler export, in a child process: tests/system/test_kineto_export.py)."""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path

import numpy as np
import pytest
from perftracker.agent.kineto import read_kineto_trace
from perftracker.agent.summarize.summarizer import summarize_window

from perftracker.errors import TraceError
from perftracker.model import Category
from perftracker.model.raw_window import EventKind, RawWindow


def dlrm_files(d: Path) -> list[Path]:
    files = sorted(d.glob("*.json.gz"))
    assert len(files) == 8
    return files


def test_dlrm_ranks_and_rows(dlrm_dir: Path, tmp_path: Path) -> None:
    ranks = []
    for f in dlrm_files(dlrm_dir):
        raw = read_kineto_trace(f)
        ranks.append(raw.meta.rank)
        assert raw.meta.world_size == 8 and raw.meta.source == "kineto"
        kinds = set(raw.col("kind").tolist())
        assert {EventKind.CPU_OP, EventKind.KERNEL, EventKind.MEMCPY, EventKind.RUNTIME} <= kinds
        assert raw.meta.training_tid == raw.meta.pid  # the main thread, not the autograd thread
        assert (raw.col("end_ns") >= raw.col("start_ns")).all()
        # it survives the RawWindow file format
        back = RawWindow.load(raw.save(tmp_path / f"r{raw.meta.rank}.npz"))
        assert back.names == raw.names and np.array_equal(back.col("start_ns"), raw.col("start_ns"))
    assert sorted(ranks) == list(range(8))


def _exposed_nccl_us(path: Path) -> tuple[float, float]:
    """Independent of agent/: NCCL kernel time not covered by any other kernel, memcpy or memset, in µs."""
    events = json.load(gzip.open(path))["traceEvents"]
    nccl, other = [], []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        iv = (e["ts"], e["ts"] + e["dur"])
        (nccl if e["cat"] == "kernel" and e["name"].startswith("nccl") else other).append(iv)

    def union(ivs: list[tuple[float, float]]) -> list[list[float]]:
        out: list[list[float]] = []
        for s, t in sorted(ivs):
            if out and s <= out[-1][1]:
                out[-1][1] = max(out[-1][1], t)
            else:
                out.append([s, t])
        return out

    exposed = 0.0
    cover = union(other)
    for s, t in union(nccl):
        hidden = sum(max(0.0, min(t, b) - max(s, a)) for a, b in cover)
        exposed += (t - s) - hidden
    return exposed, float(sum(t - s for s, t in union(nccl)))


def test_dlrm_patterns_per_rank(dlrm_dir: Path) -> None:
    for f in dlrm_files(dlrm_dir):
        raw = read_kineto_trace(f)
        ps = summarize_window(raw)
        assert ps.gpu and ps.source == "kineto"
        total = sum(p.beta for p in ps.patterns)
        assert 0.5 < total <= 1.0 + 1e-9, f"{f.name}: β sum {total}"
        cats = {p.category for p in ps.patterns}
        assert cats == set(Category), f"{f.name}: categories {cats}"
        assert len(ps.to_bytes()) <= 10_000
        # cross-check: exposed NCCL time from an independent interval computation
        exposed_us, nccl_us = _exposed_nccl_us(f)
        ours_us = sum(p.critical_ns for p in ps.patterns if p.category is Category.COLLECTIVE) / 1000
        assert exposed_us > 0 and exposed_us < nccl_us + 1e-6
        assert ours_us == pytest.approx(exposed_us, rel=1e-3, abs=2.0), f.name
        for p in ps.patterns:
            assert 0 <= p.beta <= 1 and p.mu == 0.0 and p.sigma == 0.0  # offline: no samples


def test_truncated_gz_is_one_line_error_naming_the_file(dlrm_dir: Path, tmp_path: Path) -> None:
    src = dlrm_files(dlrm_dir)[0].read_bytes()
    bad = tmp_path / "rank0.json.gz"
    bad.write_bytes(src[: len(src) // 2])
    with pytest.raises(TraceError) as exc:
        read_kineto_trace(bad)
    msg = str(exc.value)
    assert str(bad) in msg and "\n" not in msg and "truncated" in msg


def test_truncated_json_and_non_trace(tmp_path: Path) -> None:
    cut = tmp_path / "rank1.json"
    cut.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1')
    with pytest.raises(TraceError, match="rank1.json: truncated or invalid"):
        read_kineto_trace(cut)
    other = tmp_path / "rank2.json"
    other.write_text('{"hello": 1}')
    with pytest.raises(TraceError, match="rank2.json: not a Kineto trace"):
        read_kineto_trace(other)
    with pytest.raises(TraceError, match="missing"):
        read_kineto_trace(tmp_path / "nope.json")


def test_rank_from_file_name_when_distributed_info_missing(dlrm_dir: Path, tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    doc = json.load(gzip.open(dlrm_files(dlrm_dir)[2]))
    del doc["distributedInfo"]
    f = tmp_path / "job_rank5.json"
    f.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="perftracker.agent.kineto"):
        raw = read_kineto_trace(f)
    assert raw.meta.rank == 5 and raw.meta.world_size == 0
    assert "file name" in caplog.text
    assert read_kineto_trace(f, rank=3).meta.rank == 3
    anon = tmp_path / "trace.json"
    anon.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match="no distributedInfo.rank"):
        read_kineto_trace(anon)
    # the flag wins over distributedInfo
    assert read_kineto_trace(dlrm_files(dlrm_dir)[2], prefer_filename=True).meta.rank == 2


def test_rank_from_file_name_prefers_rank_and_worker() -> None:
    from perftracker.agent.kineto import rank_from_filename

    assert rank_from_filename("node1_rank3.json") == 3
    assert rank_from_filename("host2_worker5.1694128201545.pt.trace.json.gz") == 5
    assert rank_from_filename("node3-worker_2.json") == 2
    assert rank_from_filename("rank4_worker1.json") == 4
    assert rank_from_filename("node1_step12.json") is None
    assert rank_from_filename("frank3.json") is None
