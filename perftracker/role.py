"""Which part of perftracker a process is. A process says its role; ``import perftracker`` reads it.

``import perftracker`` turns detection on only in a training process. perftracker's own processes
say what they are in ``PERFTRACKER_ROLE``, set by whoever starts them (``child_env``): the node
agent and its sampler and summarizer processes, the localizer. The ``perftracker`` console script is
the one process that cannot set it before the package is imported, so it is recognized by its
program name. Anything else is a training process.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Final

ROLE_ENV: Final = "PERFTRACKER_ROLE"
TRAINING: Final = "training"
CLI: Final = "cli"
AGENT: Final = "agent"
LOCALIZER: Final = "localizer"
SAMPLER: Final = "sampler"
SUMMARIZER: Final = "summarizer"
ROLES: Final = (TRAINING, CLI, AGENT, LOCALIZER, SAMPLER, SUMMARIZER)


def current_role(environ: Mapping[str, str] | None = None, program: str | None = None) -> str:
    """This process's role: ``PERFTRACKER_ROLE`` if it names one, else ``cli`` for the console
    script, else ``training``. An unknown value counts as ``training`` (detection stays possible)."""
    env = os.environ if environ is None else environ
    value = env.get(ROLE_ENV, "").strip().lower()
    if value in ROLES:
        return value
    prog = sys.argv[0] if program is None and sys.argv else (program or "")
    if os.path.basename(prog) == "perftracker":  # the console script's own program name
        return CLI
    return TRAINING


def child_env(role: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a perftracker process of ``role`` started from this one."""
    if role not in ROLES:
        raise ValueError(f"unknown perftracker role {role!r} (one of {', '.join(ROLES)})")
    env = dict(os.environ if base is None else base)
    env[ROLE_ENV] = role
    return env
