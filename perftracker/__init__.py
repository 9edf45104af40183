"""perftracker: `import perftracker` in a training script starts always-on slowdown/hang detection.

On import, detection is armed from the environment (``Config.from_env``) unless
``PERFTRACKER_DISABLE=1``, or unless this process is one of perftracker's own (its role, read by
``perftracker.role.current_role``, is not ``training``). Arming installs the torch hooks (now if
torch is loaded, else as soon as it is) and nothing else: the agent channel's thread, the exit
capture and everything else with a thread or a side effect start at the first hooked event, so a
process that only imports perftracker (to render a report, say) stays idle
(perftracker/runtime/activation.py). A bad ``PERFTRACKER_*`` value or any other activation error is
logged and leaves training untouched.

Public API: ``activate(config=None)``, ``deactivate()``, ``trigger(reason)``, ``status()``.
The import stays light: numpy, nvtx and the standard library only; torch is never imported here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from perftracker.config import Config
from perftracker.errors import ConfigError, PerftrackerError
from perftracker.role import TRAINING, current_role

if TYPE_CHECKING:  # the runtime loads on activation, not on import
    from perftracker.runtime.runtime import Runtime

__all__ = ["Config", "PerftrackerError", "activate", "deactivate", "status", "trigger"]
__version__ = "0.1.0"

log = logging.getLogger(__name__)


def activate(config: Config | None = None) -> Runtime:
    """Start detection in this process (idempotent with no config); returns the Runtime."""
    from perftracker.runtime import runtime

    return runtime.activate(config)


def deactivate() -> None:
    """Stop detection and leave torch exactly as it was before activation."""
    from perftracker.runtime import runtime

    runtime.deactivate()


def trigger(reason: str = "manual", detail: Mapping[str, object] | None = None) -> bool:
    """Ask for a profile window now. Returns False (and logs) if perftracker is not active."""
    from perftracker.runtime import runtime

    rt = runtime.get_runtime()
    if rt is None:
        log.warning("perftracker.trigger(%r) ignored: perftracker is not active", reason)
        return False
    return rt.trigger(reason, detail)


def status() -> dict[str, object]:
    """Phase, learned sequence, iteration count, recent mean/min iteration time, triggers."""
    from perftracker.runtime import runtime

    rt = runtime.get_runtime() or runtime.last_runtime()
    if rt is None:
        return {"active": False, "phase": "inactive", "sequence": [], "iteration": 0,
                "recent_mean_ms": None, "recent_min_ms": None, "triggers": []}
    return rt.status()


def _activate_from_env() -> None:
    if os.environ.get("PERFTRACKER_DISABLE", "").strip().lower() in ("1", "true", "yes", "on"):
        return
    if current_role() != TRAINING:  # perftracker's own processes never train
        return
    try:
        config = Config.from_env()
        from perftracker.runtime import activation

        activation.arm(config)  # the hooks; the agent channel at the first hooked event
    except ConfigError as exc:  # a user's setting, not a bug: one line, no traceback
        log.error("perftracker: %s; detection is off in this process", exc)
    except Exception:  # never hurt training: a torch mismatch or a bug disables us
        log.exception("perftracker: activation failed; detection is off in this process")


_activate_from_env()
