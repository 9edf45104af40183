"""The worker side of the worker <-> node agent channel, and the runtime's TriggerSink.

One daemon thread ("perftracker-channel") owns the Unix socket ``<run_dir>/agent.sock``:

- it connects (starting the node agent first when autostart is on and none answers), registers the
  worker (rank, local rank, pid, training tid, host, job), and sends heartbeats and iteration
  statistics;
- it is the controller: on START_WINDOW it arms the ProfileWindow, which profiles in the main
  thread at the next iteration boundary and calls back when done; the channel then sends
  WINDOW_DONE. On SNAPSHOT (or when the detector reports the job blocked) it takes a hang snapshot
  of the main thread and sends it;
- if the agent disappears it keeps retrying with exponential backoff. Training never waits on it.

The runtime calls ``on_trigger`` / ``on_blocked`` in its own threads; both only enqueue and wake the
channel thread, so they never block and never raise.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from perftracker.config import Config
from perftracker.errors import PerftrackerError, TransportError
from perftracker.runtime.agent_connect import AgentConnector
from perftracker.runtime.channel_messages import (
    blocked_message,
    heartbeat_message,
    iter_stats_message,
    register_message,
    snapshot_message,
    trigger_message,
    window_done_message,
    window_failed_message,
)
from perftracker.runtime.job_link import JobLink
from perftracker.runtime.protocols import ArmableWindow, ChannelRuntime, FinishedWindow
from perftracker.runtime.window.cost import WindowCostMeter, report_fields
from perftracker.warnonce import WarnOnce
from perftracker.wire import framing as wire
from perftracker.wire.framing import MessageType

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChannelOptions:
    heartbeat_s: float = 1.0  # HEARTBEAT period
    stats_s: float = 2.0  # ITER_STATS period
    backoff_min_s: float = 0.2  # first reconnect delay
    backoff_max_s: float = 5.0  # reconnect delay cap
    connect_timeout_s: float = 2.0  # connect/send timeout on the socket
    ack_timeout_s: float = 5.0  # wait for the agent's ACK to REGISTER
    autostart_every_s: float = 10.0  # at most one autostart attempt per this period
    queue_max: int = 256  # outgoing messages kept while disconnected (oldest dropped)
    recent_iterations: int = 50  # iteration times sent in ITER_STATS
    # at exit, wait at most this long to send the last messages (a handed-over window, "exited"): a
    # worker that exits before its "exited" heartbeat is out looks dead to the agent (a hang session).
    # With the window's exit delay (7 s) and its cancel (1 s), exit waits at most 10 s in all.
    exit_flush_s: float = 2.0
    # after a crash, wait at most this long for the crash snapshot to reach the agent (it may first have
    # to settle its identity and register: a crash before the first iteration)
    crash_flush_s: float = 4.0
    blocked_poll_s: float = 0.5  # how often the controller asks the runtime whether training is blocked
    settle_poll_s: float = 0.5  # until the identity is settled, how often to look again


class AgentChannel:
    """The worker's connection to its node agent; implements perftracker.runtime.sinks.TriggerSink."""

    def __init__(
        self,
        runtime: ChannelRuntime,
        config: Config,
        options: ChannelOptions | None = None,
        window_factory: Callable[[], ArmableWindow] | None = None,
    ) -> None:
        self.runtime = runtime
        self.config = config
        self.options = options or ChannelOptions()
        self.path = wire.socket_path(config.run_dir)
        self._window_factory = window_factory or self._default_window
        self._window: ArmableWindow | None = None
        self._quiet_until = 0.0  # monotonic s: until then the blocked limit is longer (profile window)
        self._quiet_extra_s = 0.0  # ... by this much: the window's length
        self._out: collections.deque[dict[str, Any]] = collections.deque(maxlen=self.options.queue_max)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._kick = threading.Event()  # at a crash exit: stop waiting for the identity, look again now
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._thread: threading.Thread | None = None
        self._connected = threading.Event()
        self._warn_once = WarnOnce(log)
        self._connector = AgentConnector(self.path, runtime, config, self.options.connect_timeout_s,
                                         self.options.autostart_every_s, self._warn_once)
        self._snapshot_wanted: list[str] = []  # sessions ("" for detector-initiated)
        self._exiting = False  # at_exit ran: every later heartbeat says "exited"
        self._cost: WindowCostMeter | None = None
        self.connects = 0  # successful registrations, for status and tests
        self.sent_triggers = 0
        # one localizer per job across nodes (issue 42): what this worker tells its agent
        self._job_link = JobLink(lambda: self.runtime.identity, config.localizer_url)
        self._ack: dict[str, Any] = {}

    # --- TriggerSink ---------------------------------------------------------------------------

    def on_trigger(self, reason: str, detail: Mapping[str, object]) -> None:
        """A trigger the runtime's policy let out (perftracker/runtime/trigger/policy.py): carried as is."""
        try:
            self._enqueue(trigger_message(reason, detail, self._window_s_override()))
        except Exception as exc:  # never raise into the caller
            self._warn_once("trigger", "perftracker: could not queue a trigger: %s", exc)

    def on_blocked(self, detail: Mapping[str, object]) -> None:
        try:
            self._enqueue(blocked_message(detail))
            with self._lock:
                self._snapshot_wanted.append("")
            self._wake()
        except Exception as exc:
            self._warn_once("blocked", "perftracker: could not queue a blocked report: %s", exc)

    # --- lifecycle -----------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def wait_connected(self, timeout_s: float) -> bool:
        return self._connected.wait(timeout_s)

    def start(self) -> AgentChannel:
        self._thread = threading.Thread(target=self._run, name="perftracker-channel", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        self._kick.set()
        self._wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def at_exit(self) -> None:
        """atexit: tell the agent how this process ends, so that it can tell an exit from a death.

        After an uncaught exception in the training thread (perftracker/runtime/exit_capture.py: the chained
        excepthook, else ``sys.last_value``) it first sends a crash snapshot built from the
        exception's traceback (``end="exception"``; a survivor of a dead peer fails inside the
        collective); then a last heartbeat with phase "exited". A process that crashes before its
        identity settled (before its first iteration, e.g. a configuration error) settles it now, so
        that the crash is reported; one that trained but ends before its channel registered (a short
        job, or ``sys.exit(3)`` a few iterations in) registers now, so that the agent knows it and
        reads its exit status from the zombie (perftracker.agent.daemon.worker_exits). Waits at most ``exit_flush_s``
        (``crash_flush_s`` after a crash); never raises.
        """
        try:
            if self._cost is not None:  # a window whose after-phase the exit cut short: its cost now
                self._cost.finish_at_exit()
            if self._stop.is_set() or self._thread is None:
                return
            from perftracker.runtime import exit_capture as crash

            tid = int(self.runtime.identity.training_tid or 0)
            ending = crash.ending_exception(tid)
            wait_s = self.options.exit_flush_s
            if ending is not None:
                wait_s = max(wait_s, self.options.crash_flush_s)
                # a torch.multiprocessing launcher re-raises its child's failure: the child reports it
                if type(ending[0]).__name__ not in ("ProcessRaisedException", "ProcessExitedException"):
                    self._settle_at_exit(exiting=True)
                snap = crash.crash_snapshot(self.runtime, ending[0], ending[1])
                if snap is not None:
                    self._enqueue(snapshot_message(snap))
                self._kick.set()
            self._exiting = True
            beat = heartbeat_message(self.runtime)
            beat["phase"] = "exited"
            self._enqueue(beat)
            settled = self.connected or self._settle_at_exit(exiting=False)
            if settled and not self.connected:
                self._kick.set()  # not registered yet: the channel thread registers now
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                if not self.connected and (not os.path.exists(self.path) or (ending is None and not settled)):
                    return  # no agent to tell: nobody waits for one (a crash waits only for an agent that is there)
                with self._lock:
                    if not self._out and self.connected:
                        return
                time.sleep(0.01)
        except Exception as exc:  # noqa: BLE001 - the process is ending; never get in its way
            log.debug("perftracker: exit report failed: %r", exc)

    # --- internals -----------------------------------------------------------------------------

    def _settle_at_exit(self, exiting: bool) -> bool:
        """Settle the identity now, waiting at most 1 s on the default store; whether it is settled.
        ``exiting``: settle even without a completed iteration (a crash at setup)."""
        try:
            return bool(self.runtime.settle_identity(store_wait_s=1.0, exiting=exiting))
        except Exception as exc:  # noqa: BLE001
            log.debug("perftracker: identity not settled at exit: %r", exc)
            return False

    def _enqueue(self, msg: dict[str, Any]) -> None:
        with self._lock:
            self._out.append(msg)
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:  # pipe full (already awake) or closed
            pass

    def _run(self) -> None:
        delay = self.options.backoff_min_s
        while not self._stop.is_set():
            if not self._identity_settled():
                self._kick.wait(0.05 if self._kick.is_set() else self.options.settle_poll_s)
                continue
            try:
                sock = self._connector.connect()
            except Exception as exc:  # noqa: BLE001 - a bug here must not kill the thread silently
                self._warn_once("connect-bug", "perftracker: agent connection failed: %r", exc)
                sock = None
            if sock is None:
                self._kick.wait(0.05 if self._kick.is_set() else self._connector.retry_delay(delay))
                delay = min(delay * 2, self.options.backoff_max_s)
                continue
            connects = self.connects
            try:
                self._serve(sock)
            except (TransportError, OSError) as exc:
                if not self._stop.is_set():
                    self._warn_once("lost", "perftracker: lost the node agent (%s); training continues, reconnecting", exc)
            except Exception as exc:  # noqa: BLE001
                self._warn_once("serve-bug", "perftracker: agent channel error: %r; reconnecting", exc)
            finally:
                self._connected.clear()
                sock.close()
            if self.connects > connects:  # it was registered: the next attempt may come soon
                delay = self.options.backoff_min_s
            else:  # refused or failed before registering: back off
                self._stop.wait(delay)
                delay = min(delay * 2, self.options.backoff_max_s)

    def _identity_settled(self) -> bool:
        """Register only under the real identity (perftracker/runtime/identity.py): a process whose rank is
        not known yet (before init_process_group, an mp.spawn parent, a DataLoader worker) waits."""
        try:
            return bool(self.runtime.settle_identity())
        except Exception as exc:  # noqa: BLE001 - never kill the channel thread
            self._warn_once("settle", "perftracker: could not settle this process's identity: %r", exc)
            return False

    def _serve(self, sock: socket.socket) -> None:
        opts = self.options
        wire.send_message(sock, register_message(self.runtime, self._job_link.pending()))
        sock.settimeout(opts.ack_timeout_s)
        ack = wire.recv_message(sock)
        if ack.get("type") != MessageType.ACK.value or not ack.get("ok"):
            raise TransportError(f"agent refused the registration: {ack.get('error', ack)}")
        sock.settimeout(opts.connect_timeout_s)
        self._ack = ack
        self._job_link.agent_changed()
        self.connects += 1
        self._connected.set()
        log.info("perftracker: registered with the node agent at %s", self.path)
        decoder = wire.FrameDecoder()
        next_beat = 0.0
        next_stats = time.monotonic() + opts.stats_s
        next_blocked = time.monotonic() + opts.blocked_poll_s
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_beat:
                beat = heartbeat_message(self.runtime)
                if self._exiting:  # after at_exit: a later beat must not undo "exited" (a death)
                    beat["phase"] = "exited"
                self._send(sock, beat)
                for link_msg in self._job_link.messages(self._ack):  # issue 42, at once and then each beat
                    self._send(sock, link_msg)
                next_beat = now + opts.heartbeat_s
            if now >= next_stats:
                stats = iter_stats_message(self.runtime, opts.recent_iterations)
                if stats is not None:
                    self._send(sock, stats)
                self._send_due_trigger()
                next_stats = now + opts.stats_s
            if now >= next_blocked:
                self._check_blocked()
                next_blocked = now + opts.blocked_poll_s
            self._take_wanted_snapshots()
            self._flush(sock)
            timeout = max(0.0, min(next_beat, next_stats, next_blocked) - time.monotonic())
            watched: list[socket.socket | int] = [sock, self._wake_r]
            readable, _, _ = select.select(watched, [], [], timeout)
            if self._wake_r in readable:
                try:
                    while os.read(self._wake_r, 4096):
                        pass
                except (BlockingIOError, OSError):
                    pass
            if sock in readable:
                data = sock.recv(1 << 16)
                if not data:
                    raise wire.ConnectionClosed("agent closed the socket")
                for msg in decoder.feed(data):
                    self._handle(msg)

    def _send(self, sock: socket.socket, msg: Mapping[str, Any]) -> None:
        wire.send_message(sock, msg)

    def _flush(self, sock: socket.socket) -> None:
        while True:
            with self._lock:
                if not self._out:
                    return
                msg = self._out[0]
            wire.send_message(sock, msg)  # on failure the message stays queued for the next agent
            with self._lock:
                if self._out and self._out[0] is msg:
                    self._out.popleft()
            if msg["type"] == MessageType.TRIGGER.value:
                self.sent_triggers += 1

    def _check_blocked(self) -> None:
        """The controller's poll: the runtime calls on_blocked (in this thread) once per episode.

        **[decision]** While a profile window runs and for ``max(30 s, 2 x window)`` after this
        rank's window ended, the blocked limit is longer by the window's length: stopping the
        profiler blocks a rank's training thread for seconds, and its peers then wait in the next
        collective longer than the normal limit. That is profiling cost, not a hang. A real hang
        that starts inside a window (a peer SIGSTOPped) is reported at most the window's length
        later than elsewhere (it was muted until the quiet period ended: 35 s late in the issue-19
        run). A profiler stop that outlasts even that is told apart by the localizer: the stalled
        rank is alive, sends heartbeats and its snapshot shows perftracker's own window code (a
        pause), where a stopped peer is silent and procfs says so (localizer/diagnose/incidents/hang.py).
        """
        try:
            if time.monotonic() < self._quiet_until:
                self.runtime.check_blocked(extra_s=self._quiet_extra_s)
            else:
                self.runtime.check_blocked()
        except Exception as exc:  # noqa: BLE001
            self._warn_once("check-blocked", "perftracker: blocked check failed: %r", exc)

    def _handle(self, msg: dict[str, Any]) -> None:
        kind = msg["type"]
        if kind == MessageType.START_WINDOW.value:
            self._start_window(str(msg["session"]), float(msg["window_s"]), str(msg.get("reason") or ""))
        elif kind == MessageType.SNAPSHOT.value:
            with self._lock:
                self._snapshot_wanted.append(str(msg["session"]))
        elif kind == MessageType.NOTICE.value:
            self._notice(str(msg["key"]), str(msg["text"]))
        elif kind == MessageType.JOB_SERVED.value:
            self._job_link.on_served(msg)
        elif kind == MessageType.REPORT_READY.value:
            log.warning("%s", " ".join(str(msg["text"]).split())[:600])
        else:
            log.debug("perftracker: ignoring %s from the agent", kind)

    def _notice(self, key: str, text: str) -> None:
        """An agent-side failure that means no report will come: one line in the training log, once
        per kind, on local rank 0 only (the other ranks of the node log it at debug level)."""
        line = " ".join(text.split())[:500]  # one line, whatever the agent sent
        if int(self.runtime.identity.local_rank) == 0:
            self._warn_once(f"notice-{key}", "%s", line)
        else:
            log.debug("%s", line)

    def _default_window(self) -> ArmableWindow:
        from perftracker.runtime.window.profile import ProfileWindow, WindowOptions

        out_dir = os.path.join(self.config.run_dir, "windows")
        os.makedirs(out_dir, exist_ok=True)
        options = WindowOptions(stacks=self.config.window_stacks, exit_wait_s=self.config.exit_delay_s,
                                stack_period_us=self.config.window_stack_period_us, writer=self.config.window_writer,
                                converge=self.config.window_converge, converge_tolerance=self.config.window_tolerance)
        return ProfileWindow(self.runtime.identity, out_dir, options=options, runtime=self.runtime)

    def _window_s_override(self) -> float | None:
        """window_s only when set explicitly: it overrides the localizer's default."""
        return float(self.config.window_s) if "PERFTRACKER_WINDOW_S" in os.environ else None

    def _send_due_trigger(self) -> None:
        """Channel thread, every stats period: the runtime sends a held trigger that is now worth a
        window (its policy decides; the trigger comes back through ``on_trigger``)."""
        try:
            self.runtime.release_held_trigger()
        except Exception as exc:  # noqa: BLE001 - never into training
            self._warn_once("held-trigger", "perftracker: could not send a held trigger: %r", exc)

    def cost_meter(self) -> WindowCostMeter:
        """What this process's windows cost: the meter of the runtime's trigger policy (the budget
        and the hold read the same ledger)."""
        if self._cost is None:
            policy = self.runtime.trigger_policy
            if policy is None:
                raise PerftrackerError("the runtime has no trigger policy (its services have not started)")
            self._cost = policy.meter()
        return self._cost

    def _start_window(self, session: str, window_s: float, reason: str = "") -> None:
        grace_s = max(30.0, 2.0 * window_s)
        meter: WindowCostMeter | None = None
        budget: dict[str, Any] | None = None  # the budget as it stands when the window opens
        try:
            meter = self.cost_meter()
            meter.armed(session, reason)
            budget = meter.to_dict()["budget"]
        except Exception as exc:  # noqa: BLE001
            self._warn_once("budget-failed", "perftracker: window budget unavailable: %r", exc)
        self._quiet_until = max(self._quiet_until, time.monotonic() + window_s + grace_s)
        self._quiet_extra_s = max(window_s, 0.0)

        def done(result: FinishedWindow) -> None:
            self._quiet_until = max(self._quiet_until, time.monotonic() + grace_s)
            measured = None
            if meter is not None:
                if int(getattr(result, "writer_pid", 0) or 0) > 0:
                    # handed to a child at exit: no after-phase to wait for; measured now, partial
                    measured = meter.measure(session, partial=True)
                else:
                    meter.delivered(session)
            try:
                cost = report_fields(budget, (int(result.end_ns or 0) - int(result.start_ns or 0)) / 1e9,
                                     int(getattr(result, "blocking_ns", 0) or 0) / 1e9, measured)
                self._enqueue(window_done_message(result, session, cost))
            except Exception as exc:  # noqa: BLE001 - runs in the training thread
                self._warn_once("done", "perftracker: could not report a finished window: %s", exc)

        error = ""
        try:
            if self._window is None:
                self._window = self._window_factory()
            if not self._window.arm(session, window_s, done):
                error = "a profile window is already active"
        except (PerftrackerError, ImportError, OSError) as exc:
            error = f"profile window unavailable: {exc}"
        except Exception as exc:  # noqa: BLE001
            error = f"profile window failed: {exc!r}"
        if error:
            log.warning("perftracker: session %s: %s", session, error)
            self._enqueue(window_failed_message(session, error))

    def _take_wanted_snapshots(self) -> None:
        with self._lock:
            wanted, self._snapshot_wanted = self._snapshot_wanted, []
        for session in dict.fromkeys(wanted):
            try:
                from perftracker.runtime.hang_capture import take_snapshot

                snap = take_snapshot(self.runtime, session=session)
                self._enqueue(snapshot_message(snap))
            except Exception as exc:  # noqa: BLE001 - hang snapshots are best effort
                self._warn_once("snapshot", "perftracker: could not take a hang snapshot: %r", exc)


_channel: AgentChannel | None = None
_channel_lock = threading.Lock()


def start_channel(runtime: ChannelRuntime, config: Config, options: ChannelOptions | None = None) -> AgentChannel | None:
    """Connect this training process to its node agent (once per process) and make the channel the
    runtime's trigger sink. Never raises; returns None when disabled or on failure."""
    global _channel
    try:
        if config.disable:
            return None
        # Called at the first hooked step (perftracker/__init__.py): a process that only imports
        # perftracker never gets here. A multiprocessing child that trains gets a channel too
        # (torch.multiprocessing.spawn starts the ranks that way); one that never settles its
        # identity never registers (perftracker/runtime/identity.py).
        with _channel_lock:
            if _channel is not None and _channel.runtime is runtime and not _channel._stop.is_set():
                return _channel
            if _channel is not None:
                _channel.stop(0.5)
            ch = AgentChannel(runtime, config, options)
            runtime.set_sink(ch)
            _channel = ch.start()
            atexit.register(ch.at_exit)
            from perftracker.runtime.exit_capture import install

            install()  # chained in front of the user's excepthooks; never raises
            return ch
    except Exception as exc:  # noqa: BLE001 - never break training
        log.warning("perftracker: agent channel not started: %r; detection goes on without an agent", exc)
        return None


def get_channel() -> AgentChannel | None:
    return _channel


def stop_channel() -> None:
    global _channel
    with _channel_lock:
        if _channel is not None:
            _channel.stop()
            _channel = None
