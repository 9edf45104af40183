"""The worker's agent channel over a real Unix socket: register, heartbeats, triggers, windows,
agent loss and reconnection.

The "agent" here is a small real socket server speaking perftracker.wire.framing. The runtime and the
profile window are minimal stand-ins with the contract's attributes (the real ones are exercised by
the torchrun tests in test_agent_e2e.py / test_reliability.py).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from perftracker.config import Config
from perftracker.runtime.channel import AgentChannel, ChannelOptions
from perftracker.runtime.trigger.policy import TriggerPolicy
from perftracker.wire import framing as wire
from perftracker.wire.framing import MessageType

FAST = ChannelOptions(heartbeat_s=0.1, stats_s=0.2, backoff_min_s=0.05, backoff_max_s=0.2, ack_timeout_s=2.0)


class Runtime:
    def __init__(self) -> None:
        self.identity = SimpleNamespace(rank=2, world_size=4, local_rank=0, host="hostA", pid=os.getpid(),
                                        training_tid=threading.get_native_id(), job="jobX")
        self.iteration = 17
        self.sink: Any = None
        self.trigger_policy: TriggerPolicy | None = None  # the real one, set by _channel
        self.released = 0

    def release_held_trigger(self) -> bool:
        self.released += 1  # the channel asks every stats period; the policy decides (its own tests)
        return False

    def recent_iteration_ms(self) -> list[float]:
        return [10.0, 12.0, 11.0]

    def last_event(self) -> tuple[str, int]:
        return ("optimizer.step", time.monotonic_ns())

    def set_sink(self, sink: Any) -> None:
        self.sink = sink

    def settle_identity(self, store_wait_s: float = 30.0, exiting: bool = False) -> bool:
        return True  # the identity above is the real one

    def check_blocked(self, now_ns: int | None = None, notify: bool = True,
                      extra_s: float = 0.0) -> dict[str, object] | None:
        return None  # never blocked


class Window:
    """Stand-in ProfileWindow: arm() returns at once and reports from another thread, like the real one."""

    def __init__(self) -> None:
        self.armed: list[tuple[str, float]] = []

    def arm(self, session: str, window_s: float, on_done: Any) -> bool:
        if self.armed and self.armed[-1][0] == "busy":
            return False
        self.armed.append((session, window_s))
        res = SimpleNamespace(raw_path=f"/x/{session}.npz", start_ns=1, end_ns=2, session=session, error="",
                              samples_path=None)
        threading.Timer(0.05, on_done, args=(res,)).start()
        return True


class Agent:
    """A real Unix-socket server speaking the wire protocol; records what workers send."""

    def __init__(self, path: str, accept: bool = True) -> None:
        self.path = path
        self.accept = accept
        self.msgs: list[dict] = []
        self.conns: list[socket.socket] = []
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.exists(path):
            os.unlink(path)
        self.srv.bind(path)
        self.srv.listen()
        self._stop = False
        self.t = threading.Thread(target=self._accept, daemon=True)
        self.t.start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            if self._stop:
                c.close()
                return
            self.conns.append(c)
            threading.Thread(target=self._read, args=(c,), daemon=True).start()

    def _read(self, c: socket.socket) -> None:
        try:
            while True:
                m = wire.recv_message(c)
                self.msgs.append(m)
                if m["type"] == "register":
                    wire.send_message(c, wire.make_message(MessageType.ACK, ok=self.accept, error="no"))
        except Exception:
            return

    def send_all(self, msg: dict) -> None:
        for c in self.conns:
            wire.send_message(c, msg)

    def of(self, kind: str) -> list[dict]:
        return [m for m in self.msgs if m["type"] == kind]

    def wait_for(self, kind: str, n: int = 1, timeout_s: float = 5.0) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = self.of(kind)
            if len(got) >= n:
                return got
            time.sleep(0.01)
        raise AssertionError(f"no {n}x {kind} within {timeout_s}s; got {[m['type'] for m in self.msgs]}")

    def kill(self) -> None:
        """Die as a process does: nothing can connect any more, then every connection closes. (Closing
        the connections first let a worker reconnect to the still-listening socket in between, and
        stay registered with this dead agent: 1 run in 3 of this file.)"""
        self._stop = True
        os.unlink(self.path)
        try:
            self.srv.shutdown(socket.SHUT_RDWR)  # wakes the accept thread; queued connections are reset
        except OSError:
            pass
        self.srv.close()
        for c in list(self.conns):
            c.close()


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    d = Path("/tmp") / f"pt-ch-{os.getpid()}-{time.monotonic_ns()}"  # short: AF_UNIX paths are <108 bytes
    d.mkdir()
    yield d
    for p in d.iterdir():
        p.unlink()
    d.rmdir()


def _channel(run_dir: Path, rt: Runtime, window: Window | None = None) -> AgentChannel:
    cfg = Config(run_dir=str(run_dir), autostart_agent=False)
    rt.trigger_policy = TriggerPolicy(rt, cfg)  # type: ignore[arg-type]
    ch = AgentChannel(rt, cfg, FAST, window_factory=lambda: window or Window())
    rt.set_sink(ch)
    return ch.start()


def test_registers_and_sends_heartbeats_and_stats(run_dir: Path) -> None:
    agent = Agent(wire.socket_path(run_dir))
    rt = Runtime()
    ch = _channel(run_dir, rt)
    try:
        reg = agent.wait_for("register")[0]
        assert (reg["rank"], reg["world_size"], reg["local_rank"], reg["host"], reg["job"]) == (2, 4, 0, "hostA", "jobX")
        assert reg["pid"] == os.getpid() and reg["training_tid"] == rt.identity.training_tid
        assert ch.wait_connected(2)
        beats = agent.wait_for("heartbeat", 3)
        assert beats[-1]["iteration"] == 17 and beats[-1]["last_event"] == "optimizer.step"
        stats = agent.wait_for("iter_stats")
        assert stats[0]["recent_ms"] == [10.0, 12.0, 11.0] and stats[0]["min_ms"] == 10.0
        assert rt.released >= 1  # every stats period the channel asks the runtime to release a held trigger
    finally:
        ch.stop()
        agent.kill()


def test_trigger_then_start_window_then_window_done(run_dir: Path) -> None:
    agent = Agent(wire.socket_path(run_dir))
    rt, win = Runtime(), Window()
    ch = _channel(run_dir, rt, win)
    try:
        assert ch.wait_connected(3)
        t0 = time.perf_counter()
        rt.sink.on_trigger("slowdown", {"ratio": 1.3, "obj": object()})
        assert time.perf_counter() - t0 < 0.01  # the caller never waits on the socket
        trig = agent.wait_for("trigger")[0]
        assert trig["reason"] == "slowdown" and trig["detail"]["ratio"] == 1.3
        assert trig["detection"]["ratio"] == 1.3 and trig["detection"]["schema_version"] == 1  # typed, versioned
        agent.send_all(wire.make_message(MessageType.START_WINDOW, session="s-1", window_s=0.5))
        done = agent.wait_for("window_done")[0]
        assert win.armed == [("s-1", 0.5)]
        assert done["session"] == "s-1" and done["raw_path"] == "/x/s-1.npz" and done["error"] == ""
    finally:
        ch.stop()
        agent.kill()


def test_window_that_cannot_arm_reports_an_error(run_dir: Path) -> None:
    agent = Agent(wire.socket_path(run_dir))
    rt = Runtime()

    def broken() -> Any:
        raise ImportError("no profiler here")

    ch = AgentChannel(rt, Config(run_dir=str(run_dir), autostart_agent=False), FAST, window_factory=broken).start()
    try:
        assert ch.wait_connected(3)
        agent.send_all(wire.make_message(MessageType.START_WINDOW, session="s-2", window_s=1))
        done = agent.wait_for("window_done")[0]
        assert done["session"] == "s-2" and "no profiler here" in done["error"]
    finally:
        ch.stop()
        agent.kill()


def test_agent_loss_then_reconnect_delivers_queued_trigger(run_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = wire.socket_path(run_dir)
    agent = Agent(path)
    rt = Runtime()
    ch = _channel(run_dir, rt)
    try:
        assert ch.wait_connected(3)
        caplog.set_level(logging.WARNING, logger="perftracker.runtime.channel")
        agent.kill()
        deadline = time.monotonic() + 3
        while ch.connected and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not ch.connected
        t0 = time.perf_counter()
        for _ in range(100):
            rt.sink.on_trigger("manual", {})
        assert time.perf_counter() - t0 < 0.1
        time.sleep(0.5)  # several failed reconnects
        lost = [r for r in caplog.records if "node agent" in r.getMessage()]
        assert 1 <= len(lost) <= 2, [r.getMessage() for r in lost]  # "lost" once, "no agent" once
        agent2 = Agent(path)
        try:
            # a deadline, not a speed: reconnects come every backoff_max_s (0.2 s), but a stalled
            # 2-core host once took more than 3 s (2026-11-26)
            agent2.wait_for("register", timeout_s=10)
            assert len(agent2.wait_for("trigger", 100)) == 100
            assert ch.connects == 2
        finally:
            agent2.kill()
    finally:
        ch.stop()


def test_refused_registration_retries_and_never_blocks(run_dir: Path) -> None:
    agent = Agent(wire.socket_path(run_dir), accept=False)
    rt = Runtime()
    ch = _channel(run_dir, rt)
    try:
        agent.wait_for("register", 2, timeout_s=3)  # it keeps retrying
        assert not ch.connected
    finally:
        ch.stop()
        agent.kill()


def test_no_agent_and_no_autostart_is_quiet_and_cheap(run_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="perftracker.runtime.channel")
    rt = Runtime()
    ch = _channel(run_dir, rt)
    try:
        t0 = time.perf_counter()
        rt.sink.on_trigger("x", {})
        rt.sink.on_blocked({"idle_s": 9.0})
        assert time.perf_counter() - t0 < 0.01
        time.sleep(0.6)
        msgs = [r.getMessage() for r in caplog.records]
        assert sum("no node agent" in m for m in msgs) == 1, msgs
    finally:
        ch.stop()


def test_the_blocked_limit_is_longer_by_the_window_during_and_after_a_profile_window(run_dir: Path) -> None:
    """Stopping the profiler stalls a rank for seconds; its peers must not report that as a hang.
    A real hang that begins in the window (a peer SIGSTOPped) is reported at most a window later
    (issue 19: muted for 35 s before)."""
    rt, win = Runtime(), Window()
    calls: list[float] = []
    rt.check_blocked = lambda *a, **k: calls.append(float(k.get("extra_s", 0.0)))  # type: ignore[attr-defined]
    ch = AgentChannel(rt, Config(run_dir=str(run_dir), autostart_agent=False), FAST, window_factory=lambda: win)
    ch._check_blocked()
    assert calls == [0.0]  # outside a window: the normal limit
    ch._start_window("s-1", 0.2)
    time.sleep(0.3)  # the stand-in window has reported done by now
    ch._check_blocked()
    assert calls == [0.0, 0.2]  # during the window and max(30 s, 2 x window) after it: limit + window
    ch._quiet_until = time.monotonic() - 1  # the quiet period is over
    ch._check_blocked()
    assert calls == [0.0, 0.2, 0.0]


def test_every_heartbeat_after_at_exit_says_exited(run_dir: Path) -> None:
    """The interpreter may run for seconds after the channel's exit hook (other atexit hooks, module
    teardown): a periodic heartbeat sent then must not undo "exited", or the agent takes the clean
    exit for a death and opens a hang session."""
    agent = Agent(wire.socket_path(run_dir))
    ch = _channel(run_dir, Runtime())
    try:
        assert ch.wait_connected(5)
        agent.wait_for("heartbeat", 2)
        ch.at_exit()
        n = len(agent.of("heartbeat"))
        later = agent.wait_for("heartbeat", n + 3)[n:]  # FAST: a beat every 0.1 s
        assert agent.of("heartbeat")[n - 1]["phase"] == "exited" or later[0]["phase"] == "exited"
        assert [b["phase"] for b in later] == ["exited"] * len(later)
    finally:
        ch.stop()
        agent.kill()


@pytest.mark.parametrize("local_rank", [0, 1])
def test_an_agent_notice_is_one_line_once_on_local_rank_0(run_dir: Path, local_rank: int,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    agent = Agent(wire.socket_path(run_dir))
    rt = Runtime()
    rt.identity.local_rank = local_rank
    ch = _channel(run_dir, rt)
    text = "perftracker: session s1: no report will come from 2 rank(s) on this node:\nrank 0 window failed"
    try:
        assert ch.wait_connected(5)
        with caplog.at_level(logging.DEBUG, logger="perftracker.runtime.channel"):
            for _ in range(3):  # the same failure again: still one line
                agent.send_all(wire.make_message(MessageType.NOTICE, key="session-failed", text=text))
            agent.wait_for("heartbeat", len(agent.of("heartbeat")) + 3)  # the channel has read them
        lines = [r for r in caplog.records if "no report will come" in r.getMessage()]
        warnings = [r for r in lines if r.levelno >= logging.WARNING]
        assert len(lines) == 3
        assert [r.getMessage() for r in warnings] == (
            ["perftracker: session s1: no report will come from 2 rank(s) on this node: rank 0 window failed"]
            if local_rank == 0 else [])
    finally:
        ch.stop()
        agent.kill()


class HandedWindow(Window):
    """Stand-in for a window handed to the writer child at exit: its result names the child."""

    def arm(self, session: str, window_s: float, on_done: Any) -> bool:
        self.armed.append((session, window_s))
        res = SimpleNamespace(raw_path=f"/x/{session}.npz", start_ns=1, end_ns=2, session=session, error="",
                              samples_path=None, writer_pid=4242)
        threading.Timer(0.05, on_done, args=(res,)).start()
        return True


@pytest.mark.parametrize("handed", [False, True])
def test_a_window_whose_process_ends_first_has_its_cost_in_the_ledger(run_dir: Path, handed: bool) -> None:
    """Issue 30 (c): a window's cost is measured 5 s after delivery, by a timer that never fires in a
    process that has gone. Delivered normally, the channel's exit hook measures it (partial); handed
    to the writer child at exit, it is measured at once and WINDOW_DONE carries the cost."""
    import json
    import shutil

    from perftracker.runtime.window.cost import ledger_path

    agent = Agent(wire.socket_path(run_dir))
    rt = Runtime()
    ch = _channel(run_dir, rt, HandedWindow() if handed else Window())
    ledger = ledger_path(run_dir, "jobX", 2)
    try:
        assert ch.wait_connected(3)
        agent.send_all(wire.make_message(MessageType.START_WINDOW, session="s-1", window_s=0.5))
        done = agent.wait_for("window_done")[0]
        rt.iteration += 5  # the job trained on a little, then ended before the 5 s after-phase
        if handed:
            assert done["cost"]["cost_partial"] == 1.0 and done["cost"]["cost_s"] >= 0.0, done
        else:
            assert "cost_s" not in done.get("cost", {}) and not ledger.exists()
        ch.at_exit()
        windows = json.loads(ledger.read_text())["windows"]
        assert [(w["session"], w["partial"]) for w in windows] == [("s-1", True)]
        assert windows[0]["iterations"] == (0 if handed else 5)
    finally:
        ch.stop()
        agent.kill()
        shutil.rmtree(run_dir / "budget", ignore_errors=True)
