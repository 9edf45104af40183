"""The runtime's trigger policy (issue 48): the hold and the budget decide in the runtime, before
a trigger reaches its sink (the agent channel only carries it). A real Runtime fed by hand with a
fake clock, the real policy and its ledger in a temporary run dir."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

from perftracker.clock import FakeClock
from perftracker.config import Config
from perftracker.runtime.runtime import Runtime
from perftracker.runtime.trigger.policy import TriggerPolicy

MS = 1_000_000
SLOW = {"source": "detector", "test": "cusum", "ratio": 1.2, "baseline_ms": 10.0, "recent_ms": 12.0,
        "iteration": 40}


class Sink:
    def __init__(self) -> None:
        self.got: list[tuple[str, dict[str, object]]] = []

    def on_trigger(self, reason: str, detail: Mapping[str, object]) -> None:
        self.got.append((reason, dict(detail)))

    def on_blocked(self, detail: Mapping[str, object]) -> None:
        pass


def _runtime(tmp_path: Path, iteration_ms: float, n: int = 30) -> tuple[Runtime, Sink]:
    clock, sink = FakeClock(time.monotonic_ns()), Sink()  # training starts now, on the meter's clock too
    rt = Runtime(Config(run_dir=str(tmp_path)), clock=clock, sink=sink)
    rt.active = True
    for _ in range(n):  # hand-fed iterations of iteration_ms each
        rt.on_dataloader_next()
        clock.advance_ns(int(iteration_ms * MS))
        rt.on_step_pre()
        rt.on_step_post()
    rt.trigger_policy = TriggerPolicy(rt, rt.config)
    return rt, sink


def test_without_a_policy_every_trigger_reaches_the_sink(tmp_path: Path) -> None:
    rt, sink = _runtime(tmp_path, 10.0, n=0)
    rt.trigger_policy = None
    rt._deliver("slowdown", dict(SLOW))
    assert [r for r, _ in sink.got] == ["slowdown"] and not rt.release_held_trigger()


def test_a_slowdown_not_yet_worth_a_window_is_held_and_released_once_it_is(tmp_path: Path) -> None:
    rt, sink = _runtime(tmp_path, 12.0)  # the job runs at the slow level
    policy = rt.trigger_policy
    assert policy is not None
    rt._deliver("slowdown", dict(SLOW))
    assert sink.got == [] and policy.meter().deferral.held is not None  # just started: not worth it
    rt._deliver("manual", {"source": "manual"})
    assert [r for r, _ in sink.got] == ["manual"]  # a manual trigger is never held
    assert not rt.release_held_trigger() and len(sink.got) == 1  # still not worth a window
    policy.meter().budget.started_s = time.monotonic() - 3600  # an hour of training at 1.2x: worth it
    assert rt.release_held_trigger()
    reason, detail = sink.got[-1]
    assert reason == "slowdown" and detail["iteration"] == 40 and float(detail["ratio_when_sent"]) > 1.1


def test_a_held_slowdown_that_passed_is_let_go(tmp_path: Path) -> None:
    rt, sink = _runtime(tmp_path, 10.0)  # back at the baseline
    policy = rt.trigger_policy
    assert policy is not None
    rt._deliver("slowdown", dict(SLOW))
    policy.meter().budget.started_s = time.monotonic() - 3600
    assert not rt.release_held_trigger() and sink.got == []
    assert policy.meter().deferral.passed == 1
