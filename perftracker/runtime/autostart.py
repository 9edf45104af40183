"""The embedded default: start exactly one node agent (with its embedded localizer) per run dir.

Called from the worker's channel thread (never from the training thread) when no agent answers on
``<run_dir>/agent.sock`` and ``Config.autostart_agent`` is on. Exactly one agent runs per run dir:

- the agent itself holds an exclusive ``fcntl.flock`` on ``<run_dir>/agent.lock`` for its whole life
  and exits at once if another process holds it, so even a race can start at most one live agent;
- starters serialize on ``<run_dir>/spawn.lock`` and spawn only when the socket is dead and nobody
  holds ``agent.lock``, so the usual case spawns exactly one process.

The agent is a detached subprocess (its own session, stdin closed, output to
``<run_dir>/agent.log``) running ``python -m perftracker agent --embedded-localizer``. Its store goes
to ``./perftracker-runs/`` of the training job's working directory. It exits on its own once no
worker has been connected for ``agent_idle_exit_s`` and no session is open.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

from perftracker.config import Config
from perftracker.role import AGENT, child_env
from perftracker.rundir import RunDirError, ensure_private_dir, open_private
from perftracker.wire import framing as wire

log = logging.getLogger(__name__)

AGENT_LOCK = "agent.lock"
SPAWN_LOCK = "spawn.lock"
AGENT_LOG = "agent.log"
DEFAULT_IDLE_EXIT_S = 300.0

_spawned: list[subprocess.Popen[bytes]] = []  # keep references: no ResourceWarning, reap on exit


def socket_alive(path: str, timeout_s: float = 1.0) -> bool:
    """Whether something accepts connections on the Unix socket ``path``."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout_s)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def lock_held(path: str) -> bool:
    """Whether another process holds an exclusive flock on ``path``."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK)
    finally:
        os.close(fd)  # closing drops our lock if we took it
    return False


def acquire_agent_lock(run_dir: str) -> int | None:
    """For the agent: hold ``<run_dir>/agent.lock`` for the process lifetime. None if another agent holds it."""
    ensure_private_dir(run_dir)  # RunDirError: another user's dir, or one open to group/others
    fd = os.open(os.path.join(run_dir, AGENT_LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    os.set_inheritable(fd, False)
    return fd


def agent_command(run_dir: str, idle_exit_s: float = DEFAULT_IDLE_EXIT_S, localizer_url: str = "") -> list[str]:
    """The node agent's command line: with its embedded localizer, or reporting to ``localizer_url``
    (``PERFTRACKER_LOCALIZER_URL``, a shared service: it wins when set; the token comes from the
    environment, ``PERFTRACKER_TOKEN`` or ``PERFTRACKER_TOKEN_FILE``)."""
    where = ["--localizer-url", localizer_url] if localizer_url else ["--embedded-localizer"]
    return [sys.executable, "-m", "perftracker", "agent", "--run-dir", run_dir, *where,
            "--idle-exit-s", str(idle_exit_s)]


def spawn_agent(run_dir: str, command: Sequence[str] | None = None, localizer_url: str = "") -> subprocess.Popen[bytes]:
    """Start a detached agent process; its output goes to <run_dir>/agent.log (or nowhere if that fails)."""
    cmd = list(command or agent_command(run_dir, _idle_exit_s(), localizer_url))
    env = child_env(AGENT)
    env["PERFTRACKER_AUTOSTART_AGENT"] = "0"
    env["PERFTRACKER_RUN_DIR"] = run_dir
    # the agent is not a training worker: never let it think it is one
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK"):
        env.pop(var, None)
    try:
        out = os.fdopen(open_private(os.path.join(run_dir, AGENT_LOG), os.O_WRONLY | os.O_APPEND), "ab")
    except OSError:
        out = open(os.devnull, "wb")  # noqa: SIM115
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True, env=env)
    finally:
        out.close()
    _spawned.append(proc)
    return proc


def _idle_exit_s() -> float:
    try:
        return float(os.environ.get("PERFTRACKER_AGENT_IDLE_EXIT_S", DEFAULT_IDLE_EXIT_S))
    except ValueError:
        return DEFAULT_IDLE_EXIT_S


AGENT_ERROR = "agent.error"  # perftracker/cli/agent.py leaves one line there when it cannot run
_announced: set[str] = set()


def _agent_failed(run_dir: str, code: int | None, announce: bool) -> None:
    """The agent we started exited at once: one line saying why (its agent.error, when it left one)
    on the worker that should say it (local rank 0), once per process; debug lines otherwise."""
    try:
        with open(os.path.join(run_dir, AGENT_ERROR)) as f:
            line = f.readline().strip()
    except OSError:
        line = ""
    if not line:
        line = (f"perftracker: no report will come: the node agent exited at start (code {code}); "
                f"see {os.path.join(run_dir, AGENT_LOG)}")
    if announce and line not in _announced:
        _announced.add(line)
        log.warning("%s", line)
    else:
        log.debug("%s", line)


def ensure_agent(config: Config, wait_s: float = 15.0, announce: bool = True) -> bool:
    """Make sure a node agent listens on ``<run_dir>/agent.sock``, starting one if needed.

    Blocks up to ``wait_s`` (call it from a background thread). Returns whether the socket answers.
    Never raises: failures are logged and reported as False; an agent that cannot run is announced
    in one line when ``announce`` (local rank 0), once per process.
    """
    run_dir = config.run_dir
    path = wire.socket_path(run_dir)
    try:
        if socket_alive(path):
            return True
        ensure_private_dir(run_dir)
        spawn_fd = os.open(os.path.join(run_dir, SPAWN_LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except (OSError, RunDirError) as exc:
        log.warning("perftracker: cannot start a node agent in %s: %s; training continues", run_dir, exc)
        return False
    try:
        # other starters wait here while one spawns; bounded, because the holder may be SIGSTOPped
        # or frozen (then spawn anyway: the agent's own agent.lock still allows only one agent)
        lock_deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(spawn_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if socket_alive(path):
                    return True
                if time.monotonic() >= lock_deadline:
                    log.info("perftracker: %s stays locked; starting an agent without it", SPAWN_LOCK)
                    break
                time.sleep(0.1)
        if socket_alive(path):
            return True
        if not lock_held(os.path.join(run_dir, AGENT_LOCK)):
            proc = spawn_agent(run_dir, localizer_url=config.localizer_url)
            log.info("perftracker: started a node agent (pid %d) in %s", proc.pid, run_dir)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if socket_alive(path):
                return True
            if _spawned and _spawned[-1].poll() is not None and not lock_held(os.path.join(run_dir, AGENT_LOCK)):
                _agent_failed(run_dir, _spawned[-1].returncode, announce)
                return False
            time.sleep(0.1)
        if socket_alive(path):
            return True
        if announce and "no-answer" not in _announced:
            _announced.add("no-answer")
            log.warning("perftracker: the node agent does not answer on %s after %.0f s (see %s); retrying",
                        path, wait_s, os.path.join(run_dir, AGENT_LOG))
        return False
    except OSError as exc:
        log.warning("perftracker: cannot start a node agent in %s: %s; training continues", run_dir, exc)
        return False
    finally:
        try:
            fcntl.flock(spawn_fd, fcntl.LOCK_UN)
        finally:
            os.close(spawn_fd)
