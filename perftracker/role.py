"""Which part of perftracker a process is. A process says its role; ``import perftracker`` reads it.

``import perftracker`` turns detection on only in a training process. perftracker's own processes
say what they are in ``PERFTRACKER_ROLE``, set by whoever starts them (``child_env``): the node
agent and its sampler and summarizer processes, the localizer. The ``perftracker`` program itself (the console script, or ``python -m
perftracker...``) cannot set it before the package is imported, so it is recognized by its program
name. Anything else is a training process.
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
    if program is None:
        program = _program_name()
    if program == "perftracker" or program.startswith("perftracker."):
        return CLI  # the perftracker program itself: the console script or `python -m perftracker...`
    return TRAINING


def _program_name() -> str:
    """``perftracker`` for the console script, the module for ``python -m MODULE``, else the script.

    While ``python -m`` imports the module's packages ``sys.argv[0]`` is still ``-m``, so the module
    comes from ``sys.orig_argv``."""
    argv = list(getattr(sys, "orig_argv", None) or sys.argv)
    i = 1
    while i < len(argv) - 1:
        arg = argv[i]
        if arg == "-m":
            return argv[i + 1]
        if arg == "-c" or not arg.startswith("-"):
            break
        i += 2 if arg in ("-X", "-W") else 1  # the interpreter options that take a value
    return os.path.basename(sys.argv[0]) if sys.argv else ""


def child_env(role: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a perftracker process of ``role`` started from this one."""
    if role not in ROLES:
        raise ValueError(f"unknown perftracker role {role!r} (one of {', '.join(ROLES)})")
    env = dict(os.environ if base is None else base)
    env[ROLE_ENV] = role
    return env


def not_a_training_process() -> None:
    """Said by perftracker's node agent and localizer packages on import: a process that loads them
    never trains, so the hooks that ``import perftracker`` armed come off again, unless a hooked
    event came already (perftracker/runtime/activation.py ``disarm``). Imports nothing: a process
    in which nothing was armed has no activation module loaded."""
    activation = sys.modules.get("perftracker.runtime.activation")
    if activation is not None:
        activation.disarm()
