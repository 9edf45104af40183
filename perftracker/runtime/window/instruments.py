"""What records a profile window in the training process, started and undone in one place: torch's
profiler (Kineto), the GC recorder, the collectives' process-group record, the Python stack
sampling (a thread, or the sampler process reading from outside), the switch interval and the NVTX
ranges. ``ProfileWindow`` (perftracker/runtime/window/profile.py) decides when; this module does it.
Training thread only, except ``stop_stack_sampling`` (the overrun watchdog's).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any

from perftracker.errors import PerftrackerError
from perftracker.runtime import dist_record
from perftracker.runtime import stack_sampler as stacks_mod
from perftracker.runtime.profiler import KinetoCapture
from perftracker.runtime.window.state import WindowOptions, _Active
from perftracker.runtime.window.writer import WindowWriter

log = logging.getLogger("perftracker.runtime.window.profile")


_NVTX_MISSING: list[str] = []  # why nvtx could not be imported, once known


def _nvtx() -> Any:
    """The nvtx module, or None where it cannot be imported: the window then runs without its
    NVTX ranges (they only mark the window for nsys), with one warning per process."""
    if _NVTX_MISSING:
        return None
    try:
        import nvtx
    except Exception as exc:  # noqa: BLE001 - ImportError, or a broken install: never lose the window for it
        _NVTX_MISSING.append(f"{type(exc).__name__}: {exc}")
        log.warning("perftracker: no NVTX ranges in the profile windows (%s); the windows run without them. "
                    "pip install nvtx to get them", _NVTX_MISSING[0])
        return None
    return nvtx


class WindowInstruments:
    """Starts and releases one window's instruments (see the module docstring)."""

    def __init__(self, options: WindowOptions, writer: WindowWriter) -> None:
        self.options = options
        self.writer = writer
        self._remote_warned = False

    def start(self, cur: _Active) -> None:
        """Start the profiler and the stack sampling; a PerftrackerError (another profiler is
        active, ...) leaves nothing started."""
        opts = self.options
        cur.capture = KinetoCapture(with_stack=opts.stacks == "tracer", record_gc=opts.record_gc)
        try:
            cur.capture.start()
        except PerftrackerError:
            cur.capture = None
            raise
        if opts.record_gc and not cur.capture.gc_in_profile:  # torch records it only with its tracer, where it can
            cur.gc.install()
        dist_record.window_started(cur.session)  # each collective's process group (never raises)
        if opts.stacks == "remote" and cur.sampler is not None:
            cur.pystacks_path = self._remote_stacks(cur)
        if opts.stacks == "sample" or (opts.stacks == "remote" and cur.pystacks_path is None):
            cur.stack_sampler = stacks_mod.StackSampler(threading.get_ident(), opts.stack_period_us, opts.helper_cpus,
                                                        reader=self._own_stack_reader())
            cur.stack_sampler.start()
        if opts.switch_interval_s > 0 and cur.stack_sampler is not None:  # only the sampler thread needs it
            cur.old_switch_s = sys.getswitchinterval()
            sys.setswitchinterval(min(cur.old_switch_s, opts.switch_interval_s))

    def open_nvtx(self, cur: _Active) -> None:
        nvtx = _nvtx() if self.options.nvtx else None
        if nvtx is not None:
            cur.nvtx_window = nvtx.start_range(f"perftracker window {cur.session}", domain="perftracker")
            nvtx.push_range("perftracker iteration", domain="perftracker")
            cur.nvtx_iter_open = True

    def stop_stack_sampling(self, cur: _Active) -> None:
        """What another thread can stop: the stack sampler thread and the switch interval."""
        if cur.stack_sampler is not None:
            cur.stack_sampler.stop()
        if cur.old_switch_s:
            sys.setswitchinterval(cur.old_switch_s)
            cur.old_switch_s = 0.0

    def _own_stack_reader(self) -> Any:
        """CPython 3.11 (training thread): a reader of this thread's stack through this process's own
        memory, so that the sampler thread holds no frame object of it; None elsewhere (frame
        objects are safe to walk there) and where calibration fails here (logged once)."""
        if sys.version_info[:2] != (3, 11) or not self.options.stack_reader:
            return None
        from perftracker import remote_stacks

        try:
            return remote_stacks.RemoteStackReader(os.getpid(), remote_stacks.calibrate())
        except PerftrackerError as exc:
            if not self._remote_warned:
                log.warning("perftracker: %s; the stack sampler walks frame objects instead", exc)
                self._remote_warned = True
            return None

    def _remote_stacks(self, cur: _Active) -> Path | None:
        """stacks="remote" (training thread): have the sampler process read this thread's Python
        stack from outside; None (logged once) where that cannot work here."""
        from perftracker import remote_stacks

        try:
            layout = remote_stacks.calibrate()
        except PerftrackerError as exc:
            if not self._remote_warned:
                log.warning("perftracker: %s; sampling Python stacks in a thread instead", exc)
                self._remote_warned = True
            return None
        path = self.writer.path(cur.session, "pystacks")
        path.unlink(missing_ok=True)
        assert cur.sampler is not None
        req = {"path": str(path), "period_us": self.options.stack_period_us, "layout": json.loads(layout.to_json())}
        cur.sampler.send("pystacks " + json.dumps(req, separators=(",", ":")))
        return path

    def nvtx_iteration(self, cur: _Active, iteration: int) -> None:
        nvtx = _nvtx()
        if nvtx is None:
            return
        if cur.nvtx_iter_open:
            nvtx.pop_range(domain="perftracker")
        nvtx.push_range(f"perftracker iteration {iteration}", domain="perftracker")
        cur.nvtx_iter_open = True

    def release(self, cur: _Active) -> Any:
        """Undo everything the window did to this process; return the profiler result if any."""
        result = None
        error = ""
        if cur.watchdog is not None:
            cur.watchdog.cancel()
        if cur.stack_sampler is not None:
            cur.stack_sampler.stop()
        if cur.capture is not None and cur.capture.started:
            try:
                result = cur.capture.stop()
            except PerftrackerError as exc:
                error = str(exc)
        cur.gc.remove()
        dist_record.window_ended(cur.session)
        if cur.old_switch_s:
            sys.setswitchinterval(cur.old_switch_s)
            cur.old_switch_s = 0.0
        if self.options.nvtx and (cur.nvtx_iter_open or cur.nvtx_window is not None):
            nvtx = _nvtx()
            if nvtx is not None and cur.nvtx_iter_open:
                nvtx.pop_range(domain="perftracker")
                cur.nvtx_iter_open = False
            if cur.nvtx_window is not None:
                nvtx.end_range(cur.nvtx_window)
                cur.nvtx_window = None
        if error:
            raise PerftrackerError(error)
        return result
