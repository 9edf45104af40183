"""Compare the ranks of an offline job over the same work: the steps every rank recorded.

torch.profiler's traces of one job need not cover the same iterations: a rank whose schedule is
longer, or that starts profiling later, records steps the others did not. Its extra step is not
like the others' either: a rank still profiling while another exports its trace waits in the next
collective for it, and that wait (at the head or the tail of its window) read as a culprit "outside
the profile" on a clean job. So before summarizing, every rank is cut to the steps all ranks
recorded (``plan_cuts``):

- ``ProfilerStep#N`` marks on the training thread, matched by N: robust to clock offsets between
  hosts. A rank's window becomes [start of its first common step, end of its last common step];
  a GPU stream is cut at that device's own ``ProfilerStep#N`` marks when it has them (its kernels run
  after the CPU step that launched them), else at the CPU bounds.
- No step marks on some rank: the overlap of the ranks' time spans, only when every trace names
  the same host (one clock; traces from different hosts are on clocks that need not agree).
  Otherwise nothing is cut, and the plan says why (``Cuts.note``).

A rank is never dropped for it: a rank whose steps share none with the others is left whole, and
the note says so. Pure functions over RawWindows; the caller reads and summarizes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import numpy as np

from perftracker.model.raw_window import EventKind, RawWindow

_STEP = re.compile(r"ProfilerStep#(\d+)$")


@dataclass(frozen=True)
class StepMarks:
    """One rank's recorded steps: number -> (start_ns, end_ns) on its training thread (CPU), and per
    GPU device the same from that device's own marks; with its window and host."""

    rank: int
    host: str
    window_start_ns: int
    window_end_ns: int
    cpu: dict[int, tuple[int, int]] = field(default_factory=dict)
    gpu: dict[int, dict[int, tuple[int, int]]] = field(default_factory=dict)


@dataclass(frozen=True)
class Cut:
    """Bounds to keep for one rank: CPU rows in [start_ns, end_ns], a GPU device's rows in its own
    bounds (``gpu``) or the CPU ones; ``steps`` the step numbers kept (empty: a time-span cut)."""

    start_ns: int
    end_ns: int
    gpu: dict[int, tuple[int, int]] = field(default_factory=dict)
    steps: tuple[int, ...] = ()
    iteration_ms: tuple[float, ...] = ()


@dataclass(frozen=True)
class Cuts:
    """The cut of each rank that needs one (rank -> Cut) and one line saying what was cut and why
    ('' when every rank covers the same work). ``usual``: the note says only that nothing could be
    checked, as for most multi-host traces (no step marks, no shared clock): not worth a warning."""

    by_rank: dict[int, Cut]
    note: str = ""
    usual: bool = False


def step_marks(raw: RawWindow) -> StepMarks:
    """The ProfilerStep#N marks of a Kineto RawWindow (the CPU ones on its training thread, or on any
    CPU thread when that has none; the GPU ones per device)."""
    m = raw.meta
    kind, name_id, tid, dev = raw.col("kind"), raw.col("name_id"), raw.col("tid"), raw.col("device")
    start, end = raw.col("start_ns"), raw.col("end_ns")
    ids = {i: int(mt.group(1)) for i, n in enumerate(raw.names) if (mt := _STEP.match(n))}
    cpu: dict[int, tuple[int, int]] = {}
    gpu: dict[int, dict[int, tuple[int, int]]] = {}
    if ids:
        rows = np.flatnonzero(np.isin(name_id, list(ids)) & ((kind == int(EventKind.ANNOTATION)) | (dev >= 0)))
        on_cpu = rows[dev[rows] < 0]
        main = on_cpu[tid[on_cpu] == m.training_tid]
        for i in main if len(main) else on_cpu:
            _widen(cpu, ids[int(name_id[i])], int(start[i]), int(end[i]))
        for i in rows[dev[rows] >= 0]:
            _widen(gpu.setdefault(int(dev[i]), {}), ids[int(name_id[i])], int(start[i]), int(end[i]))
    return StepMarks(m.rank, m.host, m.window_start_ns, m.window_end_ns, cpu, gpu)


def _widen(into: dict[int, tuple[int, int]], step: int, lo: int, hi: int) -> None:
    old = into.get(step)
    into[step] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))


def plan_cuts(marks: list[StepMarks]) -> Cuts:
    """The cut of each rank so that all compare the same work (module doc)."""
    if len(marks) < 2:
        return Cuts({})
    if all(mk.cpu for mk in marks):
        return _by_steps(marks)
    hosts = {mk.host for mk in marks}
    if len(hosts) != 1 or "" in hosts:
        return Cuts({}, "ranks not aligned: some traces have no ProfilerStep marks and they come from "
                        f"{'different hosts' if len(hosts) > 1 else 'unnamed hosts'} (no shared clock); "
                        "each rank's whole trace is compared", usual=True)
    lo = max(mk.window_start_ns for mk in marks)
    hi = min(mk.window_end_ns for mk in marks)
    if hi <= lo:
        return Cuts({}, "ranks not aligned: their traces do not overlap in time (one host, no ProfilerStep marks)")
    by_rank = {mk.rank: Cut(lo, hi) for mk in marks if mk.window_start_ns < lo or mk.window_end_ns > hi}
    if not by_rank:
        return Cuts({})
    cut_ms = {r: _ms(max(0, lo - mk.window_start_ns) + max(0, mk.window_end_ns - hi))
              for mk in marks if (r := mk.rank) in by_rank}
    text = ", ".join(f"rank {r} {v:.1f} ms" for r, v in sorted(cut_ms.items()))
    return Cuts(by_rank, f"ranks cut to the time all traces cover ({_ms(hi - lo):.1f} ms, no ProfilerStep "
                         f"marks, one host): {text}")


def _by_steps(marks: list[StepMarks]) -> Cuts:
    common = set.intersection(*(set(mk.cpu) for mk in marks))
    if not common:
        each = _some([f"rank {mk.rank} {_steps(sorted(mk.cpu))}" for mk in sorted(marks, key=_rank)], "; ")
        return Cuts({}, f"ranks not aligned: no ProfilerStep number is recorded by every rank ({each}); "
                        "each rank's whole trace is compared")
    first, last = min(common), max(common)
    keep = sorted(common)
    by_rank: dict[int, Cut] = {}
    dropped: list[str] = []
    for mk in sorted(marks, key=_rank):
        extra = sorted(set(mk.cpu) - common)
        if not extra:
            continue
        lo, hi = mk.cpu[first][0], mk.cpu[last][1]
        gpu = {d: (min(s[n][0] for n in keep if n in s), max(s[n][1] for n in keep if n in s))
               for d, s in mk.gpu.items() if any(n in s for n in keep)}
        iteration_ms = tuple(_ms(mk.cpu[n][1] - mk.cpu[n][0]) for n in keep)
        by_rank[mk.rank] = Cut(lo, hi, gpu, tuple(keep), iteration_ms)
        dropped.append(f"rank {mk.rank} {_steps(extra)}")
    if not by_rank:
        return Cuts({})
    return Cuts(by_rank, f"ranks compared over the steps all recorded ({_steps(keep)}); cut: " + _some(dropped, ", "))


def _rank(mk: StepMarks) -> int:
    return mk.rank


def _ms(ns: int) -> float:
    return ns / 1e6


def _steps(nums: list[int]) -> str:
    """'step 3', 'steps 2-5', 'steps 2, 4, 7'."""
    if len(nums) == 1:
        return f"step {nums[0]}"
    if nums == list(range(nums[0], nums[-1] + 1)):
        return f"steps {nums[0]}-{nums[-1]}"
    return "steps " + _some(list(map(str, nums)), ", ")


def _some(items: list[str], sep: str, most: int = 6) -> str:
    """The first ``most`` items and how many more: a note stays one line on 64 ranks."""
    more = f"{sep}... ({len(items) - most} more)" if len(items) > most else ""
    return sep.join(items[:most]) + more


def cut_window(raw: RawWindow, cut: Cut) -> RawWindow:
    """``raw`` restricted to ``cut``: rows that end before its start or begin after its end are
    dropped, rows across a bound are clipped to it; the window, its step times and its communication
    rows follow."""
    dev, start, end = raw.col("device"), raw.col("start_ns"), raw.col("end_ns")
    lo = np.full(len(raw), cut.start_ns, dtype=np.int64)
    hi = np.full(len(raw), cut.end_ns, dtype=np.int64)
    for d, (glo, ghi) in cut.gpu.items():
        on = dev == d
        lo[on], hi[on] = glo, ghi
    keep = (end >= lo) & (start <= hi)
    cols = {k: np.asarray(v)[keep] for k, v in raw.columns.items()}
    cols["start_ns"] = np.maximum(start[keep], lo[keep]).astype(start.dtype)
    cols["end_ns"] = np.minimum(end[keep], hi[keep]).astype(end.dtype)
    w_lo = min([cut.start_ns, *(b[0] for b in cut.gpu.values())])
    w_hi = max([cut.end_ns, *(b[1] for b in cut.gpu.values())])
    comm = tuple((c[0], max(c[1], w_lo), min(c[2], w_hi), *c[3:]) for c in raw.meta.comm
                 if c[2] >= w_lo and c[1] <= w_hi)
    meta = replace(raw.meta, window_start_ns=w_lo, window_end_ns=w_hi, comm=comm,
                   iteration_ms=cut.iteration_ms if cut.steps else raw.meta.iteration_ms)
    return RawWindow(meta=meta, columns=cols, names=raw.names, stacks=raw.stacks)
