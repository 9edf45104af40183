"""Build small RawWindows by hand for summarizer tests."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from perftracker.model.raw_window import (
    COLUMNS,
    EventKind,
    RawWindow,
    SampleSet,
    UtilSeries,
    WindowMeta,
)

TRAIN_TID = 100


def raw_window(events: Sequence[tuple[EventKind, str, int, int, int] | tuple[EventKind, str, int, int, int, int]],
               window: tuple[int, int] = (0, 1000), training_tid: int = TRAIN_TID, rank: int = 0) -> RawWindow:
    """events: (kind, name, tid, start_ns, end_ns[, device])."""
    names: dict[str, int] = {}
    rows = []
    for ev in events:
        kind, name, tid, s, e = ev[:5]
        dev = ev[5] if len(ev) > 5 else -1
        rows.append((int(kind), names.setdefault(name, len(names)), tid, dev, s, e, -1, -1))
    cols = {}
    for j, (col, dtype) in enumerate(COLUMNS.items()):
        cols[col] = np.array([r[j] for r in rows], dtype=dtype)
    meta = WindowMeta(job="j", session="s", rank=rank, world_size=1, host="h", pid=1, training_tid=training_tid,
                      window_start_ns=window[0], window_end_ns=window[1])
    return RawWindow(meta=meta, columns=cols, names=tuple(names))


def samples(resource: str, period_ns: int, values: Sequence[float], t0_ns: int = 0) -> SampleSet:
    """Samples whose i-th value covers (t0 + i*period, t0 + (i+1)*period]."""
    t = t0_ns + period_ns * np.arange(1, len(values) + 1, dtype=np.int64)
    return SampleSet({resource: UtilSeries(resource, t, np.asarray(values, dtype=np.float32), period_ns, "fixture")})


def by_key(ps):  # type: ignore[no-untyped-def]
    return {p.key: p for p in ps.patterns}
