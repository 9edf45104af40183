"""`perftracker agent`: run the node agent (sidecar), optionally with an embedded localizer.

With ``--embedded-localizer`` (what autostart and ``perftracker run`` use) the agent process also runs
the embedded localizer (perftracker.localizer.service.embedded: store, reports, token and localizer.json under
``./perftracker-runs/``; exactly one per runs dir, later agents attach to it) and points its uplink
at it. Only one agent runs per run dir (``<run_dir>/agent.lock``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
from typing import TYPE_CHECKING, Any

from perftracker.cli.options import DEFAULT_DATA_DIR, RUN_DIR_DEFAULT_TEXT, add_alias, add_data_dir
from perftracker.config import Config
from perftracker.errors import ConfigError

if TYPE_CHECKING:  # the agent loads when the command runs
    from perftracker.agent.daemon.localizer_client import Uplink

HELP = "run the node agent (sidecar)"
DESCRIPTION = """Run the node agent: training processes connect to <run-dir>/agent.sock; the agent
profiles them when the localizer opens a session, summarizes each window in a low-priority process,
and uploads the patterns. Without --url it needs --embedded-localizer.

Two directories: --run-dir (this agent's socket, lock, log and raw windows; $PERFTRACKER_RUN_DIR,
where the workers look) and --data-dir (the embedded localizer's store, reports and token).
A training script with `import perftracker` starts this agent by itself; run it by hand for a
sidecar (Kubernetes) or a shared localizer.

examples:
  perftracker agent --embedded-localizer --idle-exit-s 300
  perftracker agent --url http://perftracker-localizer:8765 --token-file /var/run/perftracker/token
  perftracker agent --embedded-localizer --data-dir /scratch/perftracker-runs --keep-windows --metrics-port 9464"""

log = logging.getLogger(__name__)
DEFAULT_RUNS_DIR = DEFAULT_DATA_DIR


def add_arguments(p: argparse.ArgumentParser) -> None:
    cfg = Config.from_env()
    p.add_argument("--run-dir", default=cfg.run_dir, metavar="DIR",
                   help=f"the agent's socket, lock, log and raw windows (default {RUN_DIR_DEFAULT_TEXT})")
    p.add_argument("--url", dest="localizer_url", default=cfg.localizer_url or None, metavar="URL",
                   help="the localizer service, e.g. http://host:8765 (default $PERFTRACKER_LOCALIZER_URL, else "
                        "none: then --embedded-localizer)")
    add_alias(p, "--localizer-url", "--url", "localizer_url")  # one name for a localizer's URL (issue 47)
    p.add_argument("--token", default=None, help="bearer token (default $PERFTRACKER_TOKEN; prefer it or --token-file)")
    p.add_argument("--token-file", default=None, metavar="FILE",
                   help="file holding the bearer token (default $PERFTRACKER_TOKEN_FILE)")
    p.add_argument("--embedded-localizer", action="store_true", help="run a localizer inside this process")
    add_data_dir(p, "embedded localizer: its store, reports and token")
    p.add_argument("--window-s", type=float, default=cfg.window_s, metavar="S",
                   help="embedded localizer: default profile window, seconds (default $PERFTRACKER_WINDOW_S, else 20)")
    p.add_argument("--collect-grace-s", type=float, default=45.0,
                   help="embedded localizer: wait window + this for uploads (default %(default)s)")
    from perftracker.cli.localizer import add_limit_arguments

    add_limit_arguments(p, prefix="embedded localizer: ")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve Prometheus metrics on this port (0: any free one; default: no metrics)")
    p.add_argument("--metrics-host", default="127.0.0.1", help="metrics address (default %(default)s)")
    p.add_argument("--agent-id", default="", help="agent id (default <host>-<pid>)")
    p.add_argument("--idle-exit-s", type=float, default=0.0, metavar="S",
                   help="exit after this many seconds with no worker (0: never; default %(default)s; an agent "
                        "that a worker started gets $PERFTRACKER_AGENT_IDLE_EXIT_S, 300)")
    p.add_argument("--poll-timeout-s", type=float, default=20.0, metavar="S", help="long-poll duration (default %(default)s)")
    p.add_argument("--no-samplers", action="store_true", help="do not run the hardware samplers")
    p.add_argument("--keep-windows", dest="keep_files", action="store_true",
                   help="keep raw windows and pattern files under <run-dir>/windows after upload (for export-trace)")
    add_alias(p, "--keep-files", "--keep-windows", "keep_files", flag=True)
    p.add_argument("--socket-group", default=os.environ.get("PERFTRACKER_SOCKET_GROUP") or None, metavar="GROUP",
                   help="let workers of this group (name or gid) use the socket: for an agent running as another "
                        "user than the trainer, e.g. root for nsys (docs/security.md; default "
                        "$PERFTRACKER_SOCKET_GROUP, else the agent's user only)")
    p.add_argument("--ca-file", default=os.environ.get("PERFTRACKER_CA_FILE") or None,
                   metavar="FILE",
                   help="CA certificate(s) to verify an https:// localizer with (docs/security.md; default "
                        "$PERFTRACKER_CA_FILE, else the system's)")


def start_embedded_localizer(runs_dir: str, window_s: float, collect_grace_s: float,
                             limits: dict[str, Any] | None = None) -> Any:
    """Start (or attach to) the embedded localizer serving ``runs_dir``; returns its handle.
    ``limits``: ``perftracker.cli.localizer.limit_options`` (per-job limits, retention)."""
    from perftracker.localizer.service.embedded import start_embedded
    from perftracker.localizer.service.http_service import ServiceOptions
    from perftracker.localizer.service.retention import RetentionOptions
    from perftracker.localizer.service.session.manager import SessionOptions

    limits = limits or {"retention": RetentionOptions.from_env(), "sessions": {}}
    options = ServiceOptions(sessions=SessionOptions(default_window_s=window_s, collect_grace_s=collect_grace_s,
                                                     **limits["sessions"]),
                             retention=limits["retention"])
    return start_embedded(runs_dir, options=options)


AGENT_ERROR = "agent.error"  # one line for the training log: why this agent could not run (autostart reads it)
EXIT_MISSING_DEPENDENCY = 3


def check_localizer_imports() -> None:
    """Import what localizing needs now, in the agent: a missing package must stop the agent at
    start with one clear line, not fail every report later (ImportError)."""
    import importlib

    for name in ("perftracker.localizer.diagnose.localize", "perftracker.localizer.diagnose.incidents.hang"):
        importlib.import_module(name)


def missing_dependency(run_dir: str, exc: ImportError) -> int:
    """Log and leave ``<run_dir>/agent.error`` (for the worker that started us); the exit code."""
    module = getattr(exc, "name", None) or str(exc)
    line = (f"perftracker: no report will come: the node agent cannot run its localizer without the Python "
            f"package {module!r}; install it (pip install {module.split('.')[0]}) or reinstall perftracker-ml "
            "with its default dependencies")
    log.error("%s", line)
    with contextlib.suppress(OSError):
        path = os.path.join(run_dir, AGENT_ERROR)
        with open(path + ".tmp", "w") as f:
            f.write(line + "\n")
        os.replace(path + ".tmp", path)
    return EXIT_MISSING_DEPENDENCY


def _embedded_idle(uplink: Uplink) -> bool:
    """True when the localizer has no open or localizing session (so an idle agent may exit)."""
    try:
        return not any(s.get("state") in ("open", "localizing") for s in uplink.list_sessions())
    except Exception:  # noqa: BLE001 - an unreachable localizer has nothing to wait for
        return True


async def serve(args: argparse.Namespace) -> int:
    from perftracker.agent.daemon.daemon import AgentDaemon
    from perftracker.agent.daemon.job_routes import RoutedUplink
    from perftracker.agent.daemon.localizer_client import Uplink, resolve_token
    from perftracker.agent.daemon.options import AgentOptions
    from perftracker.agent.daemon.window_session import WindowOptions
    from perftracker.localizer.service.embedded import record_served_job
    from perftracker.runtime.autostart import acquire_agent_lock

    lock_fd = acquire_agent_lock(args.run_dir)
    if lock_fd is None:
        log.warning("another agent already runs for %s; exiting", args.run_dir)
        return 0
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(args.run_dir, AGENT_ERROR))  # an earlier agent's failure is not ours
    embedded = None
    try:
        if args.embedded_localizer:
            try:
                from perftracker.cli.localizer import limit_options

                embedded = await asyncio.to_thread(start_embedded_localizer, args.runs_dir, args.window_s,
                                                   args.collect_grace_s, limit_options(args))
                await asyncio.to_thread(check_localizer_imports)
            except ImportError as exc:
                return missing_dependency(args.run_dir, exc)
            url, token = embedded.url, embedded.token
            log.warning("perftracker agent: embedded localizer at %s, reports under %s", url, embedded.runs_dir)
        else:
            if not args.localizer_url:
                raise ConfigError("no localizer: give --url (or PERFTRACKER_LOCALIZER_URL), "
                                  "or --embedded-localizer")
            url = args.localizer_url
            token = resolve_token(args.token, args.token_file)
            if not token:
                raise ConfigError("no bearer token: give --token-file, PERFTRACKER_TOKEN or --token")
        default = Uplink(url, token, ca_file=None if embedded else args.ca_file)
        # a job that spans nodes reports to the localizer of its rank 0's node (issue 42)
        runs_dir = embedded.runs_dir if embedded is not None else None
        uplink = RoutedUplink(default, lambda u, t: Uplink(u, t, ca_file=args.ca_file),
                              on_route=(lambda job, u, t: record_served_job(runs_dir, job, u, t)) if runs_dir else None)
        options = AgentOptions(socket_gid=_group_id(args.socket_group),
            run_dir=args.run_dir, agent_id=args.agent_id, host=socket.gethostname(), poll_timeout_s=args.poll_timeout_s,
            idle_exit_s=args.idle_exit_s, metrics_host=args.metrics_host, metrics_port=args.metrics_port,
            window=WindowOptions(samplers=not args.no_samplers, keep_files=args.keep_files),
        )
        daemon = AgentDaemon(options, uplink, idle_check=(lambda: _embedded_idle(default)) if embedded else None,
                             job_server=embedded if embedded is not None and embedded.owned else None)
        await daemon.start()
        if embedded is not None and embedded.owned:
            embedded.on_report(lambda report: daemon.links.report_stored(report.job, report.session,
                                                                         report_ready_text(report)))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, daemon.request_stop)
        try:
            await daemon.wait_stopped()
        finally:
            await daemon.stop()
    finally:
        if embedded is not None:
            # bounded: the service may still hold an agent's long poll; sqlite (WAL) is crash-safe anyway
            await asyncio.to_thread(embedded.stop, 3.0)
        os.close(lock_fd)
    return 0


def report_ready_text(report: Any) -> str:
    """The training log's line for a stored report (rank 0): what it says and where to read it."""
    title = " ".join(str(report.top_line).split())
    return (f"perftracker: report of session {report.session} stored: {title[:160]}; read it with "
            f"`perftracker report {report.session}` (on any node of the job)")


def _group_id(group: str | None) -> int | None:
    if not group:
        return None
    if group.isdigit():
        return int(group)
    import grp

    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ConfigError(f"--socket-group {group}: no such group") from None


def run(args: argparse.Namespace) -> int:
    root = logging.getLogger()
    if root.level > logging.INFO:  # a daemon: its log (agent.log, a container's stdout) is where people look
        root.setLevel(logging.INFO)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        raise ConfigError(f"--metrics-port {args.metrics_port}: not a TCP port")
    if args.metrics_port is not None:
        from perftracker.agent.daemon.agent_metrics import available

        if not available():
            raise ConfigError("--metrics-port needs prometheus_client, a dependency of perftracker missing here: "
                              "pip install 'prometheus_client>=0.20'")
    return asyncio.run(serve(args))
