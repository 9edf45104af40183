"""The Runtime contract: listeners, sinks, triggers, blocked polling, identity, activation (`import
perftracker` in a real process: tests/component/test_runtime_import.py)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import perftracker
from perftracker.clock import FakeClock
from perftracker.config import Config
from perftracker.runtime import runtime
from perftracker.runtime.runtime import Runtime, identity_from_env
from perftracker.runtime.sinks import LoggingSink, TriggerSink

MS = 1_000_000


class RecordingSink:
    def __init__(self) -> None:
        self.triggers: list[tuple[str, dict[str, object], str]] = []
        self.blocked: list[dict[str, object]] = []

    def on_trigger(self, reason: str, detail: Mapping[str, object]) -> None:
        self.triggers.append((reason, dict(detail), threading.current_thread().name))

    def on_blocked(self, detail: Mapping[str, object]) -> None:
        self.blocked.append(dict(detail))


@pytest.fixture
def fresh(clean_env: dict[str, str]) -> Iterator[None]:
    perftracker.deactivate()
    yield
    perftracker.deactivate()


def _fake_runtime(**cfg: object) -> tuple[Runtime, FakeClock, RecordingSink]:
    clock = FakeClock(10**12)
    sink = RecordingSink()
    rt = Runtime(Config(**cfg), clock=clock, sink=sink)  # type: ignore[arg-type]
    rt.active = True  # hooks not installed: events are fed by hand
    return rt, clock, sink


def _iterate(rt: Runtime, clock: FakeClock, n: int, duration_ms: float) -> None:
    for _ in range(n):
        rt.on_dataloader_next()
        clock.advance_ns(int(duration_ms * MS))
        rt.on_step_pre()
        rt.on_step_post()


def test_sinks_satisfy_the_protocol() -> None:
    assert isinstance(LoggingSink(), TriggerSink)
    assert isinstance(RecordingSink(), TriggerSink)


def test_boundary_listeners_get_time_and_iteration_in_the_calling_thread() -> None:
    rt, clock, _ = _fake_runtime()
    seen: list[tuple[int, int, str]] = []
    rt.add_boundary_listener(lambda t, i: seen.append((t, i, threading.current_thread().name)))
    _iterate(rt, clock, 25, 40)
    assert [i for _, i, _ in seen] == list(range(1, 26))
    assert seen[-1][0] == clock.t_ns  # the time of the completing optimizer.step
    assert {name for *_, name in seen} == {threading.current_thread().name}


def test_failing_listener_is_logged_once_and_others_still_run(caplog: pytest.LogCaptureFixture) -> None:
    rt, clock, _ = _fake_runtime()
    good: list[int] = []

    def bad(t_ns: int, it: int) -> None:
        raise RuntimeError("listener bug")

    rt.add_boundary_listener(bad)
    rt.add_boundary_listener(lambda t, i: good.append(i))
    with caplog.at_level(logging.ERROR, logger="perftracker"):
        _iterate(rt, clock, 5, 40)
    assert good == [1, 2, 3, 4, 5]
    assert sum("listener" in r.getMessage() for r in caplog.records) == 1
    assert rt.active


def test_detector_slowdown_reaches_the_sink_once_with_identity() -> None:
    rt, clock, sink = _fake_runtime(trigger_cooldown_s=0.0)
    _iterate(rt, clock, 200, 40)
    assert sink.triggers == []
    _iterate(rt, clock, 5, 60)  # +50 %
    assert len(sink.triggers) == 1
    reason, detail, thread = sink.triggers[0]
    assert reason == "slowdown" and detail["source"] == "detector" and detail["rank"] == rt.identity.rank
    assert thread == threading.current_thread().name
    assert rt.status()["triggers"][0]["reason"] == "slowdown"  # type: ignore[index]


def test_manual_trigger_and_status() -> None:
    rt, clock, sink = _fake_runtime()
    _iterate(rt, clock, 30, 40)
    assert rt.trigger("manual: user asked", {"window_s": 5})
    reason, detail, _ = sink.triggers[0]
    assert reason == "manual: user asked" and detail["window_s"] == 5 and detail["iteration"] == rt.iteration
    st = rt.status()
    assert st["phase"] == "tracking" and st["sequence"] == ["dataloader.next", "optimizer.step"]
    assert st["recent_mean_ms"] == pytest.approx(40.0) and st["recent_min_ms"] == pytest.approx(40.0)
    assert rt.recent_iteration_ms()[-1] == pytest.approx(40.0)
    # a manual trigger spends no automatic-trigger token; nothing was held back
    assert st["suppressed_triggers"] == {} and st["trigger_tokens"] == rt.config.trigger_burst
    rt.active = False
    assert not rt.trigger("ignored")


def test_failing_sink_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    rt, clock, _ = _fake_runtime()

    class Broken:
        def on_trigger(self, reason: str, detail: Mapping[str, object]) -> None:
            raise OSError("agent gone")

        def on_blocked(self, detail: Mapping[str, object]) -> None:
            raise OSError("agent gone")

    rt.set_sink(Broken())
    with caplog.at_level(logging.ERROR, logger="perftracker"):
        assert rt.trigger("a") and rt.trigger("b")
    assert sum("sink.on_trigger" in r.getMessage() for r in caplog.records) == 1
    assert len(rt.triggers) == 2


def test_check_blocked_polled_from_another_thread_notifies_once_per_episode() -> None:
    rt, clock, sink = _fake_runtime(blocked_factor=5.0, blocked_min_s=5.0)
    _iterate(rt, clock, 30, 40)
    last = rt.last_event()
    assert last is not None and last[0] == "optimizer.step"
    results: list[object] = []

    def poll(now_ns: int) -> None:
        results.append(rt.check_blocked(now_ns))

    for offset_s in (4.9, 5.0, 6.0):  # a normal checkpoint of < 5 s is not a hang
        th = threading.Thread(target=poll, args=(clock.t_ns + int(offset_s * 1e9),))
        th.start()
        th.join()
    assert results[0] is None and results[1] is not None and results[2] is not None
    assert len(sink.blocked) == 1 and sink.blocked[0]["rank"] == rt.identity.rank
    _iterate(rt, clock, 1, 40)  # training moves again: a new episode may be reported
    assert rt.check_blocked(clock.t_ns + 6 * 10**9) is not None
    assert len(sink.blocked) == 2


def test_last_event_reports_step_begin_during_a_step() -> None:
    rt, clock, _ = _fake_runtime()
    rt.on_dataloader_next()
    clock.advance_ns(MS)
    rt.on_step_pre()
    assert rt.last_event() == ("optimizer.step.pre", clock.t_ns)


def test_identity_from_torchrun_env() -> None:
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "job42"}
    ident = identity_from_env(Config(), env)
    assert (ident.rank, ident.world_size, ident.local_rank, ident.job) == (3, 8, 1, "job42")
    assert ident.training_tid == threading.main_thread().native_id
    assert identity_from_env(Config(job_id="mine"), env).job == "mine"
    assert identity_from_env(Config(), {}).rank == 0


def test_real_loop_feeds_runtime_through_hooks(fresh: None) -> None:
    sink = RecordingSink()
    rt = runtime.activate(Config(), sink=sink)
    assert runtime.get_runtime() is rt
    seen: list[int] = []
    rt.add_boundary_listener(lambda t, i: seen.append(i))
    data = TensorDataset(torch.randn(256, 4), torch.randn(256, 1))
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.Adam(model.parameters())
    for x, y in DataLoader(data, batch_size=4):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    assert seen == list(range(1, 65))
    assert perftracker.trigger("manual: test")
    assert sink.triggers[-1][0] == "manual: test"


def test_default_job_id_carries_the_rendezvous_port() -> None:
    env = {"RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none", "MASTER_PORT": "29511"}
    a = identity_from_env(Config(), env).job
    b = identity_from_env(Config(), dict(env, MASTER_PORT="29512")).job
    assert a.endswith("-29511") and b.endswith("-29512") and a != b
    assert identity_from_env(Config(), {"MASTER_PORT": "1"}).job.endswith("-1")


def test_blocked_limit_plus_a_window_on_the_real_detector() -> None:
    """Around a profile window the channel adds the window's length to the limit (issue 19): idle
    just below limit + window is not blocked, just above it is."""
    rt, clock, sink = _fake_runtime(blocked_min_s=5.0)
    _iterate(rt, clock, 40, 100.0)
    last = clock.now_ns()
    assert rt.check_blocked(last + int(5.1e9), notify=False) is not None  # the normal limit: 5 s
    assert rt.check_blocked(last + int(12.9e9), notify=False, extra_s=8.0) is None
    detail = rt.check_blocked(last + int(13.1e9), extra_s=8.0)
    assert detail is not None and abs(float(detail["limit_s"]) - 13.0) < 1e-6  # type: ignore[arg-type]
    assert len(sink.blocked) == 1


def test_boundary_listeners_see_only_boundaries_that_happen_now() -> None:
    """Hooks append to an event log fed to the detector every 20 ms (docs/overhead.md). A listener
    added mid-batch (a profile window armed from another thread) is not called for the boundaries
    still in the log, only from the next event on, at every boundary, when it happens."""
    rt, clock, _ = _fake_runtime()
    _iterate(rt, clock, 30, 40)  # learn "D O": 40 ms iterations, every event is fed at once
    _iterate(rt, clock, 5, 1)  # 1 ms iterations: the log holds them (20 ms batches)
    assert rt._events  # type: ignore[attr-defined]
    seen: list[tuple[int, int]] = []
    rt.add_boundary_listener(lambda t, i: seen.append((t, i)))
    before = rt.iteration
    _iterate(rt, clock, 3, 1)
    assert [i for _, i in seen] == [before + 1, before + 2, before + 3]
    assert [t for t, _ in seen] == sorted({t for t, _ in seen}) and seen[-1][0] == clock.now_ns()

