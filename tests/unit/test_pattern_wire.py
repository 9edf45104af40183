"""The columnar wire form (perftracker.wire.patterns), the session columns built from it
(perftracker.localizer.service.columns) and the store's group commit (acknowledged only after the commit)."""

from __future__ import annotations

import random
import struct
import threading
import zlib

import numpy as np
import pytest
from perftracker.localizer.diagnose.method.arrays import pattern_sets_to_arrays
from perftracker.localizer.service.columns import SessionColumns
from perftracker.localizer.store.writer import GroupCommit

from perftracker.errors import InputError, SchemaError
from perftracker.model import Category, Pattern, PatternSet
from perftracker.wire.patterns import (
    ROW_BYTES,
    WireVersionError,
    batch_from_sets,
    batch_to_sets,
    decode_batch,
    encode_sets,
)
from tests.service_helpers import make_pattern_set


def _json_form(ps: PatternSet) -> PatternSet:
    return PatternSet.from_dict(ps.to_dict())  # what the JSON path hands the localizer


@pytest.mark.parametrize("compress", [True, False])
def test_round_trip_equals_the_json_path(compress: bool) -> None:
    sets = [make_pattern_set("j", "s", r, 16, seed=3, slow=r == 5) for r in range(8, 16)]
    sets[2] = PatternSet(**{**sets[2].__dict__, "coords": {"pp": 1, "dp": 2}, "gpu": True, "source": "kineto"})
    back = batch_to_sets(decode_batch(encode_sets(sets, compress=compress)))
    assert back == [_json_form(ps) for ps in sets]


def test_columns_build_the_arrays_of_the_pattern_set_path() -> None:
    sets = [make_pattern_set("j", "s", r, 24, seed=1, slow=r == 7) for r in range(24)]
    extra = {9: ["only_a"], 17: ["only_b", "only_a"]}  # first seen past the first ranks, in row order
    for i, names in extra.items():
        ps = sets[i]
        more = tuple(Pattern(k, Category.COMPUTE, 0.02, 0.5, 0.01, label=k, executions=3, critical_ns=9)
                     for k in names)
        sets[i] = PatternSet(**{**ps.__dict__, "patterns": (*ps.patterns[:3], *more, *ps.patterns[3:])})
    random.Random(0).shuffle(sets)  # nodes upload in any order
    cols = SessionColumns("j", "s")
    for i in range(0, 24, 8):
        cols.add(decode_batch(encode_sets(sets[i:i + 8])))
    newer = make_pattern_set("j", "s", 3, 24, seed=9)  # a repeat upload replaces rank 3
    cols.add(decode_batch(encode_sets([newer])))
    ref = pattern_sets_to_arrays(sorted([_json_form(p) for p in sets if p.rank != 3] + [_json_form(newer)],
                                        key=lambda p: p.rank))
    got = cols.to_arrays()
    assert [f.key for f in got.functions][-2:] == ["only_a", "only_b"]
    assert got.functions == ref.functions and np.array_equal(got.ranks, ref.ranks)
    assert np.array_equal(got.values, ref.values) and np.array_equal(got.worker_window_s, ref.worker_window_s)
    assert (got.window_s, got.world_size, got.iteration_ms) == (ref.window_s, ref.world_size, ref.iteration_ms)


def test_a_category_conflict_is_refused_before_it_is_kept() -> None:
    cols = SessionColumns("j", "s")
    cols.add(batch_from_sets([make_pattern_set("j", "s", 0, 2)]))
    other = make_pattern_set("j", "s", 1, 2)
    p = other.patterns[-1]  # "aten::copy_", a memory op on rank 0
    bad = PatternSet(**{**other.__dict__, "patterns": (*other.patterns[:-1], type(p)(**{**p.__dict__,
                                                                                         "category": Category.COMPUTE}))})
    with pytest.raises(InputError, match="aten::copy_.*other ranks say 'memory'"):
        cols.add(batch_from_sets([bad]))
    assert cols.ranks() == {0}


def _with_header(body: bytes, *, version: int | None = None, rows: int | None = None) -> bytes:
    magic, v, flags, table_len, meta_len, n = struct.unpack_from("<4sHHIII", body)
    return struct.pack("<4sHHIII", magic, v if version is None else version, flags, table_len, meta_len,
                       n if rows is None else rows) + body[20:]


def test_bad_and_foreign_bodies_are_refused_with_a_clear_error() -> None:
    sets = [make_pattern_set("j", "s", r, 2) for r in range(2)]
    body = encode_sets(sets, compress=False)
    with pytest.raises(WireVersionError, match="format version 2 is not supported .*reads version 1"):
        decode_batch(_with_header(body, version=2))
    with pytest.raises(SchemaError, match="not a perftracker columnar body"):
        decode_batch(b"PK\x03\x04" + body[4:])  # e.g. an npz (zip) body
    with pytest.raises(SchemaError, match="array section of"):
        decode_batch(body[:-8])
    with pytest.raises(SchemaError, match="the workers' rows add up to"):
        decode_batch(_with_header(body[:-ROW_BYTES], rows=len(sets[0].patterns) * 2 - 1))
    with pytest.raises(SchemaError, match="does not inflate"):
        decode_batch(_with_header(encode_sets(sets), rows=3))
    bomb = struct.pack("<4sHHIII", b"PTCB", 1, 1, 2, 2, 10**6) + b"{}{}" + zlib.compress(b"\0" * 10**6)
    with pytest.raises(SchemaError, match="more than 1000 bytes"):
        decode_batch(bomb, max_inflated_bytes=1000)
    # a value outside [0, 1], written past the encoder's own checks
    raw = encode_sets(sets, compress=False)
    table_len, meta_len = struct.unpack_from("<II", raw, 8)
    at = 20 + table_len + meta_len + 4 * sum(len(ps.patterns) for ps in sets) + 4 * 3 + 4  # row 1's mu
    raw = raw[:at] + struct.pack("<I", 1_500_000) + raw[at + 4:]
    with pytest.raises(SchemaError, match="rank 0: function .* has mu = 1.5, outside"):
        decode_batch(raw)
    twice = PatternSet(**{**sets[0].__dict__, "patterns": (*sets[0].patterns, sets[0].patterns[0])})
    with pytest.raises(SchemaError, match="a function appears twice in one rank"):
        decode_batch(encode_sets([twice]))


def test_group_commit_acknowledges_only_after_the_commit() -> None:
    started, release = threading.Event(), threading.Event()
    committed: list[list[int]] = []

    def commit(items: list[int]) -> list[tuple[bool, int]]:
        started.set()
        release.wait(10)  # the fsync, held
        committed.append(list(items))
        return [(True, i) for i in items]

    gc = GroupCommit(commit)
    try:
        first = gc.submit_threadsafe(0)
        assert started.wait(10)
        rest = [gc.submit_threadsafe(i) for i in range(1, 6)]  # queued while the first batch commits
        assert not first.done() and not any(f.done() for f in rest)
        release.set()
        assert [f.result(10) for f in [first, *rest]] == list(range(6))
        assert committed == [[0], [1, 2, 3, 4, 5]]  # the concurrent ones shared one commit
    finally:
        release.set()
        gc.close()
