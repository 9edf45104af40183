"""Victims must not be blamed: recognise a CPU DDP rank's wait for its peers.

On a CPU (gloo) DDP job, the DDP reducer launches each bucket's allreduce asynchronously from an
autograd hook (a short ``c10d::allreduce_`` op), and at the end of the backward pass
(``finalize_backward``, run by the autograd engine) it blocks until every bucket's allreduce is
done, then copies the buckets back (``...reducer::copy_bucket_to_grad``). That block records no
op: it is self time of ``<built-in method run_backward ...>`` on the training thread, and the gloo
threads record nothing. So a rank that waits for a slow peer looks like it spends its time in
Python.

The rule, structural and therefore usable offline too: inside each autograd-engine call on the
training thread, the time from the end of the last collective launch to the first
``copy_bucket_to_grad`` after it (or to the end of the engine call when there is none) is the
reducer's wait. It becomes an event of its own, ``REDUCER_WAIT``, in the collective category; the
ops that still run inside that interval (the last gradients, the copies) nest under it and keep
their own time. Without collectives inside the engine call (no DDP, ``no_sync``) nothing changes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from agent import categories as cat
from perftracker.rawdata import EventKind, RawWindow

REDUCER_WAIT = "ddp.reducer::wait (allreduce, in autograd engine)"
# the engine call: torch's Python tracer records the C builtin; a stack sampler sees only the
# innermost Python frame that calls it
_ENGINE = re.compile(r"(^<built-in method run_backward of |\): _engine_run_backward$)")
_FINALIZE = re.compile(r"reducer::copy_bucket_to_grad$")


@dataclass(frozen=True)
class ExtraEvents:
    name: str
    start_ns: np.ndarray
    end_ns: np.ndarray


def _match(names: list[str], pattern: re.Pattern[str]) -> np.ndarray:
    return np.array([bool(pattern.search(x)) for x in names] or [False], dtype=bool)


def add_reducer_waits(kind: np.ndarray, name_id: np.ndarray, names: list[str], role: np.ndarray, tid: np.ndarray,
                      start_ns: np.ndarray, end_ns: np.ndarray, training_tid: int) -> ExtraEvents:
    """The reducer-wait intervals of one CPU window (see the module doc)."""
    empty = ExtraEvents(REDUCER_WAIT, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    on_t = tid == training_tid
    engine = np.flatnonzero(on_t & (kind == EventKind.PYTHON) & _match(names, _ENGINE)[name_id])
    coll = np.flatnonzero(on_t & (kind == EventKind.CPU_OP) & (role == cat.COLLECTIVE))
    if len(engine) == 0 or len(coll) == 0:
        return empty
    fin = np.flatnonzero(on_t & (kind == EventKind.CPU_OP) & _match(names, _FINALIZE)[name_id])
    coll = coll[np.argsort(start_ns[coll], kind="stable")]
    c_start, c_end = start_ns[coll], np.maximum.accumulate(end_ns[coll])
    e_start, e_end = start_ns[engine], end_ns[engine]
    k = np.searchsorted(c_start, e_end, side="left") - 1
    ok = k >= 0
    kk = np.maximum(k, 0)
    ok &= c_start[kk] >= e_start
    w_start = c_end[kk]
    w_end = e_end.copy()
    if len(fin):
        f_start = np.sort(start_ns[fin])
        j = np.searchsorted(f_start, w_start, side="left")
        jj = np.minimum(j, len(f_start) - 1)
        has = (j < len(f_start)) & (f_start[jj] < e_end)
        w_end = np.where(has, f_start[jj], e_end)
    ok &= w_end > w_start
    # nested engine frames (the Python wrapper and the builtin) give one wait: keep the innermost
    ws, we = w_start[ok].astype(np.int64), w_end[ok].astype(np.int64)
    order = np.lexsort((we, ws))
    ws, we = ws[order], we[order]
    first = np.r_[True, ws[1:] != ws[:-1]] if len(ws) else np.zeros(0, dtype=bool)
    return ExtraEvents(REDUCER_WAIT, ws[first], we[first])


def reducer_wait_intervals(raw: RawWindow) -> tuple[np.ndarray, np.ndarray]:
    """The reducer-wait intervals ``summarize_window`` attributes to the collective category
    (empty on GPU windows, where NCCL kernel time carries the wait)."""
    kind = raw.col("kind").astype(np.int64)
    if np.isin(kind, (EventKind.KERNEL, EventKind.MEMCPY, EventKind.MEMSET)).any():
        z = np.zeros(0, dtype=np.int64)
        return z, z
    names = [cat.normalize_name(x) for x in raw.names]
    name_id = raw.col("name_id").astype(np.int64)
    role = cat.classify(kind, name_id, tuple(names), gpu=False).astype(np.int64)
    extra = add_reducer_waits(kind, name_id, names, role, raw.col("tid").astype(np.int64),
                              raw.col("start_ns").astype(np.int64), raw.col("end_ns").astype(np.int64),
                              raw.meta.training_tid)
    return extra.start_ns, extra.end_ns
