"""Summarize one worker's raw window into its PatternSet (docs/design.md section 5).

Pipeline, all numpy over whole columns:
  categorize (perftracker.agent.summarize.categories) -> recognise DDP reducer waits (perftracker.agent.summarize.victims)
  -> nest per thread/stream and cut self-time segments (perftracker.agent.summarize.timeline)
  -> critical-path sweep (perftracker.agent.summarize.critical_path) -> (β, μ, σ) per function (perftracker.agent.summarize.patterns)

Command line (one core, run by the agent as a subprocess)::

    python -m perftracker.agent.daemon.summarize_one RAW_FILE [--samples FILE] --out PATTERNS_FILE [--max-zero-run C]

writes ``PatternSet.to_bytes()`` (or JSON when PATTERNS_FILE ends in ``.json``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from perftracker.agent.summarize import categories as cat
from perftracker.agent.summarize.critical_path import critical_ns
from perftracker.agent.summarize.groups import (
    shared_names,
    split_shared,
    step_bounds,
    steps_ms,
    worker_groups,
)
from perftracker.agent.summarize.hardware import (
    clock_patterns,
    ib_wait_pattern,
    link_series,
    p2p_pattern,
)
from perftracker.agent.summarize.patterns import DEFAULT_MAX_ZERO_RUN, utilization
from perftracker.agent.summarize.step_record import step_record
from perftracker.agent.summarize.timeline import (
    Nesting,
    Segments,
    nest,
    self_segments,
    stack_ids,
    stack_names,
    wait_intervals,
)
from perftracker.agent.summarize.victims import add_reducer_waits, split_steady_and_varying

from perftracker.errors import InputError
from perftracker.model import LINK_KEY, Pattern, PatternSet
from perftracker.model.raw_window import (
    CPU_WAIT,
    TCP_RETRANS,
    EventKind,
    RawWindow,
    SampleSet,
    UtilSeries,
)

log = logging.getLogger(__name__)

GC_KEY = "Python GC"


@dataclass(frozen=True)
class SummarizeOptions:
    max_zero_run: int = DEFAULT_MAX_ZERO_RUN  # c of Algorithm 1, in samples
    beta_floor: float = 1e-4  # functions below this share of the window are dropped
    max_patterns: int = 256  # at most this many functions, highest β first
    max_bytes: int = 10_000  # PatternSet.to_bytes() budget per worker
    attribute_reducer_wait: bool = True  # CPU jobs: DDP reducer wait inside run_backward -> collective
    split_late_peers: bool = True  # its part that varies between iterations -> LATE_PEERS_WAIT (victims.py)
    cpu_wait: bool = True  # the training thread's waits for a core -> CPU_WAIT_KEY (from the cpu_wait samples)
    local_world_size: int = 0  # ranks per host; 0: the window's own (WindowMeta.local_world_size)


# resource series per category, first present wins: (GPU window, CPU-only window)
_RESOURCES: dict[int, tuple[tuple[str, ...], tuple[str, ...]]] = {
    cat.COMPUTE: (("sm",), ("cpu",)),
    cat.MEMORY: (("pcie", "mem"), ("mem",)),
    cat.COLLECTIVE: (("nvlink", "nic"), ("nic",)),
    cat.PYTHON: (("cpu",), ("cpu",)),
}


def pick_series(level: int, gpu: bool, samples: SampleSet | None) -> UtilSeries | None:
    if samples is None:
        return None
    for name in _RESOURCES[level][0 if gpu else 1]:
        s = samples.get(name)
        if s is not None and len(s.t_ns):
            return s
    return None


def _series_choices(raw: RawWindow, kept: np.ndarray, level_f: np.ndarray, gpu: bool, samples: SampleSet | None,
                    local_world_size: int, key_of: Callable[[int], str]
                    ) -> list[tuple[int, np.ndarray, list[UtilSeries]]]:
    """(level, functions, candidate series) to measure μ/σ against. A GPU window's collectives are
    measured against their link (``perftracker.agent.summarize.hardware.link_series``): the NIC for a
    group that spans hosts, NVLink or PCIe peer-to-peer inside a host (the one with more traffic)."""
    out: list[tuple[int, np.ndarray, list[UtilSeries]]] = []
    if samples is None:
        return out
    for level in range(cat.N_LEVELS):
        sel = kept & (level_f == level)
        if not sel.any():
            continue
        if level != cat.COLLECTIVE or not gpu:
            series = pick_series(level, gpu, samples)
            if series is not None:
                out.append((level, sel, [series]))
            continue
        members = {g[0]: g[2] for g in raw.meta.process_groups}
        comm: dict[str, set[str]] = {}
        for c in raw.meta.comm:
            comm.setdefault(cat.normalize_name(c[0]), set()).add(c[3])
        by_names: dict[tuple[str, ...], list[int]] = {}
        for f in np.flatnonzero(sel).tolist():
            groups = [members.get(g, ()) for g in sorted(comm.get(key_of(f), ()))]
            by_names.setdefault(link_series(samples, groups, local_world_size, raw.meta.rank), []).append(f)
        for names, funcs in by_names.items():
            present = [s for s in (samples.get(n) for n in names) if s is not None and len(s.t_ns)]
            if not present:
                continue
            if names != ("nvlink", "pcie"):  # inside a host both links are candidates, else the first present
                present = present[:1]
            m = np.zeros(len(sel), dtype=bool)
            m[funcs] = True
            out.append((level, m, present))
    return out


# sweep priorities: the four categories, with non-GC Python frames one level below a GC pause, and
# the training thread's waits for a core above everything that thread runs (see _sweep_priority)
N_PRIORITIES = cat.N_LEVELS + 2
CPU_WAIT_KEY = "CPU wait (runnable, no core)"


@dataclass(frozen=True)
class Frames:
    """One window's critical-path functions as the summarizer sees them: the events with a role
    (and the reducer waits it adds), nested per thread/stream and cut into self-time segments."""

    row: np.ndarray  # the raw window row of each frame; -1 for an added reducer-wait event
    kind: np.ndarray
    name_id: np.ndarray  # into names
    role: np.ndarray  # category level 0..3 (perftracker.agent.summarize.categories)
    tid: np.ndarray  # the thread timeline it nests on (a GPU autograd thread joins the training thread)
    device: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    stack_id: np.ndarray  # the producer's recorded Python stack (raw.stacks), -1 for none
    names: list[str]  # normalized names, then those of the added events
    gpu: bool  # the window has GPU kernels
    nesting: Nesting
    segments: Segments  # self time; owner indexes the frames
    priority: np.ndarray  # sweep level per frame, 0..N_PRIORITIES-1: a GC pause outranks Python frames
    is_wait: np.ndarray  # the frame is a CPU wait from the samples (CPU_WAIT_KEY), not a recorded event


def window_frames(raw: RawWindow, options: SummarizeOptions | None = None,
                  samples: SampleSet | None = None) -> Frames:
    """Assign a window's events to critical-path roles and cut their self-time segments.

    The summarizer's one rule (``summarize_window`` sweeps these frames; ``perftracker
    export-trace`` draws them): categorize, join a GPU trace's autograd threads to the training
    thread, recognise a CPU DDP rank's reducer waits, add the training thread's waits for a core
    (``samples``' ``cpu_wait`` series), nest per thread/stream."""
    opt = options or SummarizeOptions()
    meta = raw.meta
    kind = raw.col("kind").astype(np.int64)
    tid = raw.col("tid").astype(np.int64)
    device = raw.col("device").astype(np.int64)
    start = raw.col("start_ns").astype(np.int64)
    end = raw.col("end_ns").astype(np.int64)
    stack_col = raw.col("stack_id").astype(np.int64)
    row = np.arange(len(raw), dtype=np.int64)

    # one normalized name table (per-process addresses removed)
    norm_index: dict[str, int] = {}
    norm_of_name = np.array([norm_index.setdefault(cat.normalize_name(x), len(norm_index)) for x in raw.names]
                            or [0], dtype=np.int64)
    names = list(norm_index)
    name_id = norm_of_name[raw.col("name_id").astype(np.int64)] if len(raw) else np.zeros(0, dtype=np.int64)

    gpu = bool(np.isin(kind, (EventKind.KERNEL, EventKind.MEMCPY, EventKind.MEMSET)).any())
    role = cat.classify(kind, name_id, tuple(names), gpu).astype(np.int64)
    on_training = (tid == meta.training_tid) & (device < 0)
    has_python = bool(((kind == EventKind.PYTHON) & on_training).any())
    if gpu and not has_python:
        tid = _autograd_threads_join_training(kind, name_id, names, tid, device, meta.training_tid)
        on_training = (tid == meta.training_tid) & (device < 0)
    host_like = (role == cat.PYTHON) | (role == cat.HOST)
    role[host_like & ~on_training] = cat.SKIP
    role[role == cat.HOST] = cat.SKIP if has_python else cat.PYTHON
    role[(kind == EventKind.PYTHON) & ~on_training] = cat.SKIP

    cols = {"row": row, "kind": kind, "name_id": name_id, "role": role, "tid": tid, "device": device,
            "start": start, "end": end, "stack": stack_col, "wait": np.zeros(len(row), dtype=bool)}
    if opt.attribute_reducer_wait and not gpu:
        waits = add_reducer_waits(kind, name_id, names, role, tid, start, end, meta.training_tid)
        for extra in split_steady_and_varying(waits) if opt.split_late_peers else [waits]:
            if len(extra.start_ns):
                names.append(extra.name)
                _append_frames(cols, len(names) - 1, EventKind.CPU_OP, cat.COLLECTIVE, meta.training_tid,
                               extra.start_ns, extra.end_ns, is_wait=False)
    wait_series = samples.get(CPU_WAIT) if samples is not None and opt.cpu_wait else None
    if wait_series is not None:
        w_start, w_end = wait_intervals(wait_series)
        if len(w_start):
            names.append(CPU_WAIT_KEY)
            _append_frames(cols, len(names) - 1, EventKind.OTHER, cat.PYTHON if gpu else cat.COMPUTE,
                           meta.training_tid, w_start, w_end, is_wait=True)
    row, kind, name_id, role, tid = cols["row"], cols["kind"], cols["name_id"], cols["role"], cols["tid"]
    device, start, end, stack_col, is_wait = cols["device"], cols["start"], cols["end"], cols["stack"], cols["wait"]

    frames = np.flatnonzero((role >= 0) & (end > start))
    f_kind, f_role, f_start, f_end = kind[frames], role[frames], start[frames], end[frames]
    f_wait = is_wait[frames]
    group = (device[frames] + 2) * (1 << 40) + (tid[frames] & ((1 << 40) - 1))
    # GC pauses are leaves on a timeline of their own: nothing runs inside the collector, and a
    # sampled Python frame whose edge falls just inside a pause must not nest under it. CPU waits
    # too: they come from the samples, at 1 ms resolution, not from the thread's own timestamps.
    is_gc = f_kind == EventKind.GC
    group = np.where(is_gc, -1 - group, group)
    group = np.where(f_wait, -(1 << 62) + (tid[frames] & ((1 << 40) - 1)), group)
    nesting = nest(group, f_start, f_end)
    segs = self_segments(f_start, f_end, nesting.parent)
    priority = _sweep_priority(f_role, is_gc, f_wait, gpu)
    return Frames(row=row[frames], kind=f_kind, name_id=name_id[frames], role=f_role, tid=tid[frames],
                  device=device[frames], start_ns=f_start, end_ns=f_end, stack_id=stack_col[frames], names=names,
                  gpu=gpu, nesting=nesting, segments=segs, priority=priority, is_wait=f_wait)


def _append_frames(cols: dict[str, np.ndarray], name_id: int, kind: EventKind, role: int, tid: int,
                   start_ns: np.ndarray, end_ns: np.ndarray, is_wait: bool) -> None:
    """Add frames the summarizer derives (reducer waits, CPU waits): no raw row, no device, no stack."""
    n = len(start_ns)
    for key, value in (("row", -1), ("kind", int(kind)), ("name_id", name_id), ("role", role), ("tid", tid),
                       ("device", -1), ("stack", -1), ("wait", is_wait)):
        cols[key] = np.r_[cols[key], np.full(n, value, dtype=cols[key].dtype)]
    cols["start"] = np.r_[cols["start"], np.asarray(start_ns, dtype=np.int64)]
    cols["end"] = np.r_[cols["end"], np.asarray(end_ns, dtype=np.int64)]


def _sweep_priority(role: np.ndarray, is_gc: np.ndarray, is_wait: np.ndarray, gpu: bool) -> np.ndarray:
    """The sweep level of each frame (0 wins), 0..N_PRIORITIES-1. Categories are unchanged.

    - A GC pause outranks the Python frames it interrupts: the frame on the stack does not run
      while the collector does.
    - A CPU wait outranks everything the training thread runs: while it waits, the op or frame on
      its stack makes no progress. On a CPU-only window that is every function (the wait comes
      first); on a GPU window it is the host side only (the wait comes after the device levels,
      whose kernels and copies go on while the host thread waits).
    """
    base = np.where((role == cat.PYTHON) & ~is_gc, cat.N_LEVELS, role)
    wait_level = cat.PYTHON if gpu else cat.COMPUTE
    return np.where(is_wait, wait_level, base + (base >= wait_level))


def summarize_window(raw: RawWindow, samples: SampleSet | None = None,
                     options: SummarizeOptions | None = None) -> PatternSet:
    """Reduce one worker's window to its behavior patterns."""
    opt = options or SummarizeOptions()
    meta = raw.meta
    window_ns = meta.window_end_ns - meta.window_start_ns
    if window_ns <= 0:
        raise InputError(f"raw window {meta.file or meta.session!r}: empty window "
                         f"[{meta.window_start_ns}, {meta.window_end_ns}]")
    raw = split_shared(raw)  # a collective kernel of several groups: one function per group
    fr = window_frames(raw, opt, samples)
    names, gpu, nesting, segs = fr.names, fr.gpu, fr.nesting, fr.segments
    f_kind, f_name, f_role = fr.kind, fr.name_id, fr.role
    n_frames = len(f_kind)
    crit = critical_ns(segs.start_ns, segs.end_ns, fr.priority[segs.owner], meta.window_start_ns,
                       meta.window_end_ns, n_levels=N_PRIORITIES)
    crit_of_frame = np.bincount(segs.owner, weights=crit, minlength=n_frames)

    # function identity: Python frames by whole stack, everything else by name
    member = (f_role == cat.PYTHON) & (f_kind != EventKind.GC) & ~fr.is_wait
    sid, table = stack_ids(nesting.parent, nesting.depth, f_name, member)
    f_stack = fr.stack_id
    n_stacks = len(table)
    func_raw = np.where(member, sid, n_stacks + f_name)
    func_raw = np.where(f_kind == EventKind.GC, n_stacks + len(names), func_raw)
    ext_stacks = member & (f_stack >= 0)  # the producer recorded the Python stack itself
    if ext_stacks.any():
        func_raw = np.where(ext_stacks, n_stacks + len(names) + 1 + f_stack, func_raw)
    funcs, func_of_frame = np.unique(func_raw, return_inverse=True)
    func_of_frame = func_of_frame.reshape(-1)
    n_funcs = len(funcs)
    crit_f = np.bincount(func_of_frame, weights=crit_of_frame, minlength=n_funcs)
    execs_f = np.bincount(func_of_frame, minlength=n_funcs)
    level_f = np.full(n_funcs, cat.PYTHON, dtype=np.int64)
    level_f[func_of_frame] = f_role
    beta_f = crit_f / window_ns

    keep = np.flatnonzero(beta_f >= opt.beta_floor)
    keep = keep[np.argsort(-beta_f[keep], kind="stable")][: opt.max_patterns]

    def key_of(f: int) -> tuple[str, str]:
        code = int(funcs[f])
        if code < n_stacks:
            frames_ = stack_names(code, table, names)
            return ";".join(frames_), frames_[-1]
        code -= n_stacks
        if code < len(names):
            return names[code], names[code]
        if code == len(names):
            return GC_KEY, GC_KEY
        st = raw.stacks[code - len(names) - 1]
        frames_ = [cat.normalize_name(raw.names[i]) for i in st]
        return ";".join(frames_), frames_[-1] if frames_ else "?"

    mu_f = np.zeros(n_funcs)
    sigma_f = np.zeros(n_funcs)
    resource_f = [""] * n_funcs
    kept_mask = np.zeros(n_funcs, dtype=bool)
    kept_mask[keep] = True
    # a CPU wait is time the thread did not run: μ = σ = 0 by definition, not a property of the
    # samples (a sub-millisecond wait shares its samples with the run around it)
    wait_f = np.zeros(n_funcs, dtype=bool)
    wait_f[func_of_frame[fr.is_wait]] = True
    lws = opt.local_world_size or meta.local_world_size
    for _level, sel_funcs, candidates in _series_choices(raw, kept_mask & ~wait_f, level_f, gpu, samples, lws,
                                                        lambda f: key_of(f)[0]):
        seg_sel = sel_funcs[func_of_frame[segs.owner]]
        func_map = np.where(sel_funcs[func_of_frame], func_of_frame, -1)
        best = np.full(n_funcs, -1.0)
        for series in candidates:  # inside a host: the link that carried the traffic (NVLink or PCIe p2p)
            util = utilization(func_map, n_funcs, segs.owner[seg_sel], segs.start_ns[seg_sel],
                               segs.end_ns[seg_sel], series, opt.max_zero_run)
            better = sel_funcs & (util.mu > best)
            best[better] = util.mu[better]
            mu_f[better] = util.mu[better]
            sigma_f[better] = util.sigma[better]
            for f in np.flatnonzero(better).tolist():
                resource_f[f] = series.resource

    patterns = []
    for f in keep.tolist():
        key, label = key_of(f)
        patterns.append(Pattern(
            key=key, category=cat.CATEGORY_OF_LEVEL[int(level_f[f])], beta=float(min(beta_f[f], 1.0)),
            mu=float(mu_f[f]), sigma=float(sigma_f[f]), label=label, executions=int(execs_f[f]),
            critical_ns=int(round(crit_f[f])), resource=resource_f[f]))
    collective_ns = float(crit_f[level_f == cat.COLLECTIVE].sum())
    compute = (fr.role == cat.COMPUTE) & ~fr.is_wait
    coll = fr.role == cat.COLLECTIVE
    remote = coll & np.isin(func_of_frame, [f for f in range(n_funcs) if resource_f[f] == "nic"])
    remote = remote if remote.any() else coll
    health = [h for h in (link_pattern(samples, collective_ns, window_ns),
                          ib_wait_pattern(samples, fr.start_ns[remote], fr.end_ns[remote], float(crit_f[np.unique(
                              func_of_frame[remote])].sum()) if remote.any() else 0.0, meta.window_start_ns,
                                          meta.window_end_ns)) if h is not None]
    if gpu:
        inside = (fr.role == cat.COLLECTIVE) & np.isin(func_of_frame, [f for f in range(n_funcs)
                                                                         if resource_f[f] in ("nvlink", "pcie")])
        p2p = p2p_pattern(samples, fr.start_ns[inside], fr.end_ns[inside], float(crit_f[np.unique(
            func_of_frame[inside])].sum()) if inside.any() else 0.0, window_ns)
        health += [p2p] if p2p is not None else []
        health += clock_patterns(samples, fr.start_ns[compute], fr.end_ns[compute],
                                 float(crit_f[level_f == cat.COMPUTE].sum()), meta.window_start_ns, meta.window_end_ns)
    if health:
        patterns.extend(health)
        patterns.sort(key=lambda p: -p.beta)
    ps = _with_groups(_pattern_set(raw, tuple(patterns), gpu), raw, fr)
    return _fit_budget(ps, opt.max_bytes)


def _with_groups(ps: PatternSet, raw: RawWindow, fr: Frames) -> PatternSet:
    """The worker's process groups, its collectives' groups and its compute per step
    (``perftracker.agent.summarize.groups``)."""
    meta = raw.meta
    normalize = {n: cat.normalize_name(n) for n in {c[0] for c in meta.comm} | set(shared_names(meta).values())}
    groups, comm = worker_groups(meta, normalize)
    kind = raw.col("kind")
    annotations = np.flatnonzero((kind == EventKind.ANNOTATION) & (raw.col("device") < 0))
    marks = [i for i in annotations.tolist() if raw.names[int(raw.col("name_id")[i])].startswith("ProfilerStep#")]
    step_marks = np.stack([raw.col("start_ns")[marks], raw.col("end_ns")[marks]], axis=1) if marks else \
        np.zeros((0, 2), dtype=np.int64)
    compute = (fr.role == cat.COMPUTE) & ~fr.is_wait
    bounds, cut_by = step_bounds(meta, groups, step_marks)
    steps, step_group = steps_ms(bounds, cut_by, fr.start_ns[compute], fr.end_ns[compute])
    try:  # optional: a record that cannot be made loses the replay (the estimate stays), never the window
        record = step_record(raw, bounds, fr.start_ns[compute], fr.end_ns[compute])
    except (ValueError, IndexError, KeyError) as exc:
        log.warning("rank %d: no step record (%s: %s); what fixing a culprit saves will be estimated",
                    meta.rank, type(exc).__name__, exc)
        record = None
    if not groups and not comm and not steps and record is None:
        return ps
    return dataclasses.replace(ps, groups=groups, comm=comm, steps_ms=steps, step_group=step_group,
                               step_record=record)


def link_pattern(samples: SampleSet | None, collective_ns: float, window_ns: int) -> Pattern | None:
    """The host link's health as one more collective pattern (``LINK_KEY``), when the samples have
    the window's TCP retransmitted share (``perftracker.agent.samplers.tcp``).

    β is the share of the window the rank spends in collectives on the critical path (what the link
    can slow down: it overlaps those functions, it is not a function of its own), μ the retransmitted
    share of TCP segments, σ 0. The expected range bounds μ (``localizer/diagnose/method/expected.toml``); without
    collectives on the critical path (β = 0) a lossy link explains no slowdown and the rule's
    β > β_min keeps it quiet.
    """
    series = samples.get(TCP_RETRANS) if samples is not None else None
    if series is None or not len(series.value):
        return None
    return Pattern(key=LINK_KEY, category=cat.CATEGORY_OF_LEVEL[cat.COLLECTIVE],
                   beta=float(min(collective_ns / window_ns, 1.0)), mu=float(np.clip(series.value[-1], 0.0, 1.0)),
                   sigma=0.0, label=LINK_KEY, executions=0, critical_ns=int(round(collective_ns)),
                   resource=TCP_RETRANS)


_AUTOGRAD_OP = "autograd::engine::evaluate_function: "


def _autograd_threads_join_training(kind: np.ndarray, name_id: np.ndarray, names: list[str], tid: np.ndarray,
                                    device: np.ndarray, training_tid: int) -> np.ndarray:
    """On a GPU trace without Python stacks, move the autograd engine's device threads onto the
    training thread's timeline (a copy of ``tid`` is returned).

    For CUDA tensors ``run_backward`` hands the graph to a device thread of the autograd engine and
    blocks until it is done: the backward's host work (the ops that launch the kernels) is recorded
    on that thread, and the training thread only shows the enclosing annotation (``## backward ##``)
    with nothing inside it. Left apart, the whole backward pass is self time of that annotation, a
    host frame that takes the critical path whenever the GPU idles (dlrm: 17% of the window on every
    rank). The training thread does nothing else while it waits, so the device thread's events are
    its work: nested under the annotation they leave it only the gaps between the engine's ops. With
    Python stacks the enclosing frame is ``run_backward`` and host ops are transparent anyway.
    """
    ids = [i for i, x in enumerate(names) if x.startswith(_AUTOGRAD_OP)]
    if not ids:
        return tid
    cpu = device < 0
    engine_op = cpu & (kind == EventKind.CPU_OP) & np.isin(name_id, ids)
    threads = np.setdiff1d(np.unique(tid[engine_op]), [training_tid])
    if not len(threads):
        return tid
    out = tid.copy()
    out[cpu & np.isin(tid, threads)] = training_tid
    return out


def _pattern_set(raw: RawWindow, patterns: tuple[Pattern, ...], gpu: bool) -> PatternSet:
    m = raw.meta
    return PatternSet(job=m.job, session=m.session, rank=m.rank, world_size=m.world_size, host=m.host,
                      window_start_ns=m.window_start_ns, window_end_ns=m.window_end_ns, patterns=patterns,
                      local_rank=m.local_rank, pid=m.pid, source=m.source, gpu=gpu,
                      iteration_ms=tuple(m.iteration_ms))


def _fit_budget(ps: PatternSet, max_bytes: int) -> PatternSet:
    """Drop the lowest-β patterns until the compact form fits (patterns are sorted by β)."""
    if len(ps.to_bytes()) <= max_bytes:
        return ps
    if ps.step_record is not None:  # the patterns come first: the replay's record goes before any of them
        log.info("rank %d: step record left out to fit %d bytes", ps.rank, max_bytes)
        ps = dataclasses.replace(ps, step_record=None)
        if len(ps.to_bytes()) <= max_bytes:
            return ps
    ps = _fit_iterations(ps, max_bytes)
    if len(ps.to_bytes()) <= max_bytes:
        return ps
    lo, hi = 0, len(ps.patterns)  # lo fits, hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if len(_replace(ps, ps.patterns[:mid]).to_bytes()) <= max_bytes:
            lo = mid
        else:
            hi = mid
    log.warning("pattern set of rank %d trimmed from %d to %d functions to fit %d bytes",
                ps.rank, len(ps.patterns), lo, max_bytes)
    return _replace(ps, ps.patterns[:lo])


MIN_ITERATIONS_KEPT = 32  # the iteration times a pattern set keeps before any of its patterns goes


def _fit_iterations(ps: PatternSet, max_bytes: int) -> PatternSet:
    """Keep the window's last iteration times only, as many as fit beside every pattern (at least
    MIN_ITERATIONS_KEPT): a long offline window (thousands of steps) would otherwise push out the
    patterns themselves, the diagnosis, for times that only draw the step chart."""
    n = len(ps.iteration_ms)
    if n <= MIN_ITERATIONS_KEPT:
        return ps

    def keep(k: int) -> PatternSet:
        return dataclasses.replace(ps, iteration_ms=ps.iteration_ms[n - k:])

    lo, hi = MIN_ITERATIONS_KEPT, n  # keep(hi) does not fit (the caller's set); keep(lo) is the floor
    if len(keep(lo).to_bytes()) <= max_bytes:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if len(keep(mid).to_bytes()) <= max_bytes:
                lo = mid
            else:
                hi = mid
    log.info("rank %d: the last %d of %d iteration times kept to fit %d bytes", ps.rank, lo, n, max_bytes)
    return keep(lo)


def _replace(ps: PatternSet, patterns: tuple[Pattern, ...]) -> PatternSet:
    return dataclasses.replace(ps, patterns=patterns)
