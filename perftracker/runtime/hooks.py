"""The torch hooks (docs/design.md section 3): DataLoader iterator ``__next__`` and global optimizer steps.

- ``_BaseDataLoaderIter.__next__`` is wrapped once; the wrapper carries the original function in
  ``__perftracker_original__`` so a second install is a no-op and ``uninstall`` puts the very same
  function object back (or deletes the attribute if the class had none of its own).
- ``Optimizer.step`` uses torch's global step pre/post hooks, which cover every optimizer subclass.

The hooks write the ``HookTarget``'s (the Runtime's) event log themselves: a clock read and one
list append, ``(t_ns << 2) | code``, per hook event, and a call to ``HookTarget.flush`` once an
event comes at or after ``HookTarget.due_ns``. No other Python frame runs per hook call: each hook
is the first Python code after a stretch of torch work, and every frame and attribute it touches
is a cache miss (docs/overhead.md). The target is looked up on every call through the
module-level ``_target``, so disabling is a single assignment and costs no dict mutation (torch
iterates its hook dicts while calling them: removing a hook from inside a hook would raise into
the training loop). Every exception is caught here and handed to ``HookTarget.hook_failed``;
nothing ever raises into user code.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger(__name__)

_ORIGINAL_ATTR = "__perftracker_original__"

# the event log's codes, (t_ns << 2) | code; an even code >> 1 is the detector's kind
# (perftracker/runtime/detector.py: DATALOADER 0, STEP 1); odd codes are for the phase times only
DATA_NEXT = 0  # a DataLoader iterator's __next__ entered
DATA_DONE = 1  # ... and returned
STEP_POST = 2  # an optimizer step returned
STEP_PRE = 3  # an optimizer step begins


class HookTarget(Protocol):
    due_ns: int  # an event at or after this time calls flush

    def now_ns(self) -> int: ...

    def log_event(self, event: int) -> None: ...

    def flush(self, now_ns: int) -> None: ...

    def hook_failed(self, where: str, exc: BaseException) -> None: ...


_target: HookTarget | None = None
# the target's clock and its event log's append, bound at install (one lookup less per call)
_now_ns: Callable[[], int] = time.monotonic_ns
_log: Callable[[int], None] = lambda event: None  # noqa: E731
_handles: list[Any] = []
_had_own_next = False


def _dataloader_iter_class() -> type:
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    return _BaseDataLoaderIter


def _wrap_next(original: Any) -> Any:
    @functools.wraps(original)
    def __next__(self: Any) -> Any:
        target = _target
        if target is not None:
            try:
                t_ns = _now_ns()
                _log(t_ns << 2)  # DATA_NEXT
                if t_ns >= target.due_ns:
                    target.flush(t_ns)
            except Exception as exc:  # never raise into the training loop
                _fail(target, "dataloader.next", exc)
        item = original(self)
        target = _target
        if target is not None:
            try:
                _log((_now_ns() << 2) | 1)  # DATA_DONE: the data wait ends (perftracker/runtime/phase_times.py)
            except Exception as exc:
                _fail(target, "dataloader.done", exc)
        return item

    setattr(__next__, _ORIGINAL_ATTR, original)
    return __next__


def _step_pre(optimizer: Any, args: Any, kwargs: Any) -> None:
    target = _target
    if target is not None:
        try:
            _log((_now_ns() << 2) | 3)  # STEP_PRE
        except Exception as exc:
            _fail(target, "optimizer.step.pre", exc)


def _step_post(optimizer: Any, args: Any, kwargs: Any) -> None:
    target = _target
    if target is not None:
        try:
            t_ns = _now_ns()
            _log((t_ns << 2) | 2)  # STEP_POST
            if t_ns >= target.due_ns:
                target.flush(t_ns)
        except Exception as exc:
            _fail(target, "optimizer.step", exc)


def _fail(target: HookTarget, where: str, exc: BaseException) -> None:
    global _target
    _target = None  # hooks become no-ops at once; uninstall() removes them when it is safe
    try:
        target.hook_failed(where, exc)
    except Exception:  # the failure handler itself failed: stay silent but disabled
        log.debug("perftracker hook failure handler raised", exc_info=True)


def is_installed() -> bool:
    return bool(_handles)


def install(target: HookTarget) -> None:
    """Install the hooks once (idempotent) and route their events to ``target``."""
    global _target, _had_own_next, _now_ns, _log
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    cls = _dataloader_iter_class()
    current = cls.__dict__.get("__next__")
    if not _handles:
        if current is None or not hasattr(current, _ORIGINAL_ATTR):
            _had_own_next = current is not None
            cls.__next__ = _wrap_next(cls.__next__)  # type: ignore[attr-defined]
        _handles.append(register_optimizer_step_pre_hook(_step_pre))
        _handles.append(register_optimizer_step_post_hook(_step_post))
    _target = None  # no event between the two bindings below goes to the wrong log
    _now_ns, _log = target.now_ns, target.log_event
    _target = target


def detach() -> None:
    """Stop routing events (hooks stay installed as no-ops). Safe to call from inside a hook."""
    global _target
    _target = None


def uninstall() -> None:
    """Remove every hook and restore torch exactly as it was. Not from inside an optimizer hook."""
    global _target
    _target = None
    cls = _dataloader_iter_class()
    current = cls.__dict__.get("__next__")
    original = getattr(current, _ORIGINAL_ATTR, None)
    if original is not None:
        if _had_own_next:
            cls.__next__ = original  # type: ignore[attr-defined]
        else:
            delattr(cls, "__next__")
    while _handles:
        _handles.pop().remove()
