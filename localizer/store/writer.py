"""The store's single writer: a thread that batches queued writes into one transaction (group commit)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_STOP = object()


class GroupCommit:
    """A writer thread that batches queued writes into one ``commit(items)`` call (one sqlite
    transaction, one fsync). Items queued while a batch commits go into the next one. ``submit``
    (from the event loop) and ``call`` (from another thread) return once the item is committed,
    with its result, or raise what it raised. ``after_commit(results)`` runs on the writer thread
    after each batch."""

    def __init__(self, commit: Callable[[list[Any]], list[tuple[bool, Any]]],
                 after_commit: Callable[[list[tuple[bool, Any]]], None] | None = None,
                 max_batch: int = 512) -> None:
        self._commit = commit  # items -> [(ok, result or exception)] per item, after one commit
        self._after_commit = after_commit
        self._max_batch = max_batch
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="store-writer", daemon=True)
        self._thread.start()

    def submit_threadsafe(self, item: Any) -> concurrent.futures.Future[Any]:
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._queue.put((item, fut))
        return fut

    async def submit(self, item: Any) -> Any:
        return await asyncio.wrap_future(self.submit_threadsafe(item))

    def call(self, item: Any, timeout_s: float | None = None) -> Any:
        return self.submit_threadsafe(item).result(timeout_s)

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is _STOP:
                break
            batch = [first]
            while len(batch) < self._max_batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stopping = True
                    break
                batch.append(nxt)
            try:
                results = self._commit([item for item, _ in batch])
            except Exception as exc:  # noqa: BLE001 - the commit failed: every waiter of the batch gets it
                results = [(False, exc)] * len(batch)
            for (_, fut), (ok, value) in zip(batch, results, strict=True):
                if ok:
                    fut.set_result(value)
                else:
                    fut.set_exception(value)
            if self._after_commit is not None:
                try:
                    self._after_commit(results)
                except Exception:  # noqa: BLE001 - never stop the writer
                    log.exception("after-commit hook failed")

    def close(self, timeout_s: float = 30.0) -> None:
        self._queue.put(_STOP)
        self._thread.join(timeout_s)
