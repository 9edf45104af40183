"""Warn once per key: the first failure of a kind is a warning, repeats are debug lines.

Background loops (the worker's agent channel, the agent's localizer calls) retry forever; a
persistent failure must not flood the log. ``clear(key)`` re-arms the warning once the thing works.
"""

from __future__ import annotations

import logging


class WarnOnce:
    """Logs to ``logger``: a warning the first time ``key`` is seen, a debug line afterwards."""

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._keys: set[str] = set()

    def __call__(self, key: str, fmt: str, *args: object) -> None:
        if key in self._keys:
            self._log.debug(fmt, *args, stacklevel=2)
        else:
            self._keys.add(key)
            self._log.warning(fmt, *args, stacklevel=2)

    def clear(self, key: str) -> None:
        """The next failure of ``key`` warns again."""
        self._keys.discard(key)
