"""The localize thread: each session that is due (deadline) or complete (every rank uploaded) is
localized once, off the event loop, and its report stored, written to a file and posted as events.

State changes go through the store's writer thread (``perftracker.localizer.store.writer.GroupCommit``); localization
itself (numpy/statsmodels) runs on a one-thread executor so that the service keeps answering.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perftracker.localizer.k8s.cluster import ClusterLink
from perftracker.localizer.service.session.manager import SessionManager
from perftracker.localizer.store.writer import GroupCommit

from perftracker.model import Report
from perftracker.model.names import is_name
from perftracker.rundir import make_private_dir, write_private
from perftracker.wire.strict_json import dumps as strict_dumps

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Uploaded:
    """What an upload's write returns: the writer checks that session after the commit."""

    session: str


class LocalizeRunner:
    """Runs localizations for the service on the "localize" thread, each session once at a time.

    It also owns the store's writer thread (``writer``, the only thread that writes the store),
    since after each commit a session may have become complete: ``run_batch`` is the store's.
    """

    def __init__(self, sessions: SessionManager, run_batch: Callable[[list[Any]], list[tuple[bool, Any]]],
                 localize_options: object | None = None,
                 expect_path: str | None = None, report_dir: str | None = None) -> None:
        self.sessions = sessions
        self.localize_options = localize_options
        self.expect_path = expect_path  # --expect FILE; None: the built-in profiles
        self.report_dir = report_dir  # also write each report as <report_dir>/<session>.json
        self.writer = GroupCommit(run_batch, after_commit=self.after_commit)
        self.cluster: ClusterLink | None = None  # set at startup when there is a Kubernetes client
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="localize")
        self._lock = threading.Lock()
        self.localizing: set[str] = set()
        self.on_report: list[Callable[[Report], None]] = []  # called on the localize thread per stored report

    def warm(self) -> None:
        """Import numpy/statsmodels now, on the localize thread, not when the first report is due."""
        self._executor.submit(_warm_imports)

    def close(self) -> None:
        """Blocks until a localization in progress finished (its writes go through the writer)."""
        self._executor.shutdown(True)

    def schedule(self, session: str) -> None:
        """Localize the session on the localize thread (once). Callable from any thread."""
        with self._lock:
            if session in self.localizing:
                return
            self.localizing.add(session)
        try:
            self._executor.submit(self._localize, session)
        except RuntimeError:  # shutting down
            with self._lock:
                self.localizing.discard(session)

    def after_commit(self, results: list[tuple[bool, Any]]) -> None:
        """Writer thread, after a commit: sessions that just became complete are localized at once,
        without waiting for the event loop (which may be busy answering the uploads)."""
        seen: set[str] = set()
        for ok, value in results:
            if ok and isinstance(value, Uploaded) and value.session not in seen:
                seen.add(value.session)
                if self.sessions.complete_now(value.session):
                    self.schedule(value.session)

    def _localize(self, session: str) -> None:
        """Localize thread: open -> localizing -> report, with the writes through the writer thread."""
        writer = self.writer
        try:
            t0 = time.monotonic()
            s = writer.call(lambda: self.sessions.begin_localizing(session))
            if s is None:
                return
            t1 = time.monotonic()
            try:
                report = self.sessions.build_report(s, self._localize_options())
                log.info("session %s: localizing took %.2f s (%.2f s waiting for the writer)",
                         session, time.monotonic() - t0, t1 - t0)
            except Exception as exc:  # noqa: BLE001 - a bad session must not stop the service
                log.exception("localizing session %s failed", session)
                error = f"{type(exc).__name__}: {exc}"
                writer.call(lambda: self.sessions.fail(session, error))
                return
            # the file first: a client that sees the session done (CLI trigger, report latest)
            # reads the file next, so it must already be there
            written = self._write_report_file(report)
            if writer.call(lambda: self.sessions.finish(session, report)):
                self._announce(report)
            elif written is not None:  # the session was not this report's to finish
                written.unlink(missing_ok=True)
        except Exception:  # noqa: BLE001 - e.g. the store failed; the deadline checker retries
            log.exception("localizing session %s stopped", session)
        finally:
            with self._lock:
                self.localizing.discard(session)

    def _announce(self, report: Report) -> None:
        if self.cluster is not None:
            self.cluster.post_events(report)
        for callback in self.on_report:
            callback(report)

    def settled(self, session: str) -> None:
        """A session the trigger closed at once (the first look, session_first_look.py): its report
        file, Kubernetes events and callbacks, as a localized session gets them. Never raises."""
        try:
            report = self.sessions.store.get_report(session)
            if report is not None:
                self._write_report_file(report)
                self._announce(report)
        except Exception:  # noqa: BLE001 - the store has the report; these are conveniences
            log.exception("announcing the first-look report of session %s failed", session)

    def _localize_options(self) -> object | None:
        """The options handed to ``localize``: ``expect_path`` from the service options (localize thread)."""
        opts = self.localize_options
        if self.expect_path is None:
            return opts
        from perftracker.localizer.diagnose.method.options import (
            LocalizeOptions,  # lazy: the numpy stage
        )

        if opts is None:
            return LocalizeOptions(expect_path=self.expect_path)
        if isinstance(opts, LocalizeOptions) and opts.expect_path is None and opts.expectations is None:
            return dataclasses.replace(opts, expect_path=self.expect_path)
        return opts

    def report_path(self, session: str) -> Path | None:
        if not self.report_dir or not is_name(session):  # a name is one path component (model/names.py)
            return None
        return Path(self.report_dir).resolve() / f"{session}.json"

    def _write_report_file(self, report: Report) -> Path | None:
        """The report as a JSON file beside the store; its path, or None when none was written."""
        path = self.report_path(report.session)
        if path is None:
            return None
        try:
            make_private_dir(path.parent)
            write_private(path, strict_dumps(report.to_dict(), indent=2) + "\n")
        except OSError as exc:  # the store has it; the file is a convenience
            log.warning("could not write report file %s: %s", path, exc)
            return None
        return path


def _warm_imports() -> None:
    for name in ("perftracker.localizer.diagnose.localize", "perftracker.localizer.diagnose.incidents.hang"):
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - reported when a session needs it
            log.warning("cannot import %s yet: %s", name, exc)
