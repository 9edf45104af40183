"""The named values of the model, as str-valued enums (issue 48): a report's kind, a finding's
spread and tests, a rank's state in a hang or crash report, a session's state.

Each member is its own string (``enum.StrEnum``): it compares equal to, hashes like, formats,
JSON-encodes and stores in sqlite as the plain string it replaced, so every document and table
stays byte-for-byte the same; code names the value instead of spelling it. No I/O.
"""

from __future__ import annotations

from enum import StrEnum


class ReportKind(StrEnum):
    """``Report.kind``: what opened the session, or offline traces."""

    SLOWDOWN = "slowdown"
    HANG = "hang"
    CRASH = "crash"
    OFFLINE = "offline"


class Spread(StrEnum):
    """How a finding spreads over the ranks (``Finding.kind``, the JSON's ``kind`` and ``spread``)."""

    COMMON = "common"  # most ranks: a job-wide cause
    SPECIFIC = "specific"  # these ranks and not the others
    RANDOM = "random"  # some ranks, no pattern


class Test(StrEnum):
    """A test that flagged a finding (``Finding.tests``)."""

    __test__ = False  # not a pytest test class

    EXPECTATION = "expectation"  # outside the expected range of its category
    DIFFERENTIAL = "differential"  # unlike most other ranks
    WAITS = "waits"  # its peers wait for it
    BASELINE = "baseline"  # unlike the job's healthy baseline


class RankStateName(StrEnum):
    """A rank's state in a hang or crash report (``RankState.state``)."""

    CULPRIT = "culprit"
    WAITING = "waiting"
    SILENT = "silent"
    PAUSED = "paused"
    OK = "ok"
    FAILED = "failed"
    RUNNING = "running"
    EXITED = "exited"


class SessionState(StrEnum):
    """A localizer session's state (the sessions table's ``state``)."""

    OPEN = "open"
    LOCALIZING = "localizing"
    DONE = "done"
    FAILED = "failed"
