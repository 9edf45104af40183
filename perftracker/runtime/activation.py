"""What ``import perftracker`` does in a training process: the hooks at import, everything else at
the first hooked event.

- ``arm(config)`` creates the process's Runtime and installs the torch hooks (perftracker/runtime/hooks.py):
  at once when torch is loaded, else right after torch finishes loading (a one-shot finder on
  ``sys.meta_path``, removed when it fires). Nothing else: no thread, no excepthook, no atexit, no
  socket, no file.
- The hooks first call a ``FirstStep`` target. At the first hooked event (a DataLoader batch or an
  optimizer step) it starts the services of a training process (the agent channel, which chains
  the exit capture in front of the excepthooks and registers its atexit) and hands the hooks to the
  Runtime itself, so that every later event costs what it cost before.
- ``disarm()``: a process that loads perftracker's node agent or localizer is one of perftracker's
  own, or a tool that reads reports (a notebook rendering one); it never trains. Those packages call
  it on import: it undoes an arming that has seen no hooked event (the hooks removed, torch exactly
  as it was), and leaves alone a runtime that trains or that the user activated himself.

No test of the calling program (pytest or another) is needed: a process that never trains never
reaches the first hooked event.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from perftracker.config import Config
from perftracker.runtime import hooks
from perftracker.runtime import runtime as runtime_mod
from perftracker.runtime.runtime import Runtime

log = logging.getLogger(__name__)


class FirstStep:
    """The hooks' target until the first hooked event; then the Runtime itself. Everything but the
    first event's call (``flush``, or a callback of a hook that calls one) is the Runtime's own:
    the hooks write its event log and read its clock from the first event on."""

    due_ns = 0  # the first event that checks it calls flush

    def __init__(self, rt: Runtime, start: Callable[[Runtime], None]) -> None:
        self.rt = rt
        self._start = start
        self._lock = threading.Lock()
        self.started = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.rt, name)  # now_ns, log_event, hook_failed, ...: the Runtime's

    def _begin(self) -> None:
        with self._lock:
            if self.started:
                return
            self.started = True
        if runtime_mod.get_runtime() is not self.rt:
            return  # replaced or stopped meanwhile: whoever did so owns the hooks now
        hooks.install(self.rt)  # installed already: only the target changes (no hook dict is touched)
        try:
            self._start(self.rt)
        except Exception:  # noqa: BLE001 - never into the training loop
            log.exception("perftracker: could not start the agent channel; detection goes on without it")

    def flush(self, now_ns: int) -> None:
        self._begin()
        self.rt.flush(now_ns)

    def on_dataloader_next(self) -> None:
        self._begin()
        self.rt.on_dataloader_next()

    def on_step_post(self) -> None:
        self._begin()
        self.rt.on_step_post()


class _TorchWatch(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when ``torch`` is imported, runs ``then`` right after torch's own
    ``__init__`` has run (the loader's ``exec_module``), once, and leaves ``sys.meta_path``."""

    def __init__(self, then: Callable[[], None]) -> None:
        self.then = then

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch":
            return None
        self.remove()
        spec = None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if find is not None:
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        loader = getattr(spec, "loader", None)
        original = getattr(loader, "exec_module", None)
        if spec is None or loader is None or original is None:
            return spec  # not found (the import fails as it would have) or an unusual loader: no hooks

        def exec_module(module: ModuleType) -> None:
            original(module)  # torch's own import; whatever it raises goes to the importer as before
            try:
                del loader.exec_module  # the instance attribute set below: the class's method again
            except AttributeError:
                pass
            self.then()

        loader.exec_module = exec_module
        return spec

    def remove(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass


_lock = threading.Lock()
_armed: FirstStep | None = None
_watch: _TorchWatch | None = None


def start_services(rt: Runtime) -> None:
    """The first hooked event: the runtime's trigger policy (hold, budget), and the link to the
    node agent (a thread; the exit capture and its atexit come with it, perftracker/runtime/channel.py)."""
    from perftracker.runtime.channel import start_channel
    from perftracker.runtime.trigger.policy import TriggerPolicy

    if rt.trigger_policy is None:
        rt.trigger_policy = TriggerPolicy(rt, rt.config)  # hold and budget: the runtime's, not the channel's
    start_channel(rt, rt.config)


def arm(config: Config, start: Callable[[Runtime], None] = start_services) -> Runtime:
    """``import perftracker`` in a training process: a Runtime whose hooks are installed now (torch
    loaded) or as soon as torch is; ``start`` runs at the first hooked event."""
    global _armed, _watch
    rt = runtime_mod.activate(config, install=False)
    target = FirstStep(rt, start)
    with _lock:
        _armed = target
        if _watch is not None:
            _watch.remove()
            _watch = None
        if "torch" in sys.modules:
            hooks.install(target)
        else:
            _watch = _TorchWatch(lambda: _install_when_loaded(target))
            sys.meta_path.insert(0, _watch)
    return rt


def _install_when_loaded(target: FirstStep) -> None:
    """torch has just loaded: install the hooks for ``target`` if it is still the armed runtime's."""
    global _watch
    try:
        with _lock:
            _watch = None
            if _armed is not target or runtime_mod.get_runtime() is not target.rt:
                return
            hooks.install(target)
    except Exception:  # noqa: BLE001 - never into the user's `import torch`
        log.exception("perftracker: could not install the torch hooks; detection is off in this process")


def armed() -> FirstStep | None:
    """The import-time arming of this process, if any (for status and tests)."""
    return _armed


def disarm() -> None:
    """Undo the import-time arming if no hooked event came (see the module's docstring); never raises."""
    global _armed, _watch
    try:
        with _lock:
            if _watch is not None:
                _watch.remove()
                _watch = None
            target, _armed = _armed, None
            if target is None or target.started:
                _armed = target
                return
            if runtime_mod.get_runtime() is target.rt:
                runtime_mod.deactivate()
    except Exception:  # noqa: BLE001
        log.debug("perftracker: disarm failed", exc_info=True)
