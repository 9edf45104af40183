"""Per-job limits on what opens sessions (issue 33): one tenant cannot starve the others.

A trigger that would open a new session is refused with 429 when

- its job already has ``max_open_sessions_per_job`` sessions open or being localized, or
- its token (a job-scoped token; the main token: the job) opened ``triggers_per_minute`` sessions
  in the last 60 seconds.

A trigger that joins an open session costs nothing: every rank of a job reports the same slowdown,
and those joins are what a session is made of. Both limits are ``SessionOptions`` fields (``0``:
no limit), set by ``perftracker localizer --max-open-sessions/--triggers-per-minute``.
"""

from __future__ import annotations

from collections import deque

from perftracker.localizer.service.validate import RequestError

MINUTE_NS = 60 * 10**9


class TriggerQuota:
    """Sessions opened per key in a sliding minute. Memory: at most ``per_minute`` times per key,
    and keys with none in the last minute are dropped."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._opened: dict[str, deque[int]] = {}

    def check(self, key: str, now_ns: int) -> None:
        """429 when ``key`` opened ``per_minute`` sessions in the last minute (records nothing)."""
        if self.per_minute <= 0:
            return
        times = self._trim(key, now_ns)
        if times is not None and len(times) >= self.per_minute:
            wait_s = max(1, int((times[0] + MINUTE_NS - now_ns) / 1e9 + 0.999))
            raise RequestError(f"too many triggers: {key} opened {len(times)} sessions in the last minute "
                               f"(the limit, --triggers-per-minute {self.per_minute}); retry in {wait_s} s",
                               status=429)

    def opened(self, key: str, now_ns: int) -> None:
        if self.per_minute <= 0:
            return
        self._opened.setdefault(key, deque()).append(now_ns)

    def _trim(self, key: str, now_ns: int) -> deque[int] | None:
        times = self._opened.get(key)
        if times is None:
            return None
        while times and times[0] <= now_ns - MINUTE_NS:
            times.popleft()
        if not times:
            del self._opened[key]
            return None
        return times


def check_open_sessions(job: str, n_open: int, limit: int) -> None:
    """429 when ``job`` has ``limit`` sessions open already."""
    if limit > 0 and n_open >= limit:
        raise RequestError(f"too many sessions: job {job!r} has {n_open} sessions open or being localized "
                           f"(the limit, --max-open-sessions {limit}); a trigger opens one when another closes",
                           status=429)
