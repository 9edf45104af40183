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

Expected ranges: ``start_embedded(..., expect_path=FILE)``, or ``PERFTRACKER_EXPECT=FILE`` in the
environment, replaces the built-in profiles (the format of ``localizer/diagnose/expected.toml``).
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
from typing import IO

from perftracker.localizer.service.http_service import LocalizerService, ServiceOptions
from perftracker.localizer.service.validate import validate_expect_file
from perftracker.localizer.store.sqlite_store import Store

from perftracker.errors import PerftrackerError
from perftracker.rundir import make_private_dir, open_private, write_private

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


def read_or_create_token(runs_dir: Path) -> str:
    """The runs directory's token, created (0600) on first use."""
    path = runs_dir / TOKEN_NAME
    if path.is_file():
        token = path.read_text().strip()
        if token:
            return token
    token = secrets.token_urlsafe(32)
    make_private_dir(runs_dir)
    write_private(path, token + "\n")
    return token


def discover(runs_dir: str | Path = DEFAULT_RUNS_DIR, timeout_s: float = 0.0) -> tuple[str, str] | None:
    """(url, token) of a live embedded localizer serving ``runs_dir``, or None.

    Waits up to ``timeout_s`` for one that is starting."""
    runs = Path(runs_dir)
    end = time.monotonic() + timeout_s
    while True:
        try:
            info = json.loads((runs / INFO_NAME).read_text())
            url = str(info["url"])
            token = (runs / TOKEN_NAME).read_text().strip()
            with _OPENER.open(url + "/v1/healthz", timeout=2) as r:
                if r.status == 200:
                    return url, token
        except (OSError, ValueError, KeyError):
            pass
        if time.monotonic() >= end:
            return None
        time.sleep(0.1)


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
    opts = options or ServiceOptions()
    expect = expect_path or opts.expect_path or os.environ.get("PERFTRACKER_EXPECT") or None
    if expect is not None:
        from dataclasses import replace

        validate_expect_file(expect)
        opts = replace(opts, expect_path=str(Path(expect).resolve()))
    runs = Path(runs_dir).resolve()
    make_private_dir(runs)
    lock_file = os.fdopen(open_private(runs / LOCK_NAME, os.O_RDWR | os.O_APPEND), "a+")
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
