"""`perftracker trigger`: ask every worker of a job to profile a window now, and wait for the report."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from perftracker.cli.exits import EXIT_TIMEOUT
from perftracker.cli.options import add_data_dir
from perftracker.errors import ConfigError, PerftrackerError
from perftracker.model.names import check_name, safe_text

HELP = "ask every worker of a job to profile a window now"
DESCRIPTION = """Open a session (or join the job's open one), wait until the localizer stored its report,
and print where the report is.

The localizer is --url, else $PERFTRACKER_LOCALIZER_URL, else the embedded localizer serving
--data-dir (./perftracker-runs by default). The token is --token, $PERFTRACKER_TOKEN, --token-file,
$PERFTRACKER_TOKEN_FILE, or the embedded localizer's token file.

examples:
  perftracker trigger                           # the only job registered with the local agent
  perftracker trigger --job train-29500 --window-s 10 --reason "loss spiked"
  perftracker trigger --job my-job --url http://perftracker-localizer:8765 --token-file /var/run/perftracker/token --no-wait"""

DEFAULT_RUNS_DIR = "perftracker-runs"


def say(text: str) -> None:
    """Command output (stdout); library code logs instead."""
    from perftracker.cli import output

    output.print_text(text)


def add_connection_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=None,
                   help="localizer URL, e.g. http://perftracker-localizer:8765 (default $PERFTRACKER_LOCALIZER_URL, "
                        "else the embedded localizer of --data-dir)")
    p.add_argument("--token", default=None, help="bearer token (default $PERFTRACKER_TOKEN; prefer it or --token-file)")
    p.add_argument("--token-file", default=None, metavar="FILE",
                   help="file holding the bearer token (default $PERFTRACKER_TOKEN_FILE, else the embedded localizer's)")
    add_data_dir(p, "the embedded localizer's store, reports and token")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--job", default=None, help="job id (default $PERFTRACKER_JOB_ID, or the only registered job)")
    p.add_argument("--window-s", type=float, default=None, metavar="S", help="profile window, seconds (default: the localizer's)")
    p.add_argument("--reason", default="on-demand (perftracker trigger)", help="recorded in the report (default %(default)r)")
    p.add_argument("--no-wait", action="store_true", help="print the session and return at once")
    p.add_argument("--timeout-s", type=float, default=600.0,
                   help="give up waiting after this long, exit code 124 (default %(default)s)")
    add_connection_arguments(p)


def connect(args: argparse.Namespace) -> Any:
    """An Uplink to the localizer the arguments name (or the running embedded one)."""
    from perftracker.agent.daemon.localizer_client import Uplink, resolve_token

    runs = Path(args.runs_dir)
    url = args.url or os.environ.get("PERFTRACKER_LOCALIZER_URL", "")
    embedded_token = ""
    if not url:
        # the embedded localizer's files: only this user's (another user's planted runs dir is refused)
        from perftracker.localizer.service.embedded import read_info

        found = read_info(runs)
        if found is None:
            raise ConfigError(f"no localizer: pass --url or set PERFTRACKER_LOCALIZER_URL, or start one "
                              f"(`perftracker run ...` runs an embedded localizer under {runs}/)")
        url, embedded_token = found
        routed = _job_route(runs, getattr(args, "job", None) or os.environ.get("PERFTRACKER_JOB_ID") or None)
        if routed is not None:  # a multi-node job whose localizer runs on another node (issue 42)
            return Uplink(routed[0], routed[1], retries=2, backoff_s=0.3)
    token = resolve_token(args.token, args.token_file) or embedded_token
    if not token and runs.exists():
        from perftracker.localizer.service.embedded import read_token

        token = read_token(runs)
    if not token:
        raise ConfigError("no bearer token: pass --token-file or set PERFTRACKER_TOKEN")
    return Uplink(url, token, retries=2, backoff_s=0.3)


def _job_route(runs: Path, job: str | None) -> tuple[str, str] | None:
    """(url, job token) of ``job``'s localizer on another node, from ``<runs>/jobs/<job>.json``
    (the agent leaves it when this node's ranks of a multi-node job report there); without a job
    name, the one job so recorded, if there is exactly one."""
    from perftracker.localizer.service.embedded import job_records

    records = [r for r in job_records(runs) if r.get("token")]
    if job is not None:
        records = [r for r in records if r.get("job") == job]
    if len(records) != 1:
        return None
    return str(records[0]["url"]), str(records[0]["token"])


def pick_job(up: Any, job: str | None) -> str:
    job = job or os.environ.get("PERFTRACKER_JOB_ID") or None
    if job:
        return job
    jobs = up.jobs()
    if len(jobs) == 1:
        return check_name(jobs[0], "job from the localizer")
    if not jobs:
        raise PerftrackerError("no agent has registered with the localizer yet: is the training job running?")
    raise ConfigError(f"several jobs are registered, pass --job: {', '.join(jobs)}")


class Progress:
    """One progress line on stderr: rewritten in place on a terminal, a new line per change otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last = ""

    def show(self, text: str, countdown: str = "") -> None:
        """``countdown`` (a changing time) is shown on a terminal only: a log gets a line per change
        of ``text``, not one per second."""
        if self.tty:
            text += countdown
        text = safe_text(text)
        if text == self.last:
            return
        self.last = text
        sys.stderr.write(("\r\x1b[K" + text) if self.tty else text + "\n")
        sys.stderr.flush()

    def done(self) -> None:
        if self.tty and self.last:
            sys.stderr.write("\n")


def wait_for_report(up: Any, session: str, timeout_s: float, runs_dir: Path) -> tuple[int, str]:
    """Wait for the session to close. Returns (exit code, report path or error)."""
    check_name(session, "session id from the localizer")  # it becomes a file name below
    progress = Progress()
    end = time.monotonic() + timeout_s
    try:
        while True:
            s = up.get_session(session)
            left_s = max(0.0, s["deadline_ns"] / 1e9 - time.time())
            progress.show(f"session {session}: {s['state']}, {len(s['uploaded'])}/{len(s['expected'])} rank(s) "
                          "uploaded", f", deadline in {left_s:.0f} s")
            if s["state"] == "failed":
                return 1, f"session {session} failed: {s['error']}"
            if s["state"] == "done":
                break
            if time.monotonic() > end:
                return EXIT_TIMEOUT, f"session {session} still {s['state']} after {timeout_s:.0f} s"
            time.sleep(0.5)
    finally:
        progress.done()
    if s.get("error"):  # closed with no report, e.g. a hang session whose job resumed
        return 0, ""
    path = s.get("report_path")
    if path and Path(path).is_file():
        return 0, path
    from perftracker.localizer.service.embedded import check_runs_dir
    from perftracker.rundir import check_dir, make_private_dir, write_private

    report = up.get_report(session)  # a remote localizer: keep a local copy, in a directory of ours
    make_private_dir(runs_dir)
    check_runs_dir(runs_dir)
    local = runs_dir / "reports" / f"{session}.json"
    make_private_dir(local.parent)
    check_dir(local.parent, what="reports dir", other="pass --data-dir a directory of your own")
    write_private(local, json.dumps(report.to_dict(), indent=2) + "\n")
    return 0, str(local)


def run(args: argparse.Namespace) -> int:
    up = connect(args)
    job = pick_job(up, args.job)
    session, joined = up.create_trigger(job, args.reason, args.window_s)
    check_name(session, "session id from the localizer")  # never a path: ../x, a/b, "x\n" are refused
    info = up.get_session(session)
    say(f"{'joined' if joined else 'opened'} session {session} for job {job}: window {info['window_s']:g} s, "
          f"{len(info['expected'])} expected rank(s)")
    if args.no_wait:
        return 0
    code, text = wait_for_report(up, session, args.timeout_s, Path(args.runs_dir))
    if code:
        from perftracker.cli import output

        output.error(text)
        return code
    if not text:
        say(f"session {session} closed without a report: {up.get_session(session)['error']}")
        return 0
    report = up.get_report(session)
    say(f"report: {text}")
    if report is not None:
        missing = f" (partial: ranks {list(report.ranks_missing)} missing)" if report.ranks_missing else ""
        say(f"{report.top_line}{missing}")
    say(f"view it: perftracker report {session}")
    return 0
