"""One worker's collective instances over the last steps of its window (issue 28): the record the
localizer replays to say what fixing a culprit would save (``localizer/diagnose/verdict/replay.py``).

Pure data. Times are integer microseconds from the start of the record (the first kept step's
boundary, on the worker's own clock). A row is one collective instance or point-to-point transfer
as this worker saw it:

    [group, kind, seq, src, dst, arrival_us, dur_us, compute_us]

- ``group``: index into ``groups`` (the process group's name; "" where the trace names none);
- ``kind``: index into ``kinds`` (what it is: "<group description>:<collective>", or the kernel's
  name where the trace names no group);
- ``seq``: the instance's sequence number in its group (as the trace or the runtime numbers it), or
  where there is none, its occurrence of this kind on this worker in the record;
- ``src``, ``dst``: the global ranks of a point-to-point transfer, -1 for a collective;
- ``arrival_us``: when this worker entered it; ``dur_us``: how long it was in it;
- ``compute_us``: this worker's compute between the previous instance's end and this arrival.

``steps_us``: the lengths of the kept steps, in order (the rows lie inside them). ``host_us``: per
step, the time the worker's host was not blocked waiting for its GPU (a step cannot be shorter than
its host's own work), on a GPU worker whose trace shows its host; empty otherwise. Rows are sorted
by arrival. On the wire the record is the dict ``to_dict`` writes, with a version ``v``
(``RECORD_VERSION``); a reader that meets another version ignores the record and says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from perftracker.errors import SchemaError

RECORD_VERSION = 1
ROW_FIELDS = ("group", "kind", "seq", "src", "dst", "arrival_us", "dur_us", "compute_us")
MAX_ROWS = 4096  # what a reader accepts (the summarizer writes at most agent.summarize.step_record.MAX_ROWS)
MAX_STEPS = 256
_MAX_US = 10**12


@dataclass(frozen=True)
class StepRecord:
    steps_us: tuple[int, ...]
    groups: tuple[str, ...]
    kinds: tuple[str, ...]
    rows: tuple[tuple[int, int, int, int, int, int, int, int], ...]
    host_us: tuple[int, ...] = ()
    version: int = RECORD_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {"v": self.version, "steps_us": list(self.steps_us), "groups": list(self.groups),
                "kinds": list(self.kinds), "rows": [list(r) for r in self.rows],
                **({"host_us": list(self.host_us)} if self.host_us else {})}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "step_record") -> StepRecord:
        """The record, checked; SchemaError names what is wrong. A record of another version raises
        ``RecordVersionError`` (the caller drops the record, not the worker's patterns)."""
        v = d.get("v")
        if v != RECORD_VERSION:
            raise RecordVersionError(f"{where}: version {v!r:.20} is not read by this perftracker "
                                     f"(it reads {RECORD_VERSION})")
        steps = _ints(d.get("steps_us"), f"{where}.steps_us", 0, _MAX_US, MAX_STEPS)
        host = _ints(d.get("host_us", []), f"{where}.host_us", 0, _MAX_US, MAX_STEPS)
        if host and len(host) != len(steps):
            raise SchemaError(f"{where}.host_us: {len(host)} steps, steps_us has {len(steps)}")
        groups = _strs(d.get("groups"), f"{where}.groups")
        kinds = _strs(d.get("kinds"), f"{where}.kinds")
        raw = d.get("rows")
        if not isinstance(raw, list) or len(raw) > MAX_ROWS:
            raise SchemaError(f"{where}.rows: expected a list of at most {MAX_ROWS} rows")
        rows = []
        for i, r in enumerate(raw):
            w = f"{where}.rows[{i}]"
            vals = _ints(r, w, -_MAX_US, _MAX_US, len(ROW_FIELDS))
            if len(vals) != len(ROW_FIELDS):
                raise SchemaError(f"{w}: expected {len(ROW_FIELDS)} integers {ROW_FIELDS}")
            g, k, seq, src, dst, arrival, dur, comp = vals
            if not (0 <= g < len(groups) and 0 <= k < len(kinds)) or dur < 0 or comp < 0 or arrival < 0:
                raise SchemaError(f"{w}: a group or kind index out of range, or a negative time")
            rows.append((g, k, seq, src, dst, arrival, dur, comp))
        return cls(steps, groups, kinds, tuple(rows), host)


class RecordVersionError(SchemaError):
    """A step record of a version this perftracker does not read."""


def _ints(v: Any, w: str, lo: int, hi: int, most: int) -> tuple[int, ...]:
    if not isinstance(v, list) or len(v) > most:
        raise SchemaError(f"{w}: expected a list of at most {most} integers")
    for x in v:
        if isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi:
            raise SchemaError(f"{w}: not an integer in [{lo}, {hi}]: {x!r:.40}")
    return tuple(v)


def _strs(v: Any, w: str) -> tuple[str, ...]:
    if not isinstance(v, list) or len(v) > MAX_ROWS or not all(isinstance(x, str) and len(x) <= 500 for x in v):
        raise SchemaError(f"{w}: expected a list of strings")
    return tuple(v)
