"""The vectorized RawWindow assembly: nesting by pointer jumping matches a stack walk, Python
stacks are interned once per code and extend their parent's stack, and rows are kept."""

from __future__ import annotations

import numpy as np

from perftracker.model.raw_window import EventKind, WindowMeta
from perftracker.runtime.raw_window_build import build_raw_window, nest_parents
from perftracker.runtime.stack_sampler import frame_name, python_executions


def _stack_walk(start: np.ndarray, end: np.ndarray, group: np.ndarray) -> np.ndarray:
    parent = np.full(len(start), -1, np.int32)
    stack: list[int] = []
    cur = None
    for i in np.lexsort((-end, start, group)).tolist():
        if group[i] != cur:
            stack, cur = [], group[i]
        while stack and end[stack[-1]] <= start[i]:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    return parent


def _random_tree(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Well-nested intervals (recursive splits) plus some overlapping and zero-length ones."""
    starts, ends = [], []

    def split(lo: int, hi: int, depth: int) -> None:
        if len(starts) >= n or hi - lo < 2:
            return
        starts.append(lo)
        ends.append(hi)
        if depth < 12:
            cuts = np.sort(rng.integers(lo, hi, size=rng.integers(1, 5)))
            for a, b in zip(cuts[:-1], cuts[1:], strict=True):
                split(int(a), int(b), depth + 1)

    while len(starts) < n:
        split(int(rng.integers(0, 10**6)), int(rng.integers(10**6, 2 * 10**6)), 0)
    s, e = np.array(starts[:n], np.int64), np.array(ends[:n], np.int64)
    k = n // 10  # imperfect nesting (clipped or overlapping events) and instants
    s[:k] += rng.integers(-5000, 5000, size=k)
    e[k:2 * k] = s[k:2 * k]
    return s, e


def test_nest_parents_matches_a_stack_walk() -> None:
    rng = np.random.default_rng(7)
    for n in (0, 1, 2, 50, 3000):
        s, e = _random_tree(rng, n) if n else (np.zeros(0, np.int64), np.zeros(0, np.int64))
        g = rng.integers(0, 3, size=n).astype(np.int64)
        want = _stack_walk(s, e, g)
        got = nest_parents(s, e, g)
        assert np.array_equal(got, want), n
        if n > 100:
            assert (got >= 0).sum() > n // 2  # the case actually nests


def _f() -> None: ...
def _g() -> None: ...


def test_python_rows_stacks_interned_once_and_kept() -> None:
    a, b, c = _f.__code__, _g.__code__, test_nest_parents_matches_a_stack_walk.__code__
    # samples innermost first: (id(frame), code); the frame ids say which executions are the same
    samples = [((2, b), (1, a)), ((2, b), (1, a)), ((3, c), (1, a)), ((4, b), (1, a)), ((5, a),)]
    t = [1_000_000 * (i + 1) for i in range(len(samples))]
    py = python_executions(t, samples, 0, 6_000_000)
    meta = WindowMeta(job="j", session="s", rank=0, world_size=1, host="h", pid=1, training_tid=9,
                      window_start_ns=0, window_end_ns=6_000_000)
    raw = build_raw_window(meta, None, py, [(100, 200, 0), (10**10, 10**10 + 1, 0)])
    kinds = raw.col("kind").tolist()
    assert kinds.count(EventKind.PYTHON) == len(py.start_ns) == 5  # a, b, c, b, a: nothing lost
    assert kinds.count(EventKind.GC) == 1  # the pause outside the window is dropped
    assert raw.names[:3] == (frame_name(a), frame_name(b), frame_name(c))  # each name once
    rows = [(raw.names[n], tuple(raw.names[j] for j in raw.stacks[s]) if s >= 0 else ())
            for n, s in zip(raw.col("name_id").tolist(), raw.col("stack_id").tolist(), strict=True)]
    assert (frame_name(b), (frame_name(a), frame_name(b))) in rows
    assert (frame_name(c), (frame_name(a), frame_name(c))) in rows
    assert len(raw.stacks) == 3  # (a), (a, b), (a, c): the second b execution reuses its stack
    par = raw.col("parent")
    for i, (_, stack) in enumerate(rows):
        if len(stack) == 2:
            assert rows[par[i]][1] == stack[:1]  # parent is the enclosing execution


def test_gc_pauses_across_the_window_edges_are_clipped_to_the_window() -> None:
    # the GC callbacks are installed, and the profiler started, a moment before the window's start is
    # taken, and removed after its end: a pause can begin before the start or end after the end
    meta = WindowMeta(job="j", session="s", rank=0, world_size=1, host="h", pid=1, training_tid=9,
                      window_start_ns=1_000, window_end_ns=9_000)
    raw = build_raw_window(meta, None, None, [(400, 1_300, 0), (5_000, 5_100, 2), (8_800, 9_700, 0), (9_800, 9_900, 0)])
    rows = sorted(zip(raw.col("start_ns").tolist(), raw.col("end_ns").tolist(), strict=True))
    assert rows == [(1_000, 1_300), (5_000, 5_100), (8_800, 9_000)]
    assert set(raw.col("kind").tolist()) == {EventKind.GC}
