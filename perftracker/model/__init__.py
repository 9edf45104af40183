"""The pure data model: frozen dataclasses with to_dict / from_dict and schema_version. No I/O.

This is the import path for every data type. It holds the hang snapshot types; the pattern types live
in ``perftracker.model.patterns``, the report types in ``perftracker.model.report``, the shared
validation in ``perftracker.model.schema``.

Objects that cross a process or network boundary (PatternSet, HangSnapshot, Report) carry
``schema_version``. ``from_dict`` raises SchemaError on a wrong or unknown version or a bad shape,
with a message that names the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from perftracker.errors import SchemaError
from perftracker.model.patterns import (
    LINK_KEY,
    Category,
    Pattern,
    PatternSet,
    ProcessGroup,
    Triple,
    _pattern_from_row,
)
from perftracker.model.report import (
    LANE_PARTS,
    REPORT_SCHEMA_VERSION,
    Box,
    Finding,
    JointSaving,
    Lane,
    RankState,
    Report,
    TopFunction,
    Wait,
    compress_ranks,
)
from perftracker.model.schema import SCHEMA_VERSION, check_schema_version, optional, require

__all__ = [
    "LINK_KEY",
    "SCHEMA_VERSION",
    "Box",
    "Category",
    "Finding",
    "JointSaving",
    "LANE_PARTS",
    "Lane",
    "REPORT_SCHEMA_VERSION",
    "Frame",
    "HangSnapshot",
    "Pattern",
    "PatternSet",
    "ProcessGroup",
    "RankState",
    "Report",
    "TopFunction",
    "Wait",
    "Triple",
    "_pattern_from_row",
    "check_schema_version",
    "compress_ranks",
]


# --------------------------------------------------------------------------------------------
# hang snapshots
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


def _groups_from(items: list[Any], where: str) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    """A snapshot's ``groups``: [[name, description, [global ranks]], ...]."""
    out = []
    for i, g in enumerate(items):
        if not (isinstance(g, list) and len(g) == 3 and isinstance(g[2], list)
                and all(isinstance(r, int) and not isinstance(r, bool) for r in g[2])):
            raise SchemaError(f"{where}.groups[{i}]: expected [name, description, [ranks]]")
        out.append((str(g[0]), str(g[1]), tuple(g[2])))
    return tuple(out)


@dataclass(frozen=True)
class HangSnapshot:
    """What a blocked worker's controller thread saw. ``stack`` is outermost first."""

    job: str
    rank: int
    world_size: int
    host: str
    pid: int
    taken_ns: int  # wall-clock ns (time.time_ns) when the snapshot was taken
    last_iteration: int  # last completed iteration
    idle_s: float  # time since the last hook event
    stack: tuple[Frame, ...]
    current_op: str = ""  # innermost torch op / collective in progress, if known
    last_event: str = ""  # kind of the last hook event ("dataloader.next", "optimizer.step", ...)
    session: str = ""
    schema_version: int = SCHEMA_VERSION
    # the blocked thread's kernel state from procfs, "<state letter> <wchan>", e.g.
    # "S futex_do_wait" (waiting on a lock/condition, e.g. a gloo work), "S hrtimer_nanosleep", "R"
    kernel_state: str = ""
    # set when the snapshot was taken at exit, from the exception that ended the training thread
    # (e.g. "RuntimeError: ... Connection reset by peer"): the stack is the exception's traceback
    error: str = ""
    # how the process ended, when this snapshot reports a failure (perftracker/runtime/exit_capture.py, agent/daemon/worker_exits.py):
    # "" (alive, or a plain hang snapshot) | "exception" | "exit" | "signal" | "oom" | "dead"
    end: str = ""
    exit_code: int = 0  # the exit status ("exit") or the signal number ("signal", "oom")
    failed_ns: int = 0  # wall-clock ns of the failure (the excepthook, or the agent seeing the death); 0 unknown
    # the process groups this rank belongs to, as torch.distributed describes them when the snapshot
    # was taken: (name, description, global ranks) (issue 31: a hang or crash inside a sub-group)
    groups: tuple[tuple[str, str, tuple[int, ...]], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = self._to_dict()
        if self.groups:
            out["groups"] = [[name, desc, list(ranks)] for name, desc, ranks in self.groups]
        return out

    def _to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "job": self.job,
            "rank": self.rank,
            "world_size": self.world_size,
            "host": self.host,
            "pid": self.pid,
            "taken_ns": self.taken_ns,
            "last_iteration": self.last_iteration,
            "idle_s": self.idle_s,
            "stack": [[f.file, f.line, f.function] for f in self.stack],
            "current_op": self.current_op,
            "last_event": self.last_event,
            "session": self.session,
            "kernel_state": self.kernel_state,
            "error": self.error,
            "end": self.end,
            "exit_code": self.exit_code,
            "failed_ns": self.failed_ns,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HangSnapshot:
        where = "HangSnapshot"
        check_schema_version(d, where)
        stack = []
        for i, fr in enumerate(require(d, "stack", list, where)):
            if not (isinstance(fr, list) and len(fr) == 3 and isinstance(fr[1], int)):
                raise SchemaError(f"{where}.stack[{i}]: expected [file, line, function]")
            stack.append(Frame(str(fr[0]), fr[1], str(fr[2])))
        return cls(
            job=require(d, "job", str, where),
            rank=require(d, "rank", int, where),
            world_size=require(d, "world_size", int, where),
            host=require(d, "host", str, where),
            pid=require(d, "pid", int, where),
            taken_ns=require(d, "taken_ns", int, where),
            last_iteration=require(d, "last_iteration", int, where),
            idle_s=require(d, "idle_s", float, where),
            stack=tuple(stack),
            current_op=optional(d, "current_op", str, where, ""),
            last_event=optional(d, "last_event", str, where, ""),
            session=optional(d, "session", str, where, ""),
            kernel_state=optional(d, "kernel_state", str, where, ""),
            error=optional(d, "error", str, where, ""),
            end=optional(d, "end", str, where, ""),
            exit_code=optional(d, "exit_code", int, where, 0),
            failed_ns=optional(d, "failed_ns", int, where, 0),
            groups=_groups_from(optional(d, "groups", list, where, []), where),
        )
