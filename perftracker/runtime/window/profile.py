"""The profile window: profile the training thread from one iteration boundary to the first
boundary after ``window_s``, then hand over a ``RawWindow`` file without stalling training.

Timeline (docs/design.md section 4):

1. ``arm(session, window_s, on_done)`` from any thread. It hooks the window to the runtime's
   boundary listener and, if configured, spawns the sampler process (``python -m perftracker.agent.samplers``).
2. At the next boundary (main thread): start torch's profiler through the low-level Kineto path
   (CPU ops, plus CUDA activities when a GPU is present; no Python tracer), start the stack
   sampler thread and the GC recorder, open NVTX ranges for the window and the iteration.
3. At every boundary inside the window: close/open the iteration's NVTX range.
4. At the first boundary after ``window_s`` (main thread): ``_disable_profiler()``, stop the stack
   sampler. That is all the main thread pays (``WindowResult.blocking_ns``).
5. A background thread turns the profiler result and stack samples into a ``RawWindow``, saves it,
   collects the sampler's file and calls ``on_done(WindowResult)``.

A second ``arm`` while a window is armed, running or being written is refused with a log line.
Any failure (another profiler active, a full disk) ends the window with ``WindowResult.error``;
nothing is raised into the training loop and no profiler state is left behind.

Exit and deactivation (``shutdown_all``): a Kineto profiler still enabled when the interpreter
finalizes crashes the process (SIGSEGV), so an ``atexit`` hook (registered once, with the first
window) and ``Runtime.stop()`` (``perftracker.deactivate()``) end any open window: an armed one is
cancelled, a running one is stopped in the training thread and discarded (its result is not
written: that could take a minute), and at exit a writer thread is cancelled at its next throttle
check and waited for at most ``exit_wait_s``. Each discarded window logs one line and delivers a
``WindowResult`` with an error. ``ProfileWindow`` owns the state machine and three parts that it
calls: its ``WindowInstruments`` (perftracker/runtime/window/instruments.py: profiler, stack
sampling, NVTX, started and undone), its ``WindowWriter`` (perftracker/runtime/window/writer.py:
paths, writer thread, conversion child) and its ``WindowExit`` (perftracker/runtime/window/exit.py:
the exit and deactivation path); the state they share is in perftracker/runtime/window/state.py.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perftracker.clock import Clock, MonotonicClock
from perftracker.errors import PerftrackerError
from perftracker.runtime.convergence import window_converged
from perftracker.runtime.fork_safety import fork_unsafe
from perftracker.runtime.gpu_identity import own_gpu_uuid
from perftracker.runtime.protocols import WindowRuntime, WorkerIdentity
from perftracker.runtime.sampler_process import SamplerProcess
from perftracker.runtime.window.exit import WindowExit, _register, shutdown_all
from perftracker.runtime.window.handoff import hand_over
from perftracker.runtime.window.instruments import WindowInstruments
from perftracker.runtime.window.state import (
    _ACTIVE,
    _ARMED,
    _FINISHING,
    _IDLE,
    _OVERRUN,
    WindowOptions,
    WindowResult,
    _Active,
)
from perftracker.runtime.window.writer import WindowWriter

__all__ = ["ProfileWindow", "WindowOptions", "WindowResult", "shutdown_all"]

log = logging.getLogger(__name__)


UUID_TRIES = 1000  # boundaries at which the training thread's CUDA device UUID is looked for


def event_bound_reached(iterations: int, events_per_iter: float, max_events: int) -> bool:
    """Whether a window of ``iterations`` would hold more than ``max_events`` profiler events at the
    last window's ``events_per_iter``; never before that rate is known, nor with no bound, nor
    before one iteration (a window always holds at least one)."""
    if max_events <= 0 or events_per_iter <= 0 or iterations < 1:
        return False
    return (iterations + 1) * events_per_iter > max_events


class ProfileWindow:
    """One profile window at a time for this training process (see the module docstring)."""

    def __init__(
        self,
        runtime_identity: WorkerIdentity,
        out_dir: str | Path,
        clock: Clock | None = None,
        options: WindowOptions | None = None,
        runtime: WindowRuntime | None = None,
    ) -> None:
        self.identity = runtime_identity
        self.out_dir = Path(out_dir)
        self.clock = clock or MonotonicClock()
        self.options = options or WindowOptions()
        self._runtime = runtime
        self._events_per_iter = 0.0  # of the last window written: bounds the next (max_window_events)
        # the training thread's CUDA device UUID, read on that thread (the current device is per
        # thread: arm() runs in the channel's thread, where it is device 0); tried at the first
        # boundaries until the job has initialised CUDA, then never again
        self._gpu_uuid = ""
        self._uuid_tries = UUID_TRIES
        self._hooked = False
        self._lock = threading.Lock()
        self._state = _IDLE
        self._cur: _Active | None = None
        self._fork_warned = False
        self.writer = WindowWriter(self.identity, self.out_dir, self.options, self._deliver, hand_over)
        self.instruments = WindowInstruments(self.options, self.writer)
        self.exit_path = WindowExit(self)
        _register(self)

    # ---------------------------------------------------------------- any thread
    @property
    def state(self) -> str:
        return self._state

    @property
    def current(self) -> _Active | None:
        """The window armed, running or being written; None when idle."""
        return self._cur

    def arm(self, session: str, window_s: float, on_done: Callable[[WindowResult], None]) -> bool:
        """Profile ``window_s`` from the next iteration boundary. False (+ a log line) if busy."""
        with self._lock:
            if self._state != _IDLE:
                log.warning("perftracker: window for session %r ignored: session %r is %s",
                            session, self._cur.session if self._cur else "?", self._state)
                return False
            cur = _Active(session, int(window_s * 1e9), on_done, self.clock.now_ns())
            self._cur = cur
            self._state = _ARMED
        if self.options.writer == "fork" or self.options.exit_handoff:
            cur.fork_unsafe = fork_unsafe()  # here, not in the training thread: reads /proc/self/maps
            if cur.fork_unsafe and not self._fork_warned:
                self._fork_warned = True
                log.warning("perftracker: windows are written in a thread of this process, not a forked child: %s",
                            cur.fork_unsafe)
        self._hook()
        self._profiling(True, window_s)
        if self.options.spawn_sampler:
            try:
                args = self.options.sampler_args
                if "--gpu-index" not in args and self._gpu_uuid:  # the process's own CUDA device (issue 43)
                    args = (*args, "--gpu-uuid", self._gpu_uuid)
                cur.sampler = SamplerProcess.spawn(self.writer.pid(), self.writer.training_tid(), window_s,
                                                   self.writer.path(session, "samples"), args,
                                                   self.options.helper_cpus)
            except (OSError, PerftrackerError) as exc:
                log.warning("perftracker: sampler process not started (%s); window goes on without samples", exc)
        return True

    def shutdown(self, reason: str = "process exiting", writer_wait_s: float | None = None) -> None:
        """End this window now (exit hook, deactivate); never raises (``WindowExit.shutdown``)."""
        self.exit_path.shutdown(reason, writer_wait_s)

    def finish_at_exit(self, wait_s: float) -> None:
        """Interpreter exit: hand this window over within ``wait_s``, else discard it; never raises."""
        self.exit_path.finish_at_exit(wait_s)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block (not in the training thread!) until no window is armed, running or being written."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self._state != _IDLE:
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    # ---------------------------------------------------------------- training thread
    def on_boundary(self, t_ns: int, iteration: int) -> None:
        """Boundary listener; runs in the training thread and never raises."""
        if self._uuid_tries:
            self._learn_gpu_uuid()
        state = self._state
        if state is _IDLE or state is _FINISHING:
            return
        cur = self._cur
        if cur is None:
            return
        try:
            if state is _OVERRUN:
                self._end_overrun(cur)
            elif state is _ARMED:
                self._maybe_start(cur)
            elif state is _ACTIVE:
                now = self.clock.now_ns()
                cur.step_ns.append(self._step_ns(cur.boundaries_ns[-1], now))
                cur.boundaries_ns.append(now)
                if now - cur.start_ns >= cur.window_ns:
                    cur.end_reason = "window_s"
                    self._stop(cur, now)
                elif self.options.converge and self._converged(cur, now):
                    cur.end_reason = "converged"
                    self._stop(cur, now)
                elif event_bound_reached(len(cur.boundaries_ns) - 1, self._events_per_iter,
                                         self.options.max_window_events):
                    cur.end_reason = "event_bound"
                    log.warning("perftracker: window %s cut after %d iterations, %.1f s of %.1f s: about %.0f "
                                "profiler events per iteration, bound %d (max_window_events)", cur.session,
                                len(cur.boundaries_ns) - 1, (now - cur.start_ns) / 1e9, cur.window_ns / 1e9,
                                self._events_per_iter, self.options.max_window_events)
                    self._stop(cur, now)
                elif self.options.nvtx:
                    self.instruments.nvtx_iteration(cur, iteration)
        except Exception as exc:  # never into the training loop
            log.exception("perftracker: profile window failed")
            self._abort(cur, f"{type(exc).__name__}: {exc}")

    def _learn_gpu_uuid(self) -> None:
        """Training thread: this thread's CUDA device UUID, once the job has initialised CUDA."""
        self._uuid_tries -= 1
        uuid = own_gpu_uuid()
        if uuid:
            self._gpu_uuid, self._uuid_tries = uuid, 0

    def _maybe_start(self, cur: _Active) -> None:
        if cur.sampler is not None and not cur.sampler.ready:
            waited_s = (self.clock.now_ns() - cur.armed_ns) / 1e9
            if waited_s < self.options.sampler_ready_timeout_s and cur.sampler.alive:
                return  # open at a later boundary, once samples will cover the window
            log.warning("perftracker: sampler not ready after %.1f s; window starts without it", waited_s)
            cur.sampler.close()
            cur.sampler = None
        opts = self.options
        try:
            self.instruments.start(cur)
        except PerftrackerError as exc:
            log.warning("perftracker: session %s: profiling skipped, training continues: %s", cur.session, exc)
            self._abort(cur, str(exc))
            return
        cur.thread_ident = threading.get_ident()
        cur.start_ns = self.clock.now_ns()
        cur.boundaries_ns.append(cur.start_ns)
        if cur.sampler is not None:
            cur.sampler.send(f"start {cur.start_ns}")
        self.instruments.open_nvtx(cur)
        with self._lock:
            started = self._cur is cur and self._state == _ARMED
            if started:
                self._state = _ACTIVE
        if not started:  # shut down by another thread meanwhile: undo at once
            self._release(cur)
            return
        cur.watchdog = threading.Timer(cur.window_ns / 1e9 + opts.overrun_s, self._overrun, args=(cur,))
        cur.watchdog.name = "perftracker-window-watchdog"
        cur.watchdog.daemon = True
        cur.watchdog.start()
        log.info("perftracker: window %s started", cur.session)

    def _step_ns(self, prev_ns: int, now_ns: int) -> int:
        """The optimizer step's time in the iteration (prev_ns, now_ns], from the runtime's hook
        times; 0 when no step was seen in it."""
        rt = self._runtime
        pre, post = getattr(rt, "_pre_t_ns", -1), getattr(rt, "_post_t_ns", -1)
        if isinstance(pre, int) and isinstance(post, int) and prev_ns <= pre <= post <= now_ns:
            return post - pre
        return 0

    def _converged(self, cur: _Active, now_ns: int) -> bool:
        """Training thread, at a boundary: have the window's phases converged? (convergence.py)"""
        opts = self.options
        got = window_converged(cur.boundaries_ns, cur.step_ns, (now_ns - cur.start_ns) / 1e9,
                               opts.converge_min_iterations, opts.converge_tolerance, opts.converge_min_s)
        if got is not None and got.converged:
            log.info("perftracker: window %s converged after %d iterations, %.1f s (largest change %.0f%%, %s)",
                     cur.session, got.iterations, (now_ns - cur.start_ns) / 1e9, 100 * got.worst_change,
                     got.worst_phase)
        return got is not None and got.converged

    def _release(self, cur: _Active) -> Any:
        """Undo everything the window did to this process; return the profiler result if any."""
        return self.instruments.release(cur)

    def _claim(self, cur: _Active, states: tuple[str, ...], to: str = _FINISHING) -> str | None:
        """Move ``cur`` from one of ``states`` to ``to``; the previous state, or None if another
        thread (a boundary, an exit hook, the watchdog) got there first."""
        with self._lock:
            if self._cur is not cur or self._state not in states:
                return None
            prev, self._state = self._state, to
            return prev

    def _stop(self, cur: _Active, end_ns: int) -> None:
        t0 = time.monotonic_ns()
        if self._claim(cur, (_ACTIVE,)) is None:
            return
        try:
            result = self._release(cur)
        except Exception as exc:
            log.exception("perftracker: stopping window %s failed", cur.session)
            self._abort_claimed(cur, f"{type(exc).__name__}: {exc}")
            return
        t1 = time.monotonic_ns()
        # with a conversion child, the result is kept until the child has written the file: if the
        # child fails, the writer thread converts it (window_writer.py, _wait_child)
        child = self.writer.fork(cur, result, end_ns) if result is not None and self.writer.use_fork(cur) else None
        blocking_ns = time.monotonic_ns() - t0
        log.info("perftracker: window %s stopped: %.3f s blocked (profiler stop %.3f s, fork %.3f s)",
                 cur.session, blocking_ns / 1e9, (t1 - t0) / 1e9, (blocking_ns - (t1 - t0)) / 1e9)
        # the result goes in a list that the writer empties: Thread keeps its args until the thread
        # ends, and the profiler result's destructor must run before delivery (WindowWriter.finish)
        self.writer.start(cur, [result], end_ns, blocking_ns, child)

    def _abort(self, cur: _Active, error: str) -> None:
        if self._claim(cur, (_ARMED, _ACTIVE)) is not None:
            self._abort_claimed(cur, error)

    def _abort_claimed(self, cur: _Active, error: str) -> None:
        try:
            self._release(cur)
        except Exception as exc:
            log.warning("perftracker: cleaning up the failed window: %s", exc)
        if cur.sampler is not None:
            cur.sampler.close()
        res = WindowResult(cur.session, None, cur.start_ns, cur.start_ns, error=error)
        threading.Thread(target=self._deliver, args=(cur, res), daemon=True).start()

    def _overrun(self, cur: _Active) -> None:
        """Watchdog (its own thread): the training thread made no boundary for ``overrun_s`` past
        the window's end (a hang, or a very long iteration). Stop what can be stopped from here
        (stack sampler, sampler process, switch interval), report the window as failed, and leave
        torch's profiler, which only the training thread can stop, to its next boundary."""
        if self._claim(cur, (_ACTIVE,), to=_OVERRUN) is None:
            return
        try:
            last_s = (self.clock.now_ns() - cur.boundaries_ns[-1]) / 1e9 if cur.boundaries_ns else 0.0
            self.instruments.stop_stack_sampling(cur)
            if cur.sampler is not None:
                cur.sampler.close(timeout_s=0.5)
            error = (f"abandoned: no iteration boundary for {last_s:.0f} s (window {cur.window_ns / 1e9:g} s); "
                     "the training thread looks stuck")
            log.warning("perftracker: window %s %s; torch's profiler stays on until its next boundary",
                        cur.session, error)
        except Exception as exc:  # noqa: BLE001
            error = f"abandoned: {type(exc).__name__}: {exc}"
        finally:
            cur.overrun_done.set()
        self._notify(cur, WindowResult(cur.session, None, cur.start_ns, self.clock.now_ns(), error=error))

    def _end_overrun(self, cur: _Active) -> None:
        """The first boundary after an abandoned window (training thread): stop the profiler, drop it."""
        if not cur.overrun_done.is_set() or self._claim(cur, (_OVERRUN,)) is None:
            return
        t0 = time.monotonic()
        try:
            self._release(cur)
        finally:
            self._idle(cur)
            self._profiling(False)
        log.info("perftracker: window %s: training resumed; profiler stopped and its data dropped (%.2f s)",
                 cur.session, time.monotonic() - t0)

    def _idle(self, cur: _Active) -> None:
        """Back to idle if ``cur`` is still this window's (no delivery: it was reported already)."""
        with self._lock:
            if self._cur is cur:
                self._cur, self._state = None, _IDLE

    def _deliver(self, cur: _Active, res: WindowResult) -> None:
        with self._lock:
            self._cur = None
            self._state = _IDLE
        self._profiling(False)
        self._notify(cur, res)

    def _notify(self, cur: _Active, res: WindowResult) -> None:
        if res.rows > 0 and res.iterations > 0:  # the next windows' event bound learns from this one
            self._events_per_iter = res.rows / res.iterations
        try:
            cur.on_done(res)
        except Exception:
            log.exception("perftracker: on_done callback for window %s raised", cur.session)

    # ---------------------------------------------------------------- helpers
    def _profiling(self, active: bool, window_s: float | None = None) -> None:
        """Tell the detector that its iteration times are (or stop being) perturbed by this window."""
        rt = self._runtime
        if rt is not None:
            try:
                rt.detector.set_profiling(active, window_s)
            except Exception:  # noqa: BLE001 - never into the training loop
                log.debug("perftracker: detector.set_profiling failed", exc_info=True)

    def _hook(self) -> None:
        if self._hooked:
            return
        rt = self._runtime
        if rt is None:
            try:
                from perftracker.runtime.runtime import get_runtime

                rt = get_runtime()
            except ImportError:
                rt = None
        if rt is not None:
            rt.add_boundary_listener(self.on_boundary)
            self._runtime = rt
            self._hooked = True
