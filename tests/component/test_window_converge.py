"""A window ends when its phases have converged (issue 30, Deliver 1; the default), with window_s
as the upper bound: a steady loop ends early, its twin whose iterations keep slowing runs to
window_s, and converge=False (the opt-out) always runs to window_s."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from window_workload import Ident, drive, spin

from perftracker.runtime.window.profile import ProfileWindow, WindowOptions, WindowResult


def _window(tmp_path: Path, body, window_s: float, **opts) -> tuple[WindowResult, float]:  # type: ignore[no-untyped-def]
    opts.setdefault("converge", True)
    win = ProfileWindow(Ident(), tmp_path, options=WindowOptions(stacks="off", nvtx=False, converge_min_s=0.3, **opts))
    done: list[WindowResult] = []
    assert win.arm("c", window_s, done.append)
    drive(win, done, body=body)
    assert len(done) == 1 and done[0].error == "", done
    res = done[0]
    return res, (res.end_ns - res.start_ns) / 1e9


@pytest.mark.timeout(120)
def test_a_steady_loop_ends_the_window_once_converged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="perftracker.runtime.window.profile"):
        res, length_s = _window(tmp_path, lambda: spin(10), window_s=30.0)
    assert 20 <= res.iterations < 400 and length_s < 30.0, (res.iterations, length_s)
    assert "converged after" in caplog.text


@pytest.mark.timeout(120)
def test_a_loop_that_keeps_slowing_runs_to_window_s(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    t0 = time.monotonic()

    def slowing() -> None:  # each iteration ~4 % of a second longer per second: never steady
        spin(5 + 40 * (time.monotonic() - t0))

    with caplog.at_level(logging.INFO, logger="perftracker.runtime.window.profile"):
        res, length_s = _window(tmp_path, slowing, window_s=2.0)
    assert length_s >= 2.0 and res.iterations >= 20, (res.iterations, length_s)
    assert "converged after" not in caplog.text


@pytest.mark.timeout(120)
def test_without_convergence_the_window_runs_window_s(tmp_path: Path) -> None:
    assert WindowOptions().converge is True  # the default; False is the opt-out
    res, length_s = _window(tmp_path, lambda: spin(10), window_s=1.5, converge=False)
    assert length_s >= 1.5 and res.iterations > 20
