"""The options of the session manager (perftracker.localizer.service.session.manager) and its parts
(session_uploads, session_hangs): a module of their own, so that the parts need not import the
manager that owns them."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from perftracker.errors import ConfigError
from perftracker.model.window_length import DEFAULT_WINDOW_S, window_s_error


@dataclass(frozen=True)
class SessionOptions:
    default_window_s: float = DEFAULT_WINDOW_S  # perftracker/model/window_length.py
    collect_grace_s: float = 45.0  # after the window: time for the boundary wait, summarizing, upload
    hang_collect_s: float = 20.0  # a hang session waits this long for snapshots
    hang_recheck_s: float = 5.0  # a session whose ranks all pause is looked at again after this
    # a failure snapshot this soon after the job's crash session took its first failure belongs to
    # that crash (a survivor that failed late, after the session closed): it opens no new session
    crash_follow_s: float = 60.0
    # A rank whose agent says (in its heartbeat) that it is still working on the session's window
    # keeps the session open: the deadline moves to at least now + busy_extend_s, but never past
    # opened + window + max_collect_s. A slow writer or summarizer on a loaded node then costs time,
    # not a rank of the report.
    busy_extend_s: float = 20.0
    max_collect_s: float = 600.0
    max_expected_ranks: int = 1_000_000
    # a slowdown trigger joins the open session up to this long past its window's nominal end (the
    # agents start the window a little after the session opens); later ones open the next session
    join_slack_s: float = 2.0
    # uploads kept in memory as arrays for localization (bytes; ~32 per pattern: 1 GiB holds 100,000
    # ranks x 300 functions); past it a session's arrays are read back from the store when localized
    max_cached_set_bytes: int = 1024 * 1024 * 1024
    # an agent not heard from (registration, heartbeat) for this long is dead: others may take its ranks
    agent_dead_s: float = 15.0
    # per-job limits (perftracker.localizer.service.job_limits; 0: none): a trigger that would open a
    # session gets 429 when its job has this many open or being localized, or when its token (the
    # job, for the main token) opened this many in the last minute; joining an open session is free
    max_open_sessions_per_job: int = 4
    # the first look (session_first_look.py, issue 30): a detector's slowdown whose rank and phase the
    # heartbeats' phase times name closes at once with a "first look" report, no window
    first_look: bool = field(default_factory=lambda: os.environ.get("PERFTRACKER_FIRST_LOOK", "") == "1")
    triggers_per_minute: int = 12

    def __post_init__(self) -> None:
        if window_s_error(self.default_window_s):  # the one check (perftracker/model/window_length.py)
            raise ConfigError(f"--window-s {self.default_window_s}: {window_s_error(self.default_window_s)}")
