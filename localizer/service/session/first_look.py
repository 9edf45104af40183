"""The first look at the localizer (issue 30, Deliver 2): before a detector's slowdown session
sends any worker into a profile window, look at the hooks' per-step phase times that the agents'
heartbeats carry (``RankBeat.phases_ms``) and, when they name a rank and a phase (or every rank's
grown phase), close the session at once with a report of the level "first look"; no window runs.
Otherwise the session opens as before and the window runs.

Only the detector's triggers ("rank N: slowdown ..."): a manual trigger asks for a window. Only
with ``SessionOptions.first_look`` (``PERFTRACKER_FIRST_LOOK=1``, off by default until the fault
suites have run with it). The phase times are kept in memory, the last heartbeat's per rank: a
localizer restart forgets them and the next slowdown runs a window.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence

import numpy as np
from perftracker.localizer.diagnose.incidents.first_look import (
    FirstLookOptions,
    first_look,
    first_look_report,
)
from perftracker.localizer.service.validate import RankBeat

from perftracker.model import Report

log = logging.getLogger(__name__)

_DETECTOR = re.compile(r"^rank \d+: slowdown\b")


class FirstLookPhases:
    """Each job's ranks' latest phase times, and the first look over them."""

    def __init__(self, options: FirstLookOptions | None = None, max_age_ns: int = int(30e9)) -> None:
        self.options = options or FirstLookOptions()
        self.max_age_ns = max_age_ns  # phase times older than this are not looked at
        self._lock = threading.Lock()
        self._now: dict[str, dict[int, tuple[int, np.ndarray, np.ndarray | None]]] = {}

    def heard(self, job: str, beats: Sequence[RankBeat], now_ns: int) -> None:
        with self._lock:
            ranks = self._now.setdefault(job, {})
            for b in beats:
                if b.phases_ms:
                    before = np.asarray(b.phases_before_ms, dtype=float) if b.phases_before_ms else None
                    ranks[b.rank] = (now_ns, np.asarray(b.phases_ms, dtype=float), before)

    def forget(self, job: str) -> None:
        with self._lock:
            self._now.pop(job, None)

    def look(self, job: str, session: str, reason: str, expected: Sequence[int], now_ns: int,
             created_ns: int) -> Report | None:
        """A first-look report for this trigger, or None (the window runs). Needs fresh phase
        times of every expected rank: a rank not heard from could be the culprit."""
        if not _DETECTOR.match(reason):
            return None
        with self._lock:
            known = dict(self._now.get(job, {}))
        fresh = {r: v for r, v in known.items() if now_ns - v[0] <= self.max_age_ns}
        if not expected or any(r not in fresh for r in expected):
            return None
        now = {r: fresh[r][1] for r in expected}
        before = {r: b for r in expected if (b := fresh[r][2]) is not None}
        got = first_look(now, before or None, self.options)
        if not got.named:
            log.info("first look for job %s: %s; the window runs", job, got.reason)
            return None
        log.info("first look for job %s: %s (no window)", job, got.title)
        return first_look_report(got, job, session, reason, tuple(sorted(now)), created_ns)
