"""The profile window's writer: after the window, turn the profiler result and stack samples into
a ``RawWindow`` file off the training thread (a throttled thread, or optionally a forked child),
collect the sampler process's file and deliver the ``WindowResult``. ``ProfileWindow``
(perftracker/runtime/window/profile.py) owns one ``WindowWriter`` and the state machine; the writer owns its
thread, the conversion child and the two events the exit path (perftracker/runtime/window/exit.py)
sets: ``cancelled`` and ``hurried``.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perftracker.errors import ProfilerError
from perftracker.model.raw_window import WindowMeta
from perftracker.runtime import stack_sampler as stacks_mod
from perftracker.runtime.profiler import gpu_events_lost, kineto_rows
from perftracker.runtime.protocols import WorkerIdentity
from perftracker.runtime.raw_window_build import build_raw_window
from perftracker.runtime.throttle import Cancelled, Detached, Throttle
from perftracker.runtime.window.state import WindowOptions, WindowResult, _Active

log = logging.getLogger("perftracker.runtime.window.profile")


class WindowWriter:
    """The writer part of a ``ProfileWindow``: the files' paths, the writer thread, the conversion
    child. ``deliver(cur, result)`` (the window's) ends the window once the file is written."""

    def __init__(self, identity: WorkerIdentity, out_dir: Path, options: WindowOptions,
                 deliver: Callable[[_Active, WindowResult], None], handoff: Callable[..., WindowResult]) -> None:
        self.identity = identity
        self.out_dir = out_dir
        self.options = options
        self._deliver = deliver
        self.handoff = handoff  # at exit: to a child that outlives this process (window_handoff.hand_over)
        self.cancelled = threading.Event()  # set at exit: the writer stops at its next throttle check
        self.hurried = threading.Event()  # set at exit: the writer stops yielding (window_exit.py)
        self.detach = threading.Event()  # set at exit: hand the work to a detached child (window_handoff.py)
        self.thread: threading.Thread | None = None  # the latest writer thread
        self.tid = 0  # the writer thread's native id (the exit path restores its priority)
        self.child_pid = 0  # the conversion child while the writer waits for it

    # ---------------------------------------------------------------- paths
    def path(self, session: str, what: str) -> Path:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        rank = int(self.identity.rank)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in session) or "session"
        return self.out_dir / f"{safe}-rank{rank}.{what}.npz"

    def pid(self) -> int:
        return int(self.identity.pid or os.getpid())

    def training_tid(self) -> int:
        tid = self.identity.training_tid
        return int(tid or threading.main_thread().native_id or threading.get_native_id())

    # ---------------------------------------------------------------- the window's thread
    def start(self, cur: _Active, holder: list[Any], end_ns: int, blocking_ns: int, child: int | None) -> None:
        """Start the writer thread on ``holder`` (``[profiler result or None]``, see ``finish``)."""
        self.thread = threading.Thread(target=self.finish, args=(cur, holder, end_ns, blocking_ns, child),
                                       name="perftracker-window-writer", daemon=True)
        self.thread.start()

    def hurry(self) -> None:
        """Training is over: the writer stops yielding the GIL (Throttle) and, where the OS lets an
        unprivileged process raise a thread's priority back, the CPU (nice 0)."""
        self.hurried.set()
        tid = self.tid
        if tid:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, 0)
            except (OSError, AttributeError):
                pass

    def join(self, wait_s: float, session: str) -> None:
        """Exit: wait (at most ``wait_s``) for the writer thread, also one that already delivered.

        A daemon thread still inside torch's C++ code (which releases the GIL) when the interpreter
        finalizes is ended by pthread_exit on its way back to the GIL, which unwinds through a C++
        destructor and aborts the whole process ("terminate called without an active exception").
        """
        fin = self.thread
        if fin is None or not fin.is_alive() or fin is threading.current_thread():
            return
        fin.join(wait_s)
        if fin.is_alive():
            log.warning("perftracker: window %s: writer still busy after %.1f s; leaving it", session, wait_s)

    def use_fork(self, cur: _Active) -> bool:
        # The child only reads the profiler result's host memory and numpy; it never calls CUDA (as
        # a DataLoader worker forked from a CUDA process). Not where RDMA memory is registered
        # without fork protection (fork_safety.py, checked at arm). Not verified on GPU hardware.
        return self.options.writer == "fork" and hasattr(os, "fork") and not cur.fork_unsafe

    def fork(self, cur: _Active, result: Any, end_ns: int) -> int | None:
        """Build and save the RawWindow in a forked child: no GIL or CPU time taken from training
        beyond the fork itself. Returns the child's pid, or None (then a thread writes)."""
        path = self.path(cur.session, "raw")
        try:
            path.unlink(missing_ok=True)  # the file's presence is the child's success (saved atomically)
            pid = os.fork()
        except OSError as exc:
            log.warning("perftracker: fork failed (%s); writing the window in a thread", exc)
            return None
        if pid == 0:  # child: only this thread exists; never return into training code
            code = 1
            try:
                os.setsid()  # not stopped with the trainer's process group: it may outlive the trainer
                _lower_priority(0, self.options.child_nice, self.options.helper_cpus, idle=True)
                self.build(cur, result, end_ns).save(path)
                code = 0
            except BaseException as exc:  # noqa: BLE001
                try:
                    path.with_name(path.name + ".error").write_text(f"{type(exc).__name__}: {exc}")
                except BaseException:  # noqa: BLE001
                    pass
            finally:
                os._exit(code)
        self.child_pid = pid
        return pid

    # ---------------------------------------------------------------- writer thread
    def finish(self, cur: _Active, holder: list[Any], end_ns: int, blocking_ns: int, child: int | None) -> None:
        """The writer thread. ``holder`` is ``[profiler result or None]``; it is emptied before the
        result is delivered, so that the result's C++ destructor has run by then: the process may
        exit as soon as ``on_done`` returns, and a daemon thread still in torch's C++ code at
        finalization aborts the process."""
        result = holder.pop() if holder else None
        self.tid = threading.get_native_id()
        if not self.hurried.is_set():  # the writer yields the CPU to training as well as the GIL (Throttle)
            _lower_priority(self.tid, self.options.writer_nice, self.options.helper_cpus)
        res = WindowResult(cur.session, None, cur.start_ns, end_ns, error="unfinished", blocking_ns=blocking_ns)
        try:
            samples_path = None
            if cur.sampler is not None:
                cur.sampler.send(f"end {end_ns}")
            raw_path = self.path(cur.session, "raw")
            if self.options.writer_gate is not None:
                self.options.writer_gate(self.hurried)
            try:
                if self.cancelled.is_set():  # exiting, and out of time: do not start anything
                    if child is not None:  # a discarded window leaves no file (the child may have written it)
                        _kill(child)
                        raw_path.unlink(missing_ok=True)
                    raise Cancelled("cancelled before writing")
                if self.detach.is_set():
                    raise Detached("handed to a child process")
                if child is not None and self._wait_child(cur, child, raw_path):
                    rows = _count_rows(raw_path)
                else:
                    if self.cancelled.is_set():  # exiting already: do not start a build (it may take a minute)
                        raise Cancelled("cancelled before writing")
                    raw = self.build(cur, result, end_ns, Throttle(self.options.writer_duty, cancel=self.cancelled,
                                                                   hurry=self.hurried, detach=self.detach))
                    raw.save(raw_path)
                    rows = len(raw)
                    del raw
            except Detached:  # the process is exiting: a detached child writes the file (window_handoff.py)
                t0 = time.monotonic()
                res = self.handoff(self, cur, result, end_ns, blocking_ns, child)
                t1 = time.monotonic()
                del result
                log.info("perftracker: window %s: hand-over %.2f s, profiler result freed in %.2f s", cur.session,
                         t1 - t0, time.monotonic() - t1)
                self._deliver(cur, res)
                return
            if cur.sampler is not None:
                samples_path = cur.sampler.finish()
            res = WindowResult(cur.session, raw_path, cur.start_ns, end_ns, "", samples_path, blocking_ns,
                               len(cur.boundaries_ns) - 1, rows)
            log.info("perftracker: window %s written: %s (%d rows)", cur.session, raw_path, rows)
            if cur.pystacks_path is not None:  # in the raw file now
                cur.pystacks_path.unlink(missing_ok=True)
        except Cancelled:
            log.warning("perftracker: window %s discarded: the process is exiting while it was written",
                        cur.session)
            res = WindowResult(cur.session, None, cur.start_ns, end_ns, "discarded: process exiting",
                               blocking_ns=blocking_ns)
            if cur.sampler is not None:
                cur.sampler.close(timeout_s=0.5)
        except Exception as exc:
            log.exception("perftracker: writing window %s failed", cur.session)
            traceback.clear_frames(exc.__traceback__)  # a kept log record must not keep the result alive
            res = WindowResult(cur.session, None, cur.start_ns, end_ns, f"{type(exc).__name__}: {exc}",
                               blocking_ns=blocking_ns)
            if cur.sampler is not None:
                cur.sampler.close()
        del result  # the profiler result's destructor runs here, before delivery (see the docstring)
        self._deliver(cur, res)

    def _wait_child(self, cur: _Active, pid: int, raw_path: Path) -> bool:
        """Wait for the conversion child. True: it wrote ``raw_path``. False (logged): it failed,
        was killed or took longer than ``child_timeout_s`` (then killed); the caller still holds the
        profiler result and converts it itself, so no window is lost. At exit (``hurried``) the child
        is reniced to 0 where the OS allows it; on ``cancelled`` it is killed and Cancelled raised."""
        opts = self.options
        t0 = time.monotonic()
        nice = opts.child_nice
        err = raw_path.with_name(raw_path.name + ".error")
        try:
            while True:
                try:
                    got, status = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:  # reaped by someone else (user code calling os.wait())
                    if raw_path.exists():  # the child saves atomically: the file is whole
                        return True
                    log.warning("perftracker: window %s: the conversion child was reaped elsewhere "
                                "without its file; converting in this process", cur.session)
                    return False
                if got:
                    code = os.waitstatus_to_exitcode(status)
                    if code == 0 and raw_path.exists():
                        return True
                    why = err.read_text()[:300] if err.exists() else f"exit code {code}"
                    log.warning("perftracker: window %s: the conversion child failed (%s); converting "
                                "in this process", cur.session, why)
                    return False
                if self.cancelled.is_set():
                    _kill(pid)
                    raw_path.unlink(missing_ok=True)  # written meanwhile: a discarded window leaves no file
                    raise Cancelled("cancelled while the child converted")
                if self.detach.is_set():  # exiting: leave the child to finish (window_handoff.py)
                    raise Detached("the conversion child outlives this process")
                waited_s = time.monotonic() - t0
                want = 0 if self.hurried.is_set() else (opts.writer_nice if waited_s > opts.child_soft_s else nice)
                if want < nice:
                    try:  # back from SCHED_IDLE, at a higher priority
                        os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
                        os.setpriority(os.PRIO_PROCESS, pid, want)
                    except OSError:  # an unprivileged process cannot lower a nice value
                        pass
                    nice = want
                if waited_s > opts.child_timeout_s:
                    _kill(pid)
                    log.warning("perftracker: window %s: the conversion child took over %.0f s; stopped "
                                "it, converting in this process", cur.session, opts.child_timeout_s)
                    return False
                time.sleep(0.05)
        finally:
            self.child_pid = 0
            err.unlink(missing_ok=True)

    def build(self, cur: _Active, result: Any, end_ns: int, throttle: Throttle | None = None) -> Any:
        tid = self.training_tid()
        krows = (kineto_rows(result, cur.capture.offset_ns, tid, cur.start_ns, end_ns, throttle)
                 if result is not None and cur.capture is not None else None)  # a result: a capture ran
        lost = gpu_events_lost(krows) if krows is not None else ""
        if lost:  # said, never summarized as a CPU window (issue 43)
            raise ProfilerError(lost)
        pyexec = None
        if cur.pystacks_path is not None:
            got = _load_remote_stacks(cur.pystacks_path, cur.session)
            if got is not None:
                pyexec = stacks_mod.python_executions(got[0], got[1], cur.start_ns, end_ns,
                                                      self.options.stack_period_us * 1000,
                                                      throttle.tick if throttle is not None else None)
        elif cur.stack_sampler is not None:
            ss = cur.stack_sampler
            pyexec = stacks_mod.python_executions(ss.t_ns, ss.samples, cur.start_ns, end_ns, ss.period_ns,
                                                  throttle.tick if throttle is not None else None)
        b = cur.boundaries_ns
        ident = self.identity
        meta = WindowMeta(
            job=str(ident.job), session=cur.session, rank=int(ident.rank), world_size=int(ident.world_size),
            host=str(ident.host), pid=self.pid(), training_tid=tid,
            window_start_ns=cur.start_ns, window_end_ns=end_ns, local_rank=int(ident.local_rank),
            iteration_ms=tuple((b[i + 1] - b[i]) / 1e6 for i in range(len(b) - 1)),
            local_world_size=_local_world_size(),  # each collective's link (issue 34)
        )
        return build_raw_window(meta, krows, pyexec, cur.gc.pauses, throttle)


REMOTE_STACKS_WAIT_S = 30.0  # the longest wait for the sampler process's stack file


def _load_remote_stacks(path: Path, session: str) -> tuple[list[int], list[Any]] | None:
    """The sampler process's stack samples (it writes them once the window's end has passed);
    None, logged, when it wrote none (it died): the window then has no Python rows."""
    from perftracker.remote_stacks import load_samples

    deadline = time.monotonic() + REMOTE_STACKS_WAIT_S
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        return load_samples(path)
    except (OSError, ValueError, KeyError) as exc:
        log.warning("perftracker: window %s: no Python stacks from the sampler process (%s)", session, exc)
        return None


def _lower_priority(tid: int, nice: int, cpus: tuple[int, ...], idle: bool = False) -> None:
    """Nice ``tid`` (0: this process) to ``nice``, with ``idle`` also SCHED_IDLE (runs only when
    nothing else wants the CPU, preempted at once when training wakes), and move it to ``cpus``
    (if any); best effort."""
    try:
        os.setpriority(os.PRIO_PROCESS, tid, nice)
    except (OSError, AttributeError):
        pass
    if idle:
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        except (OSError, AttributeError):
            pass
    if cpus:
        try:
            os.sched_setaffinity(tid, cpus)
        except (OSError, AttributeError, ValueError):
            pass


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (OSError, ChildProcessError):
        pass


def _count_rows(path: Path) -> int:
    import numpy as np

    with np.load(path, allow_pickle=False) as z:
        return int(z["col_kind"].shape[0])


def _local_world_size() -> int:
    """Ranks per host as torchrun sets it (LOCAL_WORLD_SIZE); 0 when unset or not a number."""
    try:
        return max(int(os.environ.get("LOCAL_WORLD_SIZE", "0")), 0)
    except ValueError:
        return 0
