"""perftracker.agent.kineto on the trace formats real PyTorch versions write (fixtures:
tests/fixtures/kineto_formats/README.md): torch 1.8-1.10's first Kineto format, bytes that are not
UTF-8, complete events without ``dur``. Each case has a twin that must read as before."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from perftracker.agent.kineto import process_groups, read_kineto_trace

from perftracker.errors import TraceError
from perftracker.model.raw_window import EventKind

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "kineto_formats"
GLOO0 = FIX / "gloo_cpu" / "rank0.json"


def _kinds(raw) -> dict[EventKind, int]:  # type: ignore[no-untyped-def]
    vals, counts = np.unique(raw.col("kind"), return_counts=True)
    return {EventKind(int(v)): int(c) for v, c in zip(vals, counts, strict=True)}


def test_torch18_format_reads_every_event() -> None:
    """Capitalized categories and string tids (``"123"``, ``"stream 7"``) were dropped: the file
    read as 'no complete events', and a trace with string CPU tids only lost its CPU ops."""
    raw = read_kineto_trace(FIX / "torch18_rank0.json")
    doc = json.loads((FIX / "torch18_rank0.json").read_text())
    assert len(raw) == len(doc["traceEvents"])
    kinds = _kinds(raw)
    assert kinds[EventKind.KERNEL] == 1 and kinds[EventKind.MEMCPY] == 1 and kinds[EventKind.RUNTIME] == 1
    ann = raw.col("kind") == int(EventKind.ANNOTATION)
    step_rows = [raw.names[int(i)] for i in raw.col("name_id")[ann] if raw.names[int(i)].startswith("ProfilerStep#")]
    assert step_rows == ["ProfilerStep#1"]  # an "Operator" then, the step mark now
    assert len(raw.meta.iteration_ms) == 1 and raw.meta.iteration_ms[0] > 0
    gpu = raw.col("device") >= 0
    assert raw.col("tid")[gpu].tolist() == [7, 7] and raw.col("device")[gpu].tolist() == [0, 0]
    # its CPU ops are the modern trace's, on the same threads
    modern = read_kineto_trace(GLOO0)
    cpu_old = sorted(zip(raw.col("tid")[~gpu].tolist(), raw.col("start_ns")[~gpu].tolist(), strict=True))
    cpu_new = sorted(zip(modern.col("tid").tolist(), modern.col("start_ns").tolist(), strict=True))
    assert set(cpu_new) <= set(cpu_old) and len(cpu_old) == len(cpu_new) + 2  # + the step and the launch
    assert raw.meta.training_tid == modern.meta.training_tid


def test_modern_twin_has_no_string_forms(tmp_path: Path) -> None:
    """The twin: integer tids and lower-case categories read exactly as before, and a named thread
    (a non-numeric tid) gets an id of its own that no OS thread id has."""
    doc = json.loads(GLOO0.read_text())
    raw = read_kineto_trace(GLOO0)
    assert len(raw) == len([e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "Trace"])
    assert raw.col("tid").max() < 2**40
    named = dict(doc, traceEvents=[dict(e, tid="dataloader worker") if i == 0 else e
                                   for i, e in enumerate(doc["traceEvents"])])
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(named))
    got = read_kineto_trace(p)
    assert len(got) == len(raw) and int(got.col("tid")[0]) >= 2**40 and int(got.col("tid")[1:].max()) < 2**40


def test_invalid_utf8_is_read_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A name holding a Latin-1 byte (a file path in a Python frame) made the whole file unreadable."""
    text = GLOO0.read_text().replace('"aten::addmm"', '"aten::addmm caf\u00e9"', 1)
    bad, good = tmp_path / "bad" / "rank0.json", tmp_path / "good" / "rank0.json"
    bad.parent.mkdir(), good.parent.mkdir()
    bad.write_bytes(text.encode("utf-8").replace("caf\u00e9".encode(), b"caf\xe9"))
    good.write_text(text, encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="perftracker.agent.kineto"):
        got = read_kineto_trace(bad)
    assert "aten::addmm caf\ufffd" in got.names
    assert any("not valid UTF-8" in r.getMessage() and "0xe9" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="perftracker.agent.kineto"):
        twin = read_kineto_trace(good)
    assert "aten::addmm caf\u00e9" in twin.names and len(twin) == len(got)
    assert not [r for r in caplog.records if "UTF-8" in r.getMessage()]


def test_valid_utf8_but_bad_json_is_still_an_error(tmp_path: Path) -> None:
    p = tmp_path / "rank0.json"
    p.write_bytes(GLOO0.read_bytes()[:1500])  # truncated: the replacement path must not hide it
    with pytest.raises(TraceError, match="truncated or invalid"):
        read_kineto_trace(p)


def test_missing_dur_is_counted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    doc = json.loads(GLOO0.read_text())
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "Trace"]
    del xs[0]["dur"], xs[1]["dur"]
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="perftracker.agent.kineto"):
        raw = read_kineto_trace(p)
    assert any(f"2 of {len(raw)} complete events have no dur" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="perftracker.agent.kineto"):
        read_kineto_trace(GLOO0)
    assert not [r for r in caplog.records if "no dur" in r.getMessage()]


def _nccl_doc(ranks: object, size: object = 32) -> dict:  # type: ignore[type-arg]
    """One NCCL kernel with the args torch 2.x writes (as in the shared sa_se traces)."""
    args = {"Collective name": "reduce_scatter_tensor_coalesced", "dtype": "BFloat16", "Process Group Name": "1",
            "Process Group Description": "DATA_PARALLEL_GROUP", "Process Group Ranks": ranks, "Group size": size,
            "Seq": 0}
    return {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL",
                             "pid": 0, "tid": 7, "ts": 1000.0, "dur": 50.0, "args": args}]}


DP32 = list(range(0, 64, 2))


def test_cut_member_list_of_a_large_group() -> None:
    """PyTorch writes a group of more than 30 ranks as its first 30 and ", ...]": the group had no
    members, so the summarizer cut steps by a smaller group (sa_se with such lists lost its
    'slowest rank moves' finding). An arithmetic run with its Group size is continued."""
    cut = "[" + ", ".join(map(str, DP32[:30])) + ", ...]"
    groups, _ = process_groups(_nccl_doc(cut))
    assert groups == (("1", "DATA_PARALLEL_GROUP", tuple(DP32)),)
    # twins: the whole list as a string or a list reads the same; what cannot be known stays unknown
    assert process_groups(_nccl_doc(str(DP32)))[0] == groups
    assert process_groups(_nccl_doc(DP32))[0] == groups
    assert process_groups(_nccl_doc(cut, size="32"))[0] == groups  # a size written as a string
    assert process_groups(_nccl_doc(cut, size=None))[0][0][2] == ()  # no size: members unknown
    uneven = [0, 1, *range(4, 60, 2)]  # 30 ranks, not one stride
    assert process_groups(_nccl_doc("[" + ", ".join(map(str, uneven)) + ", ...]"))[0][0][2] == ()
    assert process_groups(_nccl_doc(cut, size=30))[0][0][2] == ()  # a size that contradicts the cut


@pytest.mark.parametrize(("raw_name", "read_as", "said"), [
    (b'"C:\\Users\\me\\job.py(12): aten::addmm"', "C:\\Users\\me\\job.py(12): aten::addmm", "backslashes"),
    (b'"aten::addmm\tx"', "aten::addmm\tx", "control characters"),
    (b'"aten::addmm\\ud800"', "aten::addmm\ufffd", "lone surrogate"),
])
def test_names_chrome_reads_but_strict_json_does_not(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                     raw_name: bytes, read_as: str, said: str) -> None:
    """Each made the whole file unreadable; Chrome and Perfetto read them. The repair is named."""
    p = tmp_path / "rank0.json"
    p.write_bytes(GLOO0.read_bytes().replace(b'"aten::addmm"', raw_name, 1))
    with caplog.at_level(logging.WARNING, logger="perftracker.agent.kineto"):
        raw = read_kineto_trace(p)
    assert read_as in raw.names and len(raw) == len(read_kineto_trace(GLOO0))
    assert all(n.encode("utf-8") for n in raw.names)  # every name can be written out
    assert any("read leniently" in r.getMessage() and said in r.getMessage() for r in caplog.records)


def test_byte_order_mark_and_string_ranks(tmp_path: Path) -> None:
    doc = json.loads(GLOO0.read_text())
    p = tmp_path / "a.json"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps(doc).encode())
    assert read_kineto_trace(p).meta.rank == 0
    doc["distributedInfo"].update(rank="1", world_size="2")  # written as strings: still the rank
    p.write_text(json.dumps(doc))
    raw = read_kineto_trace(p)
    assert (raw.meta.rank, raw.meta.world_size) == (1, 2)
    doc["distributedInfo"]["rank"] = "one"  # no rank there: the file name has none either
    p.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match="no distributedInfo.rank"):
        read_kineto_trace(p)


def test_negative_dur_drops_the_event_not_the_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Kineto before pytorch/kineto#646 wrote an end never set (0) as dur = -ts: one such event
    made the whole rank 'out of range'. It is dropped and counted; a NaN dur is still an error."""
    doc = json.loads(GLOO0.read_text())
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    xs[0]["dur"] = -xs[0]["ts"]
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="perftracker.agent.kineto"):
        raw = read_kineto_trace(p)
    full = read_kineto_trace(GLOO0)
    assert len(raw) == len(full) - 1 and raw.meta.window_start_ns >= full.meta.window_start_ns
    assert any("1 complete event(s) with a negative dur dropped" in r.getMessage() for r in caplog.records)
    xs[0]["dur"] = float("nan")
    p.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match="out of range"):
        read_kineto_trace(p)


def test_other_accelerators_runtime_calls_are_runtime_rows(tmp_path: Path) -> None:
    """An Intel XPU or PrivateUse1 trace's host API calls (libkineto's category names) were dropped;
    fixture shape only: not verified on hardware."""
    doc = json.loads(GLOO0.read_text())
    pid = doc["traceEvents"][0]["pid"]
    t0 = min(e["ts"] for e in doc["traceEvents"])
    for i, cat in enumerate(("xpu_runtime", "privateuse1_runtime", "cuda_sync")):
        doc["traceEvents"].append({"ph": "X", "cat": cat, "name": "urEnqueueKernelLaunch", "pid": pid, "tid": pid,
                                   "ts": t0 + 10 * i, "dur": 3.0, "args": {"correlation": i}})
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(doc))
    raw = read_kineto_trace(p)
    assert _kinds(raw).get(EventKind.RUNTIME) == 2  # cuda_sync (a GPU-side wait marker) is not one
    assert len(raw) == len(read_kineto_trace(GLOO0)) + 2
