"""The timing graph: time points (nodes) joined by "no earlier than" edges, solved forward.

A node is one event boundary (an event's start or end). An edge ``u -> v`` with weight ``w`` says
``t(v) >= t(u) + w``. Every edge has two weights: ``w0``, the one that explains the input, and
``w``, the same edge after a fault changed it (a kernel's duration times a factor, a stall added
to a CPU gap). Each node keeps its *residual*

    r(v) = t_in(v) - max over in-edges (t_in(u) + w0)

the part of its recorded time that no modelled dependency explains (launch latency, scheduler
noise, clock offsets between ranks). The forward pass is

    t_out(v) = max over in-edges (t_out(u) + w) + r(v)

in topological order, and a node without in-edges keeps its input time. With ``w == w0`` this
reproduces the input exactly; a delay on a dependency that was not binding in the input is
absorbed by that edge's slack, and one on the binding dependency moves ``v`` by the same amount.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from perftracker.errors import PerftrackerError


class TimingCycleError(PerftrackerError):
    """The dependencies of a trace set form a cycle (contradictory input)."""


# edge kinds
DURATION = 0  # a GPU event's start -> its end
STREAM = 1  # previous event on a CUDA stream -> next
LAUNCH = 2  # runtime launch call start -> the GPU event it launched
WAIT = 3  # cudaStreamWaitEvent, or a launch-less rank's recorded cross-stream order: work on another stream -> a GPU event
CHAIN = 4  # previous CPU time point of the process -> next (the host's own work)
SYNC = 5  # GPU work -> end of the synchronizing runtime call that waits for it
TRANSFER = 6  # every member's start -> each member's end of one collective instance
KIND_NAMES = ("duration", "stream", "launch", "wait", "chain", "sync", "transfer")


@dataclass
class EdgeList:
    """Edges as parallel lists while a graph is being built."""

    src: list[int] = field(default_factory=list)
    dst: list[int] = field(default_factory=list)
    w0: list[float] = field(default_factory=list)
    kind: list[int] = field(default_factory=list)

    def add(self, u: int, v: int, w0: float, kind: int) -> int:
        self.src.append(u)
        self.dst.append(v)
        self.w0.append(float(w0))
        self.kind.append(kind)
        return len(self.src) - 1


@dataclass(frozen=True)
class TimingGraph:
    t_in_us: np.ndarray  # float64, per node, relative to the job's first timestamp
    src: np.ndarray  # int64, per edge
    dst: np.ndarray
    w0_us: np.ndarray  # float64, per edge: the weight that explains the input
    kind: np.ndarray  # int8, per edge

    @classmethod
    def from_edges(cls, t_in_us: np.ndarray, edges: EdgeList) -> TimingGraph:
        return cls(np.asarray(t_in_us, dtype=np.float64), np.asarray(edges.src, dtype=np.int64),
                   np.asarray(edges.dst, dtype=np.int64), np.asarray(edges.w0, dtype=np.float64),
                   np.asarray(edges.kind, dtype=np.int8))

    @property
    def n_nodes(self) -> int:
        return int(self.t_in_us.shape[0])


def residuals(g: TimingGraph) -> tuple[np.ndarray, np.ndarray]:
    """Per node: the residual r(v) and whether the node has in-edges."""
    base = np.full(g.n_nodes, -np.inf)
    np.maximum.at(base, g.dst, g.t_in_us[g.src] + g.w0_us)
    has_in = np.isfinite(base)
    return np.where(has_in, g.t_in_us - np.where(has_in, base, 0.0), 0.0), has_in


def topological_order(g: TimingGraph) -> np.ndarray:
    """Kahn's order of the nodes; TimingCycleError if the edges form a cycle."""
    n = g.n_nodes
    indeg = np.bincount(g.dst, minlength=n).tolist()
    order_e = np.argsort(g.src, kind="stable")
    dst_sorted = g.dst[order_e].tolist()
    starts = np.searchsorted(g.src[order_e], np.arange(n + 1)).tolist()
    # seed in input-time order so ties resolve the way the input ran
    ready = [int(v) for v in np.argsort(g.t_in_us, kind="stable") if indeg[v] == 0]
    ready.reverse()
    out: list[int] = []
    while ready:
        u = ready.pop()
        out.append(u)
        for i in range(starts[u], starts[u + 1]):
            v = dst_sorted[i]
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    if len(out) != n:
        raise TimingCycleError(f"the trace dependencies form a cycle ({n - len(out)} of {n} time points unreachable)")
    return np.asarray(out, dtype=np.int64)


def acyclic_edges(g: TimingGraph) -> np.ndarray:
    """Per edge: whether to keep it so that the graph has no cycle. Kahn's order; where it stalls
    (every node left waits for another one left), the stalled node with the earliest input time
    loses its in-edges from the nodes left: those come from time points no earlier than it, so they
    are the dependencies the recorded order contradicts (a pairing or an order the input did not
    keep). Every edge is kept on an acyclic graph."""
    n = g.n_nodes
    keep = np.ones(g.src.shape[0], dtype=bool)
    indeg = np.bincount(g.dst, minlength=n)
    order_e = np.argsort(g.src, kind="stable")
    starts = np.searchsorted(g.src[order_e], np.arange(n + 1))
    by_dst = np.argsort(g.dst, kind="stable")
    dst_starts = np.searchsorted(g.dst[by_dst], np.arange(n + 1))
    done = np.zeros(n, dtype=bool)
    left = indeg.copy()
    ready = [int(v) for v in np.flatnonzero(left == 0)]
    by_time = np.argsort(g.t_in_us, kind="stable")
    cursor = 0
    emitted = 0
    while emitted < n:
        while ready:
            u = ready.pop()
            done[u] = True
            emitted += 1
            for e in order_e[starts[u]:starts[u + 1]].tolist():
                if keep[e]:
                    v = int(g.dst[e])
                    left[v] -= 1
                    if left[v] == 0:
                        ready.append(v)
        if emitted == n:
            break
        while done[by_time[cursor]] or left[by_time[cursor]] == 0:
            cursor += 1
        v = int(by_time[cursor])
        for e in by_dst[dst_starts[v]:dst_starts[v + 1]].tolist():
            if keep[e] and not done[g.src[e]]:
                keep[e] = False
                left[v] -= 1
        ready.append(v)
    return keep


def solve(g: TimingGraph, w_us: np.ndarray, order: np.ndarray | None = None,
          resid: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Forward pass: every node's output time (µs, same origin as ``t_in_us``). ``resid`` is
    ``(r, has_in)`` when the caller fixed the residuals itself (default: ``residuals(g)``)."""
    r, has_in = resid if resid is not None else residuals(g)
    if order is None:
        order = topological_order(g)
    # in-edges grouped by destination
    by_dst = np.argsort(g.dst, kind="stable")
    src_l = g.src[by_dst].tolist()
    w_l = np.asarray(w_us, dtype=np.float64)[by_dst].tolist()
    starts = np.searchsorted(g.dst[by_dst], np.arange(g.n_nodes + 1)).tolist()
    t = g.t_in_us.tolist()
    r_l = r.tolist()
    has = has_in.tolist()
    for v in order.tolist():
        if not has[v]:
            continue
        best = -np.inf
        for i in range(starts[v], starts[v + 1]):
            x = t[src_l[i]] + w_l[i]
            if x > best:
                best = x
        t[v] = best + r_l[v]
    return np.asarray(t, dtype=np.float64)
