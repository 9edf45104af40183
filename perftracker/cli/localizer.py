"""`perftracker localizer`: run the localizer service (HTTP/JSON, sqlite store)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
from pathlib import Path

from perftracker.errors import ConfigError
from perftracker.model.window_length import DEFAULT_WINDOW_S

HELP = "run the localizer service"
DESCRIPTION = """Run the localizer: agents register, long-poll for triggers and upload patterns;
sessions are localized when every expected worker uploaded or the deadline passed.

Token: --token, else PERFTRACKER_TOKEN, else --token-file / PERFTRACKER_TOKEN_FILE, else the file
`token` beside the store; with none, a new token is generated once and written there (mode 0600), so
a restart keeps it. Short or placeholder tokens are refused. TLS, job-scoped tokens and the
slow-client limits: docs/security.md. One machine needs none of this: the node agent runs an
embedded localizer (`perftracker agent --embedded-localizer`, what `import perftracker` starts).

examples:
  perftracker localizer                                  # 127.0.0.1:8765, store in ./perftracker-runs/
  perftracker localizer --host 0.0.0.0 --port 8765 --store /var/lib/perftracker/localizer.sqlite
  perftracker localizer --tls-cert tls.crt --tls-key tls.key --job-tokens job-tokens.json"""

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for all; default %(default)s)")
    p.add_argument("--port", type=int, default=8765, help="TCP port, 0 for any free one (default %(default)s)")
    p.add_argument("--store", default="perftracker-runs/localizer.sqlite", help="sqlite store path (default %(default)s)")
    p.add_argument("--token", default=None, help="bearer token (default $PERFTRACKER_TOKEN; prefer it or --token-file)")
    p.add_argument("--token-file", default=None, metavar="FILE",
                   help="file holding the bearer token (default $PERFTRACKER_TOKEN_FILE, else `token` beside the store, "
                        "made once)")
    p.add_argument("--max-body-bytes", type=int, default=2 * 1024 * 1024, help="request size limit (default %(default)s)")
    p.add_argument("--window-s", type=float, default=DEFAULT_WINDOW_S,
                   help="default profile window of a session (default %(default)s)")
    p.add_argument("--collect-grace-s", type=float, default=45.0,
                   help="a session waits window + this for uploads before it localizes partial (default %(default)s)")
    p.add_argument("--hang-collect-s", type=float, default=20.0,
                   help="a hang session waits this long for snapshots (default %(default)s)")
    p.add_argument("--report-dir", default=None,
                   help="also write each report as DIR/<session>.json (default: reports/ beside the store)")
    p.add_argument("--expect", metavar="FILE", default=None,
                   help="expected ranges (TOML, the format of localizer/diagnose/method/expected.toml) instead of the built-in profiles")
    p.add_argument("--no-kubernetes", action="store_true",
                   help="do not use the Kubernetes API even when running in a pod")
    p.add_argument("--ready-file", default=None, help="write {url, pid, store} as JSON here once listening")
    p.add_argument("--tls-cert", default=os.environ.get("PERFTRACKER_TLS_CERT") or None,
                   help="serve HTTPS with this PEM certificate chain (with --tls-key)")
    p.add_argument("--tls-key", default=os.environ.get("PERFTRACKER_TLS_KEY") or None, help="the certificate's private key")
    p.add_argument("--job-tokens", default=os.environ.get("PERFTRACKER_JOB_TOKENS") or None,
                   help='JSON file {"<token>": ["<job or glob>", ...]}: tokens limited to those jobs')
    p.add_argument("--header-timeout-s", type=float, default=10.0,
                   help="close a connection whose request headers take longer (default %(default)s)")
    p.add_argument("--body-timeout-s", type=float, default=30.0,
                   help="answer 408 to a request whose body takes longer (default %(default)s)")
    p.add_argument("--max-connections", type=int, default=None,
                   help="open connections at most (default: the file-descriptor limit minus 64)")
    add_limit_arguments(p)


def add_limit_arguments(p: argparse.ArgumentParser, prefix: str = "") -> None:
    """Per-job limits and retention (docs/security.md); ``perftracker agent`` has them for its embedded
    localizer too. Retention defaults come from PERFTRACKER_RETENTION_DAYS / _MAX_MB when set."""
    p.add_argument("--max-open-sessions", type=int, default=4, metavar="N",
                   help=f"{prefix}a trigger that would open a session past N open ones of its job gets 429 "
                        "(0: no limit; default %(default)s)")
    p.add_argument("--triggers-per-minute", type=int, default=12, metavar="N",
                   help=f"{prefix}sessions each job token (the main token: each job) may open per minute, "
                        "then 429 (0: no limit; default %(default)s)")
    p.add_argument("--retention-days", type=float, default=None, metavar="DAYS",
                   help=f"{prefix}delete closed sessions and their reports this many days after they closed "
                        "(0: never; default $PERFTRACKER_RETENTION_DAYS, else 30)")
    p.add_argument("--retention-max-mb", type=float, default=None, metavar="MB",
                   help=f"{prefix}past this many MiB of stored sessions and report files, delete the oldest closed "
                        "ones (0: no bound; default $PERFTRACKER_RETENTION_MAX_MB, else 1024)")


def limit_options(args: argparse.Namespace) -> dict[str, object]:
    """The ServiceOptions/SessionOptions fields the limit arguments set: {"retention": ..., "sessions": {...}}."""
    from dataclasses import replace

    from perftracker.localizer.service.retention import DAY_S, MIB, RetentionOptions

    for name in ("max_open_sessions", "triggers_per_minute", "retention_days", "retention_max_mb"):
        v = getattr(args, name)
        if v is not None and (not v >= 0 or v == float("inf")):
            raise ConfigError(f"--{name.replace('_', '-')} {v}: must be a finite number >= 0 (0: no limit)")
    retention = RetentionOptions.from_env()  # ConfigError naming a bad PERFTRACKER_RETENTION_* variable
    if args.retention_days is not None:
        retention = replace(retention, max_age_s=args.retention_days * DAY_S)
    if args.retention_max_mb is not None:
        retention = replace(retention, max_bytes=int(args.retention_max_mb * MIB))
    return {"retention": retention,
            "sessions": {"max_open_sessions_per_job": args.max_open_sessions,
                         "triggers_per_minute": args.triggers_per_minute}}


def resolve_or_create_token(args: argparse.Namespace) -> str:
    from perftracker.agent.daemon.localizer_client import resolve_token
    from perftracker.localizer.service.tokens import check_token
    from perftracker.rundir import make_private_dir, write_private

    token = resolve_token(args.token, args.token_file)
    if token:
        return check_token(token)
    if args.token_file:
        raise ConfigError(f"--token-file {args.token_file}: file missing or empty")
    path = Path(args.store).parent / "token"
    if path.is_file():  # generated by an earlier start: agents hold it, keep it
        token = path.read_text().strip()
        if token:
            return check_token(token)
    make_private_dir(path.parent)
    token = secrets.token_urlsafe(32)
    write_private(path, token + "\n")
    log.warning("no token given: generated one in %s (mode 0600); later starts reuse it", path)
    return token


def run(args: argparse.Namespace) -> int:
    from perftracker.localizer.service.http_service import ServiceOptions, run_service
    from perftracker.localizer.service.session.manager import SessionOptions
    from perftracker.localizer.service.tokens import load_job_tokens

    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port {args.port}: not a TCP port")
    if args.expect is not None:  # a bad file fails now, naming the file and field, not at the first session
        from perftracker.localizer.service.validate import validate_expect_file

        profiles = validate_expect_file(args.expect)
        log.info("expected ranges from %s (gpu jobs: profile %r, cpu jobs: profile %r)", args.expect,
                 profiles["gpu"], profiles["cpu"])
    limits = limit_options(args)
    token = resolve_or_create_token(args)
    report_dir = args.report_dir or str(Path(args.store).parent / "reports")
    options = ServiceOptions(max_body_bytes=args.max_body_bytes, report_dir=report_dir, expect_path=args.expect,
                             kubernetes=not args.no_kubernetes, tls_cert=args.tls_cert, tls_key=args.tls_key,
                             job_tokens=load_job_tokens(args.job_tokens) if args.job_tokens else {},
                             header_timeout_s=args.header_timeout_s, body_timeout_s=args.body_timeout_s,
                             max_connections=args.max_connections, retention=limits["retention"],  # type: ignore[arg-type]
                             sessions=SessionOptions(default_window_s=args.window_s,
                                                     collect_grace_s=args.collect_grace_s,
                                                     hang_collect_s=args.hang_collect_s,
                                                     **limits["sessions"]))  # type: ignore[arg-type]

    def on_ready(url: str) -> None:
        logging.getLogger("perftracker").warning("localizer listening on %s, store %s", url, args.store)
        if args.ready_file:
            from perftracker.rundir import write_private

            write_private(args.ready_file, json.dumps({"url": url, "pid": os.getpid(), "store": str(args.store)}))

    run_service(args.host, args.port, args.store, token, options, on_ready=on_ready)
    return 0
