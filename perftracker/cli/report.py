"""`perftracker report`: show a stored report as text, JSON or HTML."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, TextIO

from perftracker.cli import output
from perftracker.cli.formats import add_format_options, resolve_format
from perftracker.cli.options import DEFAULT_DATA_DIR
from perftracker.errors import PerftrackerError, SchemaError, TransportError
from perftracker.model import Report
from perftracker.model.names import check_name, safe_text

HELP = "show a stored report as text, JSON or HTML"
DESCRIPTION = """Show the report of one profiling session.

The report is read from the embedded localizer's sqlite store (in --data-dir, the default, or
the file --store), from a running localizer over HTTP (--url, with the bearer token from --token,
PERFTRACKER_TOKEN, --token-file or PERFTRACKER_TOKEN_FILE), or from a JSON file written by
`--format json` (--file). `latest` is the newest session that has a report.

examples:
  perftracker report                        # the latest report, in the terminal
  perftracker report --brief                # only the headline and each finding's title
  perftracker report latest -o report.html          # the suffix sets the format
  perftracker report 20261128-020900-c5e6ca --format json
  perftracker report --data-dir /scratch/perftracker-runs latest
  perftracker report --url http://perftracker-localizer:8765 latest
  perftracker report --file report.json --format html -o report.html
"""

DEFAULT_STORE = f"{DEFAULT_DATA_DIR}/localizer.sqlite"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("session", nargs="?", default="latest",
                        help="session id, or 'latest' (default latest); with --file, the file's one report: "
                             "'latest' or its own id, another id is an error")
    add_format_options(parser)
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--data-dir", dest="runs_dir", metavar="DIR", default=None,
                     help=f"the embedded localizer's directory: its store DIR/localizer.sqlite (default {DEFAULT_DATA_DIR})")
    src.add_argument("--runs-dir", dest="runs_dir", metavar="DIR", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    src.add_argument("--store", metavar="PATH", default=None,
                     help=f"a localizer's sqlite store file (default $PERFTRACKER_STORE, else {DEFAULT_STORE})")
    src.add_argument("--url", metavar="URL", default=None, help="a running localizer, e.g. http://127.0.0.1:8765 (default: none, the store)")
    src.add_argument("--file", metavar="REPORT.json", default=None, help="a report written by --format json (default: none, the store)")
    parser.add_argument("--token", default=None, help="bearer token for --url (default $PERFTRACKER_TOKEN)")
    parser.add_argument("--token-file", default=None, help="file holding the bearer token for --url (default $PERFTRACKER_TOKEN_FILE)")


def run(args: argparse.Namespace) -> int:
    resolve_format(args)  # -o's suffix sets the format; options that disagree: one line, exit 2
    if args.output:
        output.check_writable(args.output)
    report = load_report(args)
    from perftracker.localizer.render import write

    if getattr(args, "brief", False):
        from perftracker.localizer.render.facts import brief_lines

        text = "\n".join(brief_lines(report))
        if args.output:
            def write_brief(fh: TextIO) -> None:
                fh.write(safe_text(text, newlines=True) + "\n")

            out = output.write_file(args.output, write_brief)
            output.message(f"wrote the brief report of session {report.session} to {out}")
        else:
            output.print_text(text)
        return 0

    if args.output:
        out = output.write_file(args.output, lambda fh: write(report, args.format, fh))
        output.message(f"wrote {args.format} report of session {report.session} to {out}")
    elif args.format == "text":
        write(report, "text", sys.stdout, console=output.console())
    else:
        write(report, args.format, sys.stdout)
    return 0


def load_report(args: argparse.Namespace) -> Report:
    """The Report that the arguments name (store, URL or file)."""
    if args.file:
        return _from_file(Path(args.file), args.session)
    if args.url:
        return _from_url(args.url, args.session, _token(args))
    store = args.store or (str(Path(args.runs_dir) / "localizer.sqlite") if getattr(args, "runs_dir", None) else None)
    if store and not args.store:
        from perftracker.localizer.service.embedded import check_runs_dir

        check_runs_dir(Path(store).parent, other="pass --data-dir DIR of your own")
    store = store or os.environ.get("PERFTRACKER_STORE")
    if not store and Path(DEFAULT_STORE).parent.exists():  # not another user's (planted) runs dir
        from perftracker.localizer.service.embedded import check_runs_dir

        check_runs_dir(Path(DEFAULT_STORE).parent, other="pass --store PATH of your own")
    path = Path(store or DEFAULT_STORE)
    if args.store or (os.environ.get("PERFTRACKER_STORE") and not getattr(args, "runs_dir", None)):
        return _from_store(path, args.session)
    return _from_node(path, args.session)


def _from_node(path: Path, session: str) -> Report:
    """The report from this node's store, or from the localizer of a multi-node job whose ranks on
    this node report to another node (``<runs dir>/jobs/<job>.json``, issue 42): for ``latest``, the
    newest of them. A job localizer that does not answer is a warning while another source has it."""
    from perftracker.localizer.service.embedded import job_records

    remote = [r for r in job_records(path.parent) if r.get("token")]
    if not remote:
        return _from_store(path, session)
    found: list[Report] = []
    problems: list[str] = []
    if path.is_file():
        try:
            found.append(_from_store(path, session))
        except PerftrackerError as exc:
            problems.append(str(exc))
    if session != "latest" and found:
        return found[0]
    for rec in remote:
        url, job, token = str(rec["url"]), str(rec["job"]), str(rec["token"])
        try:
            found.append(_from_url(url, session, token, job=job))
        except PerftrackerError as exc:
            problems.append(f"job {job}'s localizer at {url} (the node of its rank 0): {exc}")
    if not found:
        raise PerftrackerError("; ".join(problems) or f"no report at {path}")
    for line in problems:
        if "no session has a report" not in line and "unknown session" not in line:
            output.message(line, level="warning")
    return max(found, key=lambda r: r.created_ns)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number in strict JSON")


def _bounded_int(text: str) -> int:
    """An integer of a report: at most 20 digits (a 4,000-digit one passed JSON and broke the
    renderers with a traceback: issue 46)."""
    if len(text.lstrip("-")) > 20:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits")
    return int(text)


def _from_file(path: Path, session: str) -> Report:
    try:
        data = json.loads(path.read_text(encoding="utf-8"), parse_constant=_no_constant, parse_int=_bounded_int)
    except OSError as exc:
        raise PerftrackerError(f"--file {path}: cannot read ({exc.strerror})") from None
    except ValueError as exc:  # also NaN / Infinity: reports are strict JSON
        raise SchemaError(f"--file {path}: not JSON ({exc})") from None
    except RecursionError:
        raise SchemaError(f"--file {path}: not JSON (nested too deeply)") from None
    try:
        report = Report.from_dict(data)
    except SchemaError as exc:
        raise SchemaError(f"--file {path}: {exc}") from None
    if session not in ("latest", report.session):
        raise PerftrackerError(f"--file {path} holds session {report.session!r}, not {session!r}")
    return report


def _from_store(path: Path, session: str) -> Report:
    if not path.is_file():
        raise PerftrackerError(
            f"no localizer store at {path}: pass --store PATH, --url URL or --file REPORT.json "
            "(the embedded localizer keeps its store under ./perftracker-runs/)"
        )
    from perftracker.localizer.store.sqlite_store import Store

    store = Store(path)
    try:
        if session == "latest":
            report = None
            for rec in reversed(_all_sessions(store)):
                report = store.get_report(rec.session)
                if report is not None:
                    break
            if report is None:
                raise PerftrackerError(f"{path}: no session has a report yet")
            return report
        report = store.get_report(session)
        if report is None:
            rec = store.get_session(session)
            if rec is None:
                raise PerftrackerError(f"{path}: unknown session {session!r}")
            raise PerftrackerError(
                f"session {session!r} has no report yet (state {rec.state}, "
                f"{len(rec.uploaded)}/{len(rec.expected)} ranks uploaded)"
            )
        return report
    finally:
        store.close()


def _all_sessions(store: Any) -> list[Any]:
    out: list[Any] = []
    after = 0
    while True:
        page = store.sessions(after_seq=after, limit=1000)
        if not page:
            return out
        out.extend(page)
        after = page[-1].seq


def _token(args: argparse.Namespace) -> str:
    from perftracker.agent.daemon.localizer_client import resolve_token

    return resolve_token(str(args.token) if args.token else None, args.token_file, strict=True)


def _get_json(url: str, token: str) -> tuple[int, Any]:
    req = urllib.request.Request(url, headers={"Accept": "application/json"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - http(s) only, checked below
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            body = json.loads(exc.read())
            msg = body.get("error", body) if isinstance(body, dict) else body
        except ValueError:
            msg = exc.reason
        raise TransportError(f"GET {url}: HTTP {exc.code}: {msg}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise TransportError(f"GET {url}: {getattr(exc, 'reason', exc)}") from None


def _from_url(url: str, session: str, token: str, job: str = "") -> Report:
    if not url.startswith(("http://", "https://")):
        raise PerftrackerError(f"--url {url!r} must start with http:// or https://")
    base = url.rstrip("/")
    if session == "latest":
        of_job = f"&job={urllib.parse.quote(job, safe='')}" if job else ""
        _, listing = _get_json(f"{base}/v1/sessions?state=done&order=desc&limit=1{of_job}", token)  # the newest
        done = [s for s in listing.get("sessions", []) if s.get("state") == "done"]
        if not done:
            raise PerftrackerError(f"{base}: no session has a report yet")
        session = check_name(done[0].get("session"), f"{base}: session id")
    status, body = _get_json(f"{base}/v1/sessions/{urllib.parse.quote(session, safe='')}/report", token)
    if status == 202:
        raise PerftrackerError(
            f"session {session!r} has no report yet (state {body.get('state')}, "
            f"{len(body.get('uploaded', []))}/{len(body.get('expected', []))} ranks uploaded)"
        )
    try:
        return Report.from_dict(body)
    except SchemaError as exc:
        raise SchemaError(f"{base}: report of {session!r}: {exc}") from None
