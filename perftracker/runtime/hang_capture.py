"""Hang snapshots: what a blocked worker's training thread is doing, seen from the controller thread.

``take_snapshot(runtime)`` runs in a thread other than the training thread. It only reads: the
training thread's frame from ``sys._current_frames()``, the source text of the call in progress
(``linecache``), the thread's kernel state from procfs and the runtime's counters. It never
raises and never touches the training thread's state.

The collective recognition below is grounded in stacks seen on torch 2.13 with gloo (see
docs/hangs.md):

- a rank that waits in DDP's gradient allreduce shows no ``torch/distributed`` frame at all: its
  innermost frame is ``torch/autograd/graph.py:_engine_run_backward`` (the C++ engine waits on
  the reducer's future) and the thread sleeps in ``futex_do_wait``;
- an explicit collective shows ``torch/distributed/c10d_logger.py:wrapper`` ->
  ``torch/distributed/distributed_c10d.py:all_reduce`` (``barrier``, ``all_gather``, ...) at the
  ``work.wait()`` line, also in ``futex_do_wait``;
- a user ``work.wait()`` on an async collective shows only the user line.

File names are normalized so that stacks compare across hosts: library files become
``<lib>/torch/autograd/graph.py``, the standard library ``<stdlib>/threading.py``, perftracker's
own files ``<perftracker>/hooks.py``, and user files are relative to the working directory when
they lie under it.
"""

from __future__ import annotations

import dataclasses
import linecache
import logging
import os
import re
import sys
import sysconfig
import threading
import time
from itertools import islice
from types import CodeType, FrameType

from perftracker.clock import Clock
from perftracker.model import Frame, HangSnapshot
from perftracker.model.frames import (  # noqa: F401 - re-exported for the capture's callers
    COLLECTIVE_PREFIX,
    LIB_PREFIX,
    SELF_PREFIX,
    STDLIB_PREFIX,
    innermost_user_frame,
    is_collective,
    is_user_frame,
    recognise_collective,
)
from perftracker.runtime.protocols import SnapshotRuntime

log = logging.getLogger(__name__)

MAX_FRAMES = 128  # deeper stacks keep their innermost frames

_CALLEE = re.compile(r"[\w.]+(?:(?:\(.*\)|\[.*\])[\w.]*)*")  # a.b, m(x).sum, d["k"].f


def take_snapshot(runtime: SnapshotRuntime, session: str = "") -> HangSnapshot:
    """Snapshot the runtime's training thread. Call it from any other thread; it never raises.

    ``runtime`` is a ``perftracker.runtime.runtime.Runtime`` (what is read: ``SnapshotRuntime``, its
    ``identity``, ``iteration``, ``last_event()`` and, if it has one, ``clock``; one that fails to
    answer gives a partial snapshot). Once an unhandled exception has ended the main
    thread (``sys.last_value``; the process is exiting, its stack shows only exit handlers or
    nothing), the snapshot comes from that exception's traceback.
    """
    exc = getattr(sys, "last_value", None)
    if isinstance(exc, Exception) and exc.__traceback__ is not None:
        snap = exit_snapshot(runtime, exc, session)
        if snap is not None:
            return snap
    return _snapshot(runtime, session, read_stack=True)


def _snapshot(runtime: SnapshotRuntime, session: str, read_stack: bool) -> HangSnapshot:
    job, rank, world_size, host, pid, native_tid = _identity_of(runtime)
    taken_ns = time.time_ns()
    stack: tuple[Frame, ...] = ()
    current_op = ""
    kernel_state = ""
    try:
        frame, native_tid = _training_frame(native_tid) if read_stack else (None, 0)
        if frame is not None:
            stack, call = _walk(frame)
            kernel_state = read_kernel_state(os.getpid(), native_tid)
            current_op = recognise_collective(stack, call, kernel_state, _distributed_active()) or call
    except Exception:  # never disturb training: a partial snapshot beats none
        log.warning("hang snapshot: could not read the training thread's stack", exc_info=True)
    last_kind, idle_s = "", 0.0
    try:
        last = runtime.last_event()
        if last is not None:
            clock: Clock | None = getattr(runtime, "clock", None)  # optional (SnapshotRuntime)
            now_ns = clock.now_ns() if clock is not None else time.monotonic_ns()
            last_kind, idle_s = str(last[0]), max(0.0, (now_ns - int(last[1])) / 1e9)
    except Exception:
        log.warning("hang snapshot: runtime.last_event() failed", exc_info=True)
    try:
        last_iteration = int(runtime.iteration)
    except Exception:
        last_iteration = -1
    return HangSnapshot(
        job=job,
        rank=rank,
        world_size=world_size,
        host=host,
        pid=pid,
        taken_ns=taken_ns,
        last_iteration=last_iteration,
        idle_s=round(idle_s, 3),
        stack=stack,
        current_op=current_op,
        last_event=last_kind,
        session=session,
        kernel_state=kernel_state,
        groups=_process_groups(),
    )


def _process_groups() -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    """The process groups this rank belongs to (``perftracker.runtime.dist_record``, the live record
    of issue 28), () when torch.distributed is not initialized or they cannot be read."""
    try:
        from perftracker.runtime.dist_record import process_groups

        return tuple((str(n), str(d), tuple(int(r) for r in rs)) for n, d, rs in process_groups())
    except Exception:  # never disturb training: a snapshot without its groups beats none
        log.debug("hang snapshot: could not read the process groups", exc_info=True)
        return ()


def _identity_of(runtime: SnapshotRuntime) -> tuple[str, int, int, str, int, int]:
    """(job, rank, world_size, host, pid, training tid) of the runtime's identity; defaults (this
    process's pid, tid 0: the main thread) when the identity cannot be read: a snapshot is taken anyway."""
    try:
        ident = runtime.identity
        return (str(ident.job or ""), int(ident.rank or 0), int(ident.world_size or 1), str(ident.host or ""),
                int(ident.pid or os.getpid()), int(ident.training_tid or 0))
    except Exception:  # never disturb training: a partial snapshot beats none
        log.debug("hang snapshot: could not read the runtime's identity", exc_info=True)
        return "", 0, 1, "", os.getpid(), 0


def exit_snapshot(runtime: SnapshotRuntime, exc: BaseException, session: str = "",
                  distributed: bool | None = None) -> HangSnapshot | None:
    """A snapshot of where an exception ended the training thread (call it at exit); never raises.

    When a peer dies, gloo fails the pending collective on the survivors ("Connection reset by
    peer") and their training threads end with that exception: its traceback shows that they
    were waiting in the collective, which tells them apart from the rank that died first.
    """
    try:
        frames: list[FrameType] = []
        tb = exc.__traceback__
        while tb is not None and len(frames) < MAX_FRAMES:
            frames.append(tb.tb_frame)
            tb = tb.tb_next
        if not frames:
            return None
        stack = tuple(Frame(normalize_path(f.f_code.co_filename), int(line or 0), f.f_code.co_name)
                      for f, line in zip(frames, _tb_lines(exc), strict=False))
        user = [i for i, fr in enumerate(stack) if is_user_frame(fr)]
        call = ""
        if user:
            call = _call_at(frames[user[-1]].f_code, _tb_lasti(exc, user[-1]))
        error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        snap = _snapshot(runtime, session, read_stack=False)  # identity, counters, idle time
        active = _distributed_active() if distributed is None else distributed
        # no process group, no collective in progress: a failing c10d call (get_world_size before
        # init_process_group) is the call that failed, not a wait
        current_op = (recognise_collective(stack, call, "", active) or call) if active else call
        return dataclasses.replace(snap, stack=stack, current_op=current_op, kernel_state="", error=error[:300])
    except Exception:
        log.warning("hang snapshot at exit failed", exc_info=True)
        return None


def _tb_lines(exc: BaseException) -> list[int]:
    out = []
    tb = exc.__traceback__
    while tb is not None:
        out.append(tb.tb_lineno)
        tb = tb.tb_next
    return out


def _tb_lasti(exc: BaseException, index: int) -> int:
    tb = exc.__traceback__
    for _ in range(index):
        tb = tb.tb_next if tb is not None else None
    return tb.tb_lasti if tb is not None else -1


# --------------------------------------------------------------------------------------------
# reading the training thread
# --------------------------------------------------------------------------------------------


def _training_frame(native_tid: int) -> tuple[FrameType | None, int]:
    """The training thread's current frame and its native id (the main thread by default)."""
    target = threading.main_thread()
    if native_tid:
        for t in threading.enumerate():
            if t.native_id == native_tid:
                target = t
                break
    frames = sys._current_frames()
    frame = frames.get(target.ident) if target.ident is not None else None
    return frame, int(target.native_id or native_tid or 0)


def _walk(frame: FrameType) -> tuple[tuple[Frame, ...], str]:
    """(stack outermost first, the call in progress at the innermost user frame)."""
    inner_first: list[FrameType] = []
    f: FrameType | None = frame
    while f is not None and len(inner_first) < MAX_FRAMES:
        inner_first.append(f)
        f = f.f_back
    stack = tuple(
        Frame(normalize_path(fr.f_code.co_filename), int(fr.f_lineno or 0), fr.f_code.co_name)
        for fr in reversed(inner_first)
    )
    call = ""
    for fr, fd in zip(inner_first, reversed(stack), strict=True):
        if is_user_frame(fd):
            call = call_in_progress(fr)
            break
    return stack, call


def call_in_progress(frame: FrameType) -> str:
    """The callee of the expression the frame is evaluating, e.g. ``time.sleep``; "" if unknown.

    Uses the code object's column table (``co_positions``) at ``f_lasti`` and the source line.
    """
    return _call_at(frame.f_code, frame.f_lasti)


def _call_at(code: CodeType, lasti: int) -> str:
    if lasti < 0:
        return ""
    try:
        pos = next(islice(code.co_positions(), lasti // 2, None), None)
        if pos is None:
            return ""
        line, end_line, col, end_col = pos
        if line is None or col is None or end_col is None or line != end_line:
            return ""
        src = linecache.getline(code.co_filename, line).encode()
        text = src[col:end_col].decode(errors="replace").strip()
    except Exception:
        return ""
    return callee_of(text)


def callee_of(expr: str) -> str:
    """``time.sleep(100)`` -> ``time.sleep``; ``m(x).sum()`` -> ``m(x).sum``; non-calls -> ""."""
    expr = expr.strip()
    if not expr.endswith(")"):
        return ""
    depth = 0
    for i in range(len(expr) - 1, -1, -1):
        ch = expr[i]
        if ch == ")":
            depth += 1
        elif ch == "(":
            depth -= 1
            if depth == 0:
                callee = expr[:i].strip()
                if not _CALLEE.fullmatch(callee):
                    return ""  # a statement ("raise X(...)"), not a call expression
                if len(callee) > 60:
                    callee = "..." + callee[-57:]
                return callee
    return ""


def read_kernel_state(pid: int, tid: int) -> str:
    """``"<state> <wchan>"`` of one thread from procfs, e.g. ``"S futex_do_wait"``; "" if unreadable."""
    if not tid:
        return ""
    base = f"/proc/{pid}/task/{tid}"
    try:
        with open(f"{base}/stat", "rb") as fh:
            stat = fh.read().decode(errors="replace")
        state = stat[stat.rindex(")") + 2:].split(" ", 1)[0]
    except (OSError, ValueError):
        return ""
    try:
        with open(f"{base}/wchan", "rb") as fh:
            wchan = fh.read().decode(errors="replace").strip()
    except OSError:
        wchan = ""
    if wchan in ("", "0"):
        return state
    return f"{state} {wchan}"


def _distributed_active() -> bool:
    """Whether a default process group exists, without importing torch.distributed."""
    dist = sys.modules.get("torch.distributed")
    try:
        return bool(dist is not None and dist.is_available() and dist.is_initialized())
    except Exception:
        return False


# --------------------------------------------------------------------------------------------
# file names as the snapshot records them (the host's own paths: capture side only)
# --------------------------------------------------------------------------------------------


def normalize_path(path: str) -> str:
    """Host-independent file names (see the module docstring)."""
    if path.startswith("<"):
        return path
    p = path.replace("\\", "/")
    for marker in ("/site-packages/", "/dist-packages/"):
        i = p.rfind(marker)
        if i >= 0:
            rest = p[i + len(marker):]
            if rest.startswith("perftracker/examples/"):
                return rest  # the demo job shipped in the package: user code
            if rest.startswith("perftracker/"):
                return SELF_PREFIX + rest[len("perftracker/"):]
            return LIB_PREFIX + rest
    if _SELF_DIR and p.startswith(_SELF_DIR) and not p.startswith(_SELF_EXAMPLES_DIR):
        return SELF_PREFIX + p[len(_SELF_DIR):]
    for stdlib in _STDLIB_DIRS:
        if p.startswith(stdlib):
            return STDLIB_PREFIX + p[len(stdlib):]
    try:
        cwd = os.getcwd().replace("\\", "/").rstrip("/") + "/"
    except OSError:
        cwd = ""
    if cwd and p.startswith(cwd):
        return p[len(cwd):]
    return p


def _stdlib_dirs() -> tuple[str, ...]:
    dirs = []
    for key in ("stdlib", "platstdlib"):
        try:
            d = sysconfig.get_paths()[key].replace("\\", "/").rstrip("/") + "/"
        except (KeyError, OSError):
            continue
        if d not in dirs:
            dirs.append(d)
    return tuple(dirs)


_STDLIB_DIRS = _stdlib_dirs()
# the package root (runtime/ is one level down); its examples/ (the demo job) are user code
_SELF_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))).replace("\\", "/") + "/"
_SELF_EXAMPLES_DIR = _SELF_DIR + "examples/"
