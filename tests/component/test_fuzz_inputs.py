"""Property-based fuzzing of what perftracker reads from files (issue 46; Hypothesis, derandomized,
a bounded number of examples): the process-group fields of a Kineto trace and the members of an
``.npz`` (``SampleSet`` / ``RawWindow``). Property: only perftracker's own errors come out, and the
memory a read takes is bounded by the bytes it was given, whatever sizes the input declares.

``PERFTRACKER_FUZZ_EXAMPLES`` sets the examples per property (default 150).
"""

from __future__ import annotations

import io
import json
import os
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from perftracker.agent.kineto import process_groups

from perftracker.errors import PerftrackerError
from perftracker.model.raw_window import RawWindow, SampleSet

N = int(os.environ.get("PERFTRACKER_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=N, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
BIG = st.sampled_from([0, 1, 2, 29, 30, 31, 64, 4096, 4097, 9_999_999, 10_000_000, 10**12, 2**62, -1, -(2**63)])
scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | BIG | st.floats(allow_nan=True)
           | st.text(max_size=20) | st.sampled_from(["", "[]", "[...]", "[0, ...]", "[1, 3", " 7 ", "1e400"]))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5), max_leaves=10)


@st.composite
def member_lists(draw: Any) -> Any:
    """A "Process Group Ranks" value: any JSON value, or a (cut) list string of a run or not."""
    if draw(st.booleans()):
        return draw(json_values)
    start, step, n = draw(BIG | st.integers(0, 50)), draw(st.integers(-2, 5) | BIG), draw(st.integers(0, 31))
    parts = [str(start + step * i) for i in range(n)]
    if draw(st.booleans()) and parts:
        parts[draw(st.integers(0, len(parts) - 1))] = draw(st.sampled_from(["-1", "x", "", "1.5", "99999999999"]))
    return "[" + ", ".join(parts + (["..."] if draw(st.booleans()) else [])) + "]"


def _peak(fn: Any) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        return fn(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_trace_process_group_fields_take_memory_bounded_by_the_trace() -> None:
    @FUZZ
    @given(ranks=member_lists(), size=json_values | BIG, world=json_values | BIG, name=json_values,
           in_config=st.booleans())
    def prop(ranks: Any, size: Any, world: Any, name: Any, in_config: bool) -> None:
        args = {"Process Group Name": name, "Process Group Ranks": ranks, "Group size": size, "Seq": 0}
        doc: dict[str, Any] = {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "nccl", "pid": 0, "tid": 7,
                                                "ts": 10.0, "dur": 1.0, "args": args}],
                               "distributedInfo": {"rank": 0, "world_size": world}}
        if in_config:
            doc["distributedInfo"]["pg_config"] = [{"pg_name": name, "ranks": ranks}]
        text = json.dumps(doc, allow_nan=True)
        (groups, _), peak = _peak(lambda: process_groups(doc))
        assert peak < (1 << 20) + 200 * len(text), (peak, text[:200])
        w = world if isinstance(world, int) and not isinstance(world, bool) and 0 < world <= 10_000_000 else 0
        for g in groups:
            members = g[2]
            assert isinstance(members, (tuple, range))
            if isinstance(ranks, str) and ranks.endswith("...]") and members and w:
                assert max(members) < w  # a continued list stays inside the declared world

    prop()


_DTYPES = ["<i8", "<f4", "|u1", "<f8", "|O", "<U4", "<i4"]


@st.composite
def npz_files(draw: Any) -> bytes:
    """An .npz of members named like a SampleSet's or a RawWindow's, each declaring any shape and
    dtype, holding a little data (or none), stored or deflated."""
    buf = io.BytesIO()
    names = draw(st.lists(st.sampled_from(["meta_json", "names_json", "t_cpu", "v_cpu", "col_kind", "col_start_ns",
                                           "stack_frames", "stack_offsets", "x", "t_../../e"]), max_size=5, unique=True))
    with zipfile.ZipFile(buf, "w") as zf:
        for name in names:
            shape = tuple(draw(st.lists(BIG | st.integers(0, 9), max_size=3)))
            shape = tuple(max(0, d) for d in shape)
            header: dict[str, Any] = {"descr": draw(st.sampled_from(_DTYPES)), "fortran_order": False,
                                      "shape": shape}
            body = io.BytesIO()
            try:
                np.lib.format.write_array_header_1_0(body, header)
            except ValueError:
                continue
            body.write(b"\0" * draw(st.integers(0, 4096)))
            kind = zipfile.ZIP_DEFLATED if draw(st.booleans()) else zipfile.ZIP_STORED
            zf.writestr(name + ".npy", body.getvalue(), compress_type=kind)
    return buf.getvalue()


def test_npz_members_take_memory_bounded_by_the_file(tmp_path: Path) -> None:
    path = tmp_path / "f.npz"

    @FUZZ
    @given(data=npz_files(), kind=st.sampled_from([SampleSet, RawWindow]))
    def prop(data: bytes, kind: Any) -> None:
        path.write_bytes(data)

        def load() -> str:
            try:
                kind.load(path)
            except PerftrackerError as exc:
                return type(exc).__name__
            return "loaded"

        _, peak = _peak(load)
        assert peak < (4 << 20) + 200 * len(data), peak

    prop()
