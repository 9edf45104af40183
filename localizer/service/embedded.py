"""The embedded localizer: the localizer service on a thread of the local agent, store under
``./perftracker-runs/``.

Files in the runs directory:

- ``localizer.sqlite``: the store (``perftracker report`` reads it directly);
- ``reports/<session>.json``: every report, as JSON;
- ``token``: the bearer token, mode 0600 (generated once, reused afterwards);
- ``localizer.json``: ``{"url", "pid", "store", "reports", "token_file"}`` while it runs;
- ``localizer.lock``: an flock held while it runs, so exactly one embedded localizer serves a
  runs directory. A second ``start_embedded`` on the same directory finds the first and returns a
  handle on it (``owned`` False) instead of starting another.

Nothing planted is trusted (issue 33): the runs directory is used only when it is this user's and
not writable by group or others (``check_runs_dir``), and ``localizer.json``, ``token`` and
``localizer.lock`` only when each is a regular file of this user, not a symlink, not writable by
group or others (``perftracker.rundir.open_owned``). Anything else raises ``RunDirError`` (a
PerftrackerError), one line naming the file, its owner or mode, and the fix. In a shared working
directory another user's ``perftracker-runs/`` can therefore neither redirect the agent to their
server nor hand it their token.

Expected ranges: ``start_embedded(..., expect_path=FILE)``, or ``PERFTRACKER_EXPECT=FILE`` in the
environment, replaces the built-in profiles (the format of ``localizer/diagnose/method/expected.toml``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import secrets
import threading
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING

from perftracker.localizer.service.validate import validate_expect_file

from perftracker.errors import PerftrackerError
from perftracker.rundir import check_dir, make_private_dir, open_owned, read_owned, write_private

if TYPE_CHECKING:
    from collections.abc import Callable

    from perftracker.localizer.service.http_service import LocalizerService, ServiceOptions

    from perftracker.model import Report

log = logging.getLogger(__name__)

DEFAULT_RUNS_DIR = "perftracker-runs"
STORE_NAME = "localizer.sqlite"
TOKEN_NAME = "token"
INFO_NAME = "localizer.json"
LOCK_NAME = "localizer.lock"
REPORTS_NAME = "reports"
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # a local URL: never via a proxy


class EmbeddedError(PerftrackerError):
    """The embedded localizer could not start, or a running one could not be found."""


def check_runs_dir(runs_dir: str | Path, other: str = "pass --runs-dir a directory of your own") -> Path:
    """``runs_dir`` when it is this user's directory and not writable by group or others (see the
    module doc); RunDirError otherwise, whose fix is to remove it or ``other``."""
    check_dir(runs_dir, what="runs dir", other=other)
    return Path(runs_dir)


def read_token(runs_dir: str | Path) -> str:
    """The runs directory's token ("" when there is none); RunDirError when it is not this user's."""
    if not os.path.lexists(runs_dir):
        return ""
    check_runs_dir(runs_dir)
    return (read_owned(Path(runs_dir) / TOKEN_NAME, what="token file") or "").strip()


def read_info(runs_dir: str | Path) -> tuple[str, str] | None:
    """(url, token) that ``localizer.json`` and ``token`` of ``runs_dir`` name, or None when either
    is missing or unreadable; RunDirError when the directory or a file is not this user's."""
    if not os.path.lexists(runs_dir):
        return None
    check_runs_dir(runs_dir)
    text = read_owned(Path(runs_dir) / INFO_NAME, what="embedded localizer file")
    if text is None:
        return None
    try:
        url = json.loads(text)["url"]
    except (ValueError, KeyError, TypeError):
        return None
    token = read_token(runs_dir)
    if not isinstance(url, str) or not url.startswith(("http://", "https://")) or not token:
        return None
    return url, token


def read_or_create_token(runs_dir: Path) -> str:
    """The runs directory's token, created (0600) on first use."""
    make_private_dir(runs_dir)
    token = read_token(runs_dir)
    if token:
        return token
    token = secrets.token_urlsafe(32)
    write_private(runs_dir / TOKEN_NAME, token + "\n")
    return token


def discover(runs_dir: str | Path = DEFAULT_RUNS_DIR, timeout_s: float = 0.0) -> tuple[str, str] | None:
    """(url, token) of a live embedded localizer serving ``runs_dir``, or None.

    Waits up to ``timeout_s`` for one that is starting. RunDirError when the directory or its
    files are not this user's (``read_info``)."""
    runs = Path(runs_dir)
    end = time.monotonic() + timeout_s
    while True:
        found = read_info(runs)
        if found is not None:
            try:
                with _OPENER.open(found[0] + "/v1/healthz", timeout=2) as r:
                    if r.status == 200:
                        return found
            except (OSError, ValueError):
                pass
        if time.monotonic() >= end:
            return None
        time.sleep(0.1)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


JOBS_NAME = "jobs"  # jobs/<job>.json: where this node's ranks of a multi-node job report (issue 42)


def record_served_job(runs_dir: Path, job: str, url: str, token: str = "") -> None:
    """Leave ``<runs_dir>/jobs/<job>.json`` (0600): the job's localizer URL, and the job's token when
    it is another node's (``perftracker report`` on this node reads the job's report from there)."""
    d = runs_dir / JOBS_NAME
    try:
        make_private_dir(d)
        write_private(d / f"{job}.json", json.dumps({"job": job, "url": url, "token": token,
                                                    "here": not token, "wall_ns": time.time_ns()}))
    except (OSError, PerftrackerError) as exc:
        log.warning("cannot record where job %s reports in %s: %s", job, d, exc)


def _wall_ns(record: dict[str, object]) -> int:
    v = record.get("wall_ns")
    return v if isinstance(v, int) else 0


def job_records(runs_dir: str | Path) -> list[dict[str, object]]:
    """The ``jobs/*.json`` records of ``runs_dir`` (this user's files only), newest first."""
    d = Path(runs_dir) / JOBS_NAME
    out: list[dict[str, object]] = []
    if not d.is_dir():
        return out
    for f in sorted(d.glob("*.json")):
        try:
            text = read_owned(f, what="job record")
            rec = json.loads(text) if text else None
        except (PerftrackerError, ValueError):
            continue
        if isinstance(rec, dict) and isinstance(rec.get("url"), str) and isinstance(rec.get("job"), str):
            out.append(rec)
    out.sort(key=_wall_ns, reverse=True)
    return out


class EmbeddedLocalizer:
    """A handle on the runs directory's embedded localizer. ``stop()`` ends it if this handle owns it."""

    def __init__(self, runs_dir: Path, url: str, token: str, owned: bool) -> None:
        self.runs_dir = runs_dir
        self.url = url
        self.token = token
        self.owned = owned
        self.store_path = runs_dir / STORE_NAME
        self.reports_dir = runs_dir / REPORTS_NAME
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._lock_file: IO[str] | None = None
        self._service: LocalizerService | None = None
        self._sites: dict[tuple[str, int], str] = {}  # (host, asked port) -> URL other nodes reach

    def serve_job(self, job: str, host: str, port: int, token: str, timeout_s: float = 10.0) -> str:
        """Serve ``job`` to the job's other nodes (issue 42): listen on ``host`` (the job's own
        interface), port ``port`` (0: any free one), and accept ``token`` for this job only. Returns
        the URL. Thread-safe; a second call for the same address reuses its listener. Raises
        EmbeddedError when this handle does not run the service or the address cannot be bound."""
        if self._service is None or self._loop is None:
            raise EmbeddedError("this process does not run the embedded localizer")
        service = self._service

        async def serve() -> str:
            service.grant_job(token, job)
            url = self._sites.get((host, port))
            if url is None:
                bound = await service.add_site(host, port)
                url = f"http://{_url_host(host)}:{bound}"
                self._sites[(host, port)] = url
            return url

        try:
            url = asyncio.run_coroutine_threadsafe(serve(), self._loop).result(timeout_s)
        except (OSError, PerftrackerError, TimeoutError) as exc:
            raise EmbeddedError(f"cannot serve job {job!r} on {host}:{port}: {exc}") from None
        record_served_job(self.runs_dir, job, url)
        return url

    def on_report(self, callback: Callable[[Report], None]) -> None:
        """Call ``callback(report)`` (on the localize thread) for each report stored from now on."""
        if self._service is not None:
            self._service.localize_runner.on_report.append(callback)

    def __enter__(self) -> EmbeddedLocalizer:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the service thread (if owned), remove localizer.json and release the lock."""
        if not self.owned:
            return
        if self._loop is not None and self._stop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout_s)
        with contextlib.suppress(OSError):
            info = json.loads((self.runs_dir / INFO_NAME).read_text())
            if info.get("pid") == os.getpid():
                (self.runs_dir / INFO_NAME).unlink()
        if self._lock_file is not None:
            self._lock_file.close()  # releases the flock
            self._lock_file = None
        self.owned = False


def start_embedded(runs_dir: str | Path = DEFAULT_RUNS_DIR, *, host: str = "127.0.0.1", port: int = 0,
                   token: str | None = None, options: ServiceOptions | None = None,
                   timeout_s: float = 15.0, expect_path: str | Path | None = None) -> EmbeddedLocalizer:
    """Start the embedded localizer on a daemon thread, or attach to the one already serving ``runs_dir``.

    ``options.report_dir`` defaults to ``<runs_dir>/reports``. ``expect_path`` (else
    ``options.expect_path``, else the environment's ``PERFTRACKER_EXPECT``) is an expected-ranges
    TOML file used instead of the built-in profiles; a bad one raises ConfigError before anything
    starts. Returns once it answers on its URL."""
    from perftracker.localizer.service.http_service import LocalizerService, ServiceOptions
    from perftracker.localizer.store.sqlite_store import Store  # aiohttp and sqlite: only to serve

    opts = options or ServiceOptions()
    expect = expect_path or opts.expect_path or os.environ.get("PERFTRACKER_EXPECT") or None
    if expect is not None:
        from dataclasses import replace

        validate_expect_file(expect)
        opts = replace(opts, expect_path=str(Path(expect).resolve()))
    runs = Path(runs_dir).resolve()
    make_private_dir(runs)
    check_runs_dir(runs)
    lock_file = os.fdopen(open_owned(runs / LOCK_NAME, os.O_RDWR | os.O_APPEND | os.O_CREAT, what="lock file"), "a+")
    try:
        fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock_file.close()
        found = discover(runs, timeout_s)
        if found is None:
            raise EmbeddedError(f"{runs}: another process holds {LOCK_NAME} but no localizer answers") from None
        log.info("using the embedded localizer already running at %s", found[0])
        return EmbeddedLocalizer(runs, found[0], found[1], owned=False)

    tok = token or read_or_create_token(runs)
    if opts.report_dir is None:
        from dataclasses import replace

        opts = replace(opts, report_dir=str(runs / REPORTS_NAME))
    handle = EmbeddedLocalizer(runs, "", tok, owned=True)
    handle._lock_file = lock_file
    ready = threading.Event()
    failure: list[BaseException] = []

    async def serve() -> None:
        store = Store(runs / STORE_NAME)
        service = LocalizerService(store, tok, opts)
        try:
            bound = await service.start(host, port)
            handle.url = f"http://{host}:{bound}"
            handle._loop = asyncio.get_running_loop()
            handle._service = service
            handle._stop = asyncio.Event()
            ready.set()
            await handle._stop.wait()
        finally:
            await service.stop()
            store.close()

    def thread_main() -> None:
        try:
            asyncio.run(serve())
        except BaseException as exc:  # noqa: BLE001 - reported to the starter
            failure.append(exc)
            log.exception("embedded localizer stopped")
        finally:
            ready.set()

    handle._thread = threading.Thread(target=thread_main, name="perftracker-localizer", daemon=True)
    handle._thread.start()
    if not ready.wait(timeout_s) or failure or not handle.url:
        handle.stop()
        raise EmbeddedError(f"embedded localizer did not start in {runs}: {failure[0] if failure else 'timeout'}")
    info = {"url": handle.url, "pid": os.getpid(), "store": str(handle.store_path),
            "reports": str(handle.reports_dir), "token_file": str(runs / TOKEN_NAME)}
    write_private(runs / INFO_NAME, json.dumps(info))
    log.info("embedded localizer at %s, store %s", handle.url, handle.store_path)
    return handle
