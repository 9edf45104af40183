"""A window's profiler events are bounded (issue 43, item 10): after a first window, the events per
iteration it held cut the next window at the boundary where it would pass ``max_window_events``,
logged as cut. Real profiler windows on CPU; the bound is what a kernel-dense GPU job needs (not
verified on a GPU: bench/gpu_probe.py's kernel_dense_window measures the rate there)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from perftracker.runtime.window.profile import (
    ProfileWindow,
    WindowOptions,
    WindowResult,
    event_bound_reached,
)
from tests.window_workload import Ident, drive


def test_the_bound_is_reached_only_past_it() -> None:
    assert not event_bound_reached(9, 100.0, 1000)  # the 10th iteration lands on it: still inside
    assert event_bound_reached(10, 100.0, 1000)
    assert not event_bound_reached(10**6, 0.0, 1000)  # no rate yet (the first window)
    assert not event_bound_reached(10**6, 100.0, 0)  # no bound
    assert not event_bound_reached(0, 10**9, 1000)  # a window holds at least one iteration


@pytest.mark.parametrize("bounded", [True, False])
def test_a_later_window_is_cut_at_the_event_bound(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                  bounded: bool) -> None:
    win = ProfileWindow(Ident(), tmp_path, options=WindowOptions(stacks="off", converge=False, nvtx=False))
    done: list[WindowResult] = []
    assert win.arm("s1", 1.0, done.append)
    drive(win, done)
    first = done[0]
    assert first.error == "" and first.rows > 0 and first.iterations >= 2
    per_iter = first.rows / first.iterations
    win.options = dataclasses.replace(win.options, max_window_events=int(per_iter * 3.5) if bounded else 0)
    assert win.arm("s2", 2.0 if not bounded else 30.0, done.append)
    with caplog.at_level(logging.WARNING, logger="perftracker.runtime.window.profile"):
        drive(win, done)
    second = done[1]
    assert second.error == ""
    if bounded:
        assert second.iterations == 3 and (second.end_ns - second.start_ns) < 10e9
        assert "cut after 3 iterations" in caplog.text
    else:
        assert second.iterations > 3 and "cut after" not in caplog.text
