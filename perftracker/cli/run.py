"""`perftracker run [--nproc-per-node N] -- <command...>`: the embedded default in one command.

Starts a node agent with its embedded localizer (store and reports under ``./perftracker-runs/``),
runs the command with ``PERFTRACKER_RUN_DIR`` pointing at that agent, waits for the sessions the
run opened to finish, prints where their reports are, and stops the agent. The exit status is the
command's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perftracker.cli.options import DEFAULT_DATA_DIR, add_data_dir
from perftracker.errors import ConfigError, PerftrackerError
from perftracker.model.names import safe_text
from perftracker.role import AGENT, child_env

HELP = "run a training command with a local agent and embedded localizer"
DESCRIPTION = """Run a training command with a local node agent and an embedded localizer.

examples:
  perftracker run --nproc-per-node 2 -- perftracker/examples/train.py --iters 500
  perftracker run -- torchrun --nproc_per_node 4 perftracker/examples/train.py
  perftracker run -- python my_training.py
  perftracker run --keep-windows --nproc-per-node 2 -- my_train.py   # then: perftracker export-trace latest --rank 0 -o t.json

A script path with --nproc-per-node is started with torchrun (python -m torch.distributed.run);
a script path alone with python. Reports go to ./perftracker-runs/ (see `perftracker report`)."""

log = logging.getLogger(__name__)
DEFAULT_RUNS_DIR = DEFAULT_DATA_DIR
# A command that failed stays a zombie until the agent has opened a crash session for it, for at
# most this long, so that the agent can read its wait status from /proc (perftracker.agent.daemon.worker_exits.watch_exit
# polls for 1 s after the worker's socket closes). A clean exit is reaped at once.
FAILED_EXIT_HOLD_S = 3.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc-per-node", type=int, default=None, metavar="N",
                   help="start a script with torchrun and N workers (default: a script runs with python)")
    add_data_dir(p, "the embedded localizer's store, reports and token")
    p.add_argument("--window-s", type=float, default=None, metavar="S",
                   help="profile window of each session, seconds (default $PERFTRACKER_WINDOW_S, else 20)")
    p.add_argument("--collect-grace-s", type=float, default=45.0,
                   help="a session waits window + this for every worker's upload (default %(default)s)")
    p.add_argument("--wait-s", type=float, default=120.0,
                   help="after the command ends, wait up to this long for open sessions (default %(default)s)")
    add_keep_windows(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")


def add_keep_windows(p: argparse.ArgumentParser) -> None:
    p.add_argument("--keep-windows", action="store_true",
                   help="keep each rank's raw profile window in <data-dir>/windows/ (the agent's too), "
                        "for `perftracker export-trace latest --rank R -o trace.json` (default: deleted after upload)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_command(command: list[str], nproc: int | None) -> list[str]:
    cmd = list(command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise ConfigError("no command given: perftracker run [options] -- <command...>")
    is_script = cmd[0].endswith(".py")
    if is_script and not Path(cmd[0]).is_file():
        raise ConfigError(f"{cmd[0]}: no such file")
    if nproc is not None:
        if nproc < 1:
            raise ConfigError(f"--nproc-per-node {nproc}: must be at least 1")
        if not is_script:
            raise ConfigError("--nproc-per-node needs a script path as the command (or give torchrun yourself)")
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
                "--master_port", str(free_port()), *cmd]
    if is_script:
        return [sys.executable, *cmd]
    return cmd


@dataclass
class LocalAgent:
    """A node agent + embedded localizer started for one run (a subprocess)."""

    runs_dir: Path
    run_dir: Path
    proc: subprocess.Popen[bytes]
    log_path: Path
    keep_windows: bool = False
    url: str = ""
    token: str = ""
    started_wall_ns: int = field(default_factory=time.time_ns)

    @classmethod
    def start(cls, runs_dir: str | Path, window_s: float | None = None, collect_grace_s: float = 45.0,
              extra: list[str] | None = None, timeout_s: float = 60.0, keep_windows: bool = False) -> LocalAgent:
        from perftracker.localizer.service.embedded import check_runs_dir
        from perftracker.rundir import make_private_dir, open_owned

        runs = Path(runs_dir).resolve()
        make_private_dir(runs)
        check_runs_dir(runs)  # another user's (or a world-writable) runs dir: refused, one line
        log_path = runs / "agent.log"
        # never through a symlink, only a file of ours (perftracker/rundir.py)
        log_fd = open_owned(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, what="agent log")
        run_dir = Path(tempfile.mkdtemp(prefix="perftracker-run-", dir="/tmp"))  # short: AF_UNIX path limit
        cmd = [sys.executable, "-m", "perftracker", "agent", "--run-dir", str(run_dir), "--embedded-localizer",
               "--data-dir", str(runs), "--collect-grace-s", str(collect_grace_s), "--poll-timeout-s", "10",
               *(["--keep-windows"] if keep_windows else []), *(extra or [])]
        if window_s is not None:
            cmd += ["--window-s", str(window_s)]
        env = child_env(AGENT)
        env["PERFTRACKER_AUTOSTART_AGENT"] = "0"
        with os.fdopen(log_fd, "ab") as out:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        agent = cls(runs, run_dir, proc, log_path, keep_windows=keep_windows)
        agent._wait_ready(timeout_s)
        return agent

    def _wait_ready(self, timeout_s: float) -> None:
        from perftracker.localizer.service.embedded import read_token

        deadline = time.monotonic() + timeout_s
        info = self.run_dir / "agent.json"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PerftrackerError(f"the agent exited at start (code {self.proc.returncode}); see {self.log_path}")
            with contextlib.suppress(OSError, ValueError, KeyError):
                if info.exists():
                    url = str(json.loads(info.read_text())["localizer_url"])
                    try:
                        token = read_token(self.runs_dir)  # only this user's token file
                    except PerftrackerError:
                        self.stop()
                        raise
                    if token:
                        self.url, self.token = url, token
                        return
            time.sleep(0.1)
        self.stop()
        raise PerftrackerError(f"the agent did not start in {timeout_s:.0f} s; see {self.log_path}")

    def env(self, window_s: float | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env["PERFTRACKER_RUN_DIR"] = str(self.run_dir)
        env["PERFTRACKER_AUTOSTART_AGENT"] = "0"
        if window_s is not None:
            env["PERFTRACKER_WINDOW_S"] = str(window_s)
        return env

    def uplink(self) -> Any:
        from perftracker.agent.daemon.localizer_client import Uplink

        return Uplink(self.url, self.token, retries=2)

    def sessions(self) -> list[dict[str, Any]]:
        """Sessions opened since this agent started."""
        try:
            return [s for s in self.uplink().list_sessions() if int(s.get("opened_ns", 0)) >= self.started_wall_ns]
        except PerftrackerError as exc:
            log.warning("cannot list sessions: %s", exc)
            return []

    def wait_sessions(self, timeout_s: float, progress: bool = True) -> list[dict[str, Any]]:
        """Wait until no session of this run is open or localizing; returns them all."""
        from perftracker.cli.trigger import Progress

        deadline = time.monotonic() + timeout_s
        line = Progress()
        try:
            while True:
                sessions = self.sessions()
                pending = [s for s in sessions if s.get("state") in ("open", "localizing")]
                if not pending or time.monotonic() >= deadline:
                    return sessions
                if progress:
                    s = pending[0]
                    line.show(f"perftracker: waiting for session {s['session']} ({s.get('state')}, "
                              f"{s.get('n_uploaded', 0)}/{s.get('n_expected', 0)} uploaded)")
                time.sleep(0.5)
        finally:
            line.done()

    def stop(self, remove_run_dir: bool = True) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.keep_windows:
            self.save_windows()
        if remove_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)


    def save_windows(self) -> list[Path]:
        """Move the raw windows the agent kept (``--keep-files``) from the temporary run dir to
        ``<runs_dir>/windows/``, where ``perftracker export-trace`` looks; the moved files."""
        from perftracker.rundir import make_private_dir

        kept = sorted((self.run_dir / "windows").glob("*.raw.npz"))
        kept += sorted((self.run_dir / "windows").glob("*.samples.npz"))  # the samplers' series beside them
        if not kept:
            return []
        dest = self.runs_dir / "windows"
        make_private_dir(dest)
        moved = []
        for f in kept:
            if f.is_symlink() or not f.is_file():
                continue  # only the regular files the workers wrote
            with contextlib.suppress(OSError):
                shutil.move(str(f), str(dest / f.name))
                moved.append(dest / f.name)
        if moved:
            n_raw = sum(1 for m in moved if m.name.endswith(".raw.npz"))
            sys.stderr.write(f"perftracker: kept {n_raw} raw window(s) and {len(moved) - n_raw} sample set(s) in {dest} "
                             "(perftracker export-trace latest --rank R -o trace.json)\n")
        return moved


def describe_sessions(agent: LocalAgent, sessions: list[dict[str, Any]], out: Any) -> None:
    reports = agent.runs_dir / "reports"
    if not sessions:
        out.write(f"perftracker: no session was triggered; the store is {agent.runs_dir / 'localizer.sqlite'}\n")
        return
    up = agent.uplink()
    for s in sessions:
        sid = s["session"]
        line = f"perftracker: session {sid} ({s.get('kind')}, {s.get('reason')}): {s.get('state')}"
        if s.get("state") == "done":
            with contextlib.suppress(PerftrackerError):
                report = up.get_report(sid)
                if report is not None:  # a hang session's report may be a crash report (issue 22)
                    line = f"perftracker: session {sid} ({report.kind}, {s.get('reason')}): {s.get('state')}"
                    line += f", {report.status}: {report.top_line}"
                    if report.kind in ("hang", "crash") and report.summary != report.top_line:
                        line += f"\n  {report.summary}"  # an incident's whole place and stack
            line += f"\n  report: {reports / (sid + '.json')}  (perftracker report {sid} --data-dir "\
                    f"{agent.runs_dir})"
        elif s.get("error"):
            line += f": {s['error']}"
        out.write(safe_text(line, newlines=True) + "\n")  # reasons and names: shown, never obeyed


def wait_keeping_failed_zombie(proc: subprocess.Popen[bytes], hold_s: float = FAILED_EXIT_HOLD_S,
                               seen: Callable[[], bool] = lambda: False, poll_s: float = 0.05) -> int:
    """Wait for ``proc``; if it failed (a nonzero status or a signal), reap it only once ``seen()``
    says the agent has seen the failure, or after ``hold_s``.

    When the command is itself the training process (``perftracker run -- python train.py``), this
    process is its parent: reaping it at once would take away the wait status that the agent reads
    from the zombie, and a failed single-process job would get no crash report (issue 22).
    """
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:
        return proc.wait()
    if info is not None and not (info.si_code == os.CLD_EXITED and info.si_status == 0):
        deadline = time.monotonic() + hold_s
        while time.monotonic() < deadline and not seen():
            time.sleep(poll_s)
    return proc.wait()


def _crash_session_open(agent: LocalAgent) -> bool:
    """A hang or crash session of this run exists (the crash reports open sessions of kind "hang")."""
    return any(s.get("kind") in ("hang", "crash") for s in agent.sessions())


def run(args: argparse.Namespace) -> int:
    cmd = build_command(args.command, args.nproc_per_node)
    agent = LocalAgent.start(args.runs_dir, args.window_s, args.collect_grace_s, keep_windows=args.keep_windows)
    sys.stderr.write(f"perftracker: agent and embedded localizer at {agent.url}; reports under {agent.runs_dir}\n"
                     f"perftracker: running {shlex.join(cmd)}\n")
    try:
        proc = subprocess.Popen(cmd, env=agent.env(args.window_s))
        try:
            code = wait_keeping_failed_zombie(proc, seen=lambda: _crash_session_open(agent))
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            code = proc.wait()
        sessions = agent.wait_sessions(args.wait_s)
        describe_sessions(agent, sessions, sys.stdout)
    finally:
        agent.stop()
    return code
