"""How the store's table parts (perftracker.localizer.store.pattern_store, event_store) reach the
database: the ``Store`` (perftracker.localizer.store.sqlite_store) hands each part its transaction
and its read query, and keeps the connections, the locks and the commit hooks to itself."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

# ``with transaction() as db:`` one write transaction (nested calls join the outer one)
Transaction = Callable[[], AbstractContextManager[sqlite3.Connection]]
# ``query(sql, args)``: the rows of a read (inside this thread's transaction: sees its writes)
Query = Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]
