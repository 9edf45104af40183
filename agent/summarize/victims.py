"""Victims must not be blamed: recognise a CPU DDP rank's wait for its peers.

On a CPU (gloo) DDP job, the DDP reducer launches each bucket's allreduce asynchronously from an
autograd hook (a short ``c10d::allreduce_`` op), and at the end of the backward pass
(``finalize_backward``, run by the autograd engine) it blocks until every bucket's allreduce is
done, then copies the buckets back (``...reducer::copy_bucket_to_grad``). That block records no
op: it is self time of ``<built-in method run_backward ...>`` on the training thread, and the gloo
threads record nothing. So a rank that waits for a slow peer looks like it spends its time in
Python.

The rule, structural and therefore usable offline too: inside each autograd-engine call on the
training thread, the time from the end of the last collective launch to the end of the last
``copy_bucket_to_grad`` after it (or to the end of the engine call when there is none) is the
reducer's wait. ``finalize_backward`` waits for the buckets one by one, copying each back before
waiting for the next, so with several buckets (DDP's first bucket is 1 MB) the wait continues
between the copies; ending it at the first copy left every later bucket's wait as Python self time
of the engine frame. It becomes an event of its own, ``REDUCER_WAIT``, in the collective category; the
ops that still run inside that interval (the last gradients, the copies) nest under it and keep
their own time. Without collectives inside the engine call (no DDP, ``no_sync``) nothing changes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
from perftracker.agent.summarize import categories as cat

from perftracker.model.raw_window import EventKind, RawWindow

REDUCER_WAIT = "ddp.reducer::wait (allreduce, in autograd engine)"
LATE_PEERS_WAIT = "ddp.reducer::wait, varying part (late peers, in autograd engine)"
STEADY_QUANTILE = 10.0  # percent: the steady part of a wait is what 90% of the window's waits reach
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
        w_end = _finalize_end(on_t & (kind == EventKind.CPU_OP), fin, start_ns, end_ns, w_start, e_end)
    ok &= w_end > w_start
    # nested engine frames (the Python wrapper and the builtin) give one wait: keep the innermost
    ws, we = w_start[ok].astype(np.int64), w_end[ok].astype(np.int64)
    order = np.lexsort((we, ws))
    ws, we = ws[order], we[order]
    first = np.r_[True, ws[1:] != ws[:-1]] if len(ws) else np.zeros(0, dtype=bool)
    return ExtraEvents(REDUCER_WAIT, ws[first], we[first])


def _finalize_end(op_mask: np.ndarray, fin: np.ndarray, start_ns: np.ndarray, end_ns: np.ndarray,
                  w_start: np.ndarray, e_end: np.ndarray) -> np.ndarray:
    """Where each wait ends: the end of the last bucket copy-back of the finalize that follows
    ``w_start``, clipped to the engine call's end ``e_end``; ``e_end`` when no copy follows.

    ``finalize_backward`` waits for the buckets one by one and copies each back before waiting for
    the next, so the wait goes on between the copies (the copies keep their own time). The
    finalize's copies are the run of ``copy_bucket_to_grad`` ops after the launch up to the first
    other op that is not nested in a copy. The run may end after the engine frame a stack sampler
    reports (its edges are exact only to a sampling period or a sampler gap); clipping to the frame
    then gives the whole frame after the launch to the wait.
    """
    f_order = np.argsort(start_ns[fin], kind="stable")
    f_start, f_end = start_ns[fin][f_order], end_ns[fin][f_order]
    ops = np.flatnonzero(op_mask)
    ops = ops[np.argsort(start_ns[ops], kind="stable")]
    o_start, o_end = start_ns[ops], end_ns[ops]
    is_fin = np.zeros(len(start_ns), dtype=bool)
    is_fin[fin] = True
    # nested in a copy: inside the latest-reaching copy that started at or before it
    j = np.searchsorted(f_start, o_start, side="right") - 1
    reach = np.maximum.accumulate(f_end)
    inside = (j >= 0) & (reach[np.maximum(j, 0)] >= o_end)
    other = ~is_fin[ops] & ~inside
    other_start = o_start[other]
    nxt = np.searchsorted(other_start, w_start, side="right")  # first other op starting after the launch
    t_next = np.where(nxt < len(other_start), other_start[np.minimum(nxt, max(len(other_start) - 1, 0))],
                      np.iinfo(np.int64).max)
    last = np.searchsorted(f_start, t_next, side="left") - 1  # the last copy before it
    lc = np.maximum(last, 0)
    has = (last >= 0) & (f_start[lc] >= w_start)
    return np.where(has, np.minimum(f_end[lc], e_end), e_end)


def split_steady_and_varying(waits: ExtraEvents, quantile: float = STEADY_QUANTILE) -> list[ExtraEvents]:
    """Split each reducer wait into its steady part (``REDUCER_WAIT``) and the rest (``LATE_PEERS_WAIT``).

    A rank's wait at the gradient allreduce is the exposed communication plus the time until its
    latest peer arrives. The communication, and a peer that is late in every iteration (a slow rank),
    are there in (nearly) every iteration; a peer that is late only now and then (host contention,
    jitter: each rank of a clean job on shared cores is the late one in turn) adds a part that varies
    from iteration to iteration. The steady part is the ``quantile``-th percentile of the window's
    wait durations (what 90% of the waits reach, robust to a rare short one); each wait's last
    steady-part nanoseconds stay ``REDUCER_WAIT`` and the time before them becomes
    ``LATE_PEERS_WAIT``. With one wait, or waits of equal length, nothing is split.
    """
    s, e = waits.start_ns, waits.end_ns
    if len(s) == 0:
        return [waits]
    d = e - s
    steady = int(np.percentile(d, quantile, method="lower"))
    cut = e - np.minimum(d, steady)
    vary = cut > s
    return [ExtraEvents(REDUCER_WAIT, cut, e), ExtraEvents(LATE_PEERS_WAIT, s[vary], cut[vary])]


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
