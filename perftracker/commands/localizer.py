"""`perftracker localizer`: run the localizer service (HTTP/JSON, sqlite store)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
from pathlib import Path

from perftracker.errors import ConfigError

HELP = "run the localizer service"
DESCRIPTION = """Run the localizer: agents register, long-poll for triggers and upload patterns;
sessions are localized when every expected worker uploaded or the deadline passed.

Token: --token, else PERFTRACKER_TOKEN, else --token-file / PERFTRACKER_TOKEN_FILE. With none, a
new token is generated and written (mode 0600) to a file named `token` beside the store."""

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for all; default %(default)s)")
    p.add_argument("--port", type=int, default=8765, help="TCP port, 0 for any free one (default %(default)s)")
    p.add_argument("--store", default="perftracker-runs/localizer.sqlite", help="sqlite store path (default %(default)s)")
    p.add_argument("--token", default=None, help="bearer token (prefer PERFTRACKER_TOKEN or --token-file)")
    p.add_argument("--token-file", default=None, help="file holding the bearer token")
    p.add_argument("--max-body-bytes", type=int, default=2 * 1024 * 1024, help="request size limit (default %(default)s)")
    p.add_argument("--window-s", type=float, default=20.0, help="default profile window of a session (default %(default)s)")
    p.add_argument("--collect-grace-s", type=float, default=45.0,
                   help="a session waits window + this for uploads before it localizes partial (default %(default)s)")
    p.add_argument("--hang-collect-s", type=float, default=20.0,
                   help="a hang session waits this long for snapshots (default %(default)s)")
    p.add_argument("--report-dir", default=None,
                   help="also write each report as DIR/<session>.json (default: reports/ beside the store)")
    p.add_argument("--expect", metavar="FILE", default=None,
                   help="expected ranges (TOML, the format of localizer/expected.toml) instead of the built-in profiles")
    p.add_argument("--no-kubernetes", action="store_true",
                   help="do not use the Kubernetes API even when running in a pod")
    p.add_argument("--ready-file", default=None, help="write {url, pid, store} as JSON here once listening")


def resolve_or_create_token(args: argparse.Namespace) -> str:
    from agent.uplink import resolve_token

    token = resolve_token(args.token, args.token_file)
    if token:
        return token
    if args.token_file:
        raise ConfigError(f"--token-file {args.token_file}: file missing or empty")
    path = Path(args.store).parent / "token"
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    log.warning("no token given: generated one in %s (mode 0600)", path)
    return token


def run(args: argparse.Namespace) -> int:
    from localizer.service import ServiceOptions, run_service
    from localizer.sessions import SessionOptions

    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port {args.port}: not a TCP port")
    if args.expect is not None:  # a bad file fails now, naming the file and field, not at the first session
        from localizer.validate import validate_expect_file

        profiles = validate_expect_file(args.expect)
        log.info("expected ranges from %s (gpu jobs: profile %r, cpu jobs: profile %r)", args.expect,
                 profiles["gpu"], profiles["cpu"])
    token = resolve_or_create_token(args)
    report_dir = args.report_dir or str(Path(args.store).parent / "reports")
    options = ServiceOptions(max_body_bytes=args.max_body_bytes, report_dir=report_dir, expect_path=args.expect,
                             kubernetes=not args.no_kubernetes,
                             sessions=SessionOptions(default_window_s=args.window_s,
                                                     collect_grace_s=args.collect_grace_s,
                                                     hang_collect_s=args.hang_collect_s))

    def on_ready(url: str) -> None:
        logging.getLogger("perftracker").warning("localizer listening on %s, store %s", url, args.store)
        if args.ready_file:
            tmp = Path(args.ready_file + ".tmp")
            tmp.write_text(json.dumps({"url": url, "pid": os.getpid(), "store": str(args.store)}))
            os.replace(tmp, args.ready_file)

    run_service(args.host, args.port, args.store, token, options, on_ready=on_ready)
    return 0
