"""Whether a rank's CPU wait is starvation or the shadow of its own work (issue 31).

The summarizer makes the training thread's wait for a core (``CPU wait (runnable, no core)``, from
schedstat ``run_delay``) a function of its own that outranks everything the thread runs: while the
thread waits, the op on its stack makes no progress. On a busy host every rank waits for a core some
of the time it wants to run, so a rank that does more of its own work (more ops, or longer ops) also
waits more, and its CPU wait grows with its work. Judged on its β alone, that wait looks like
starvation, and it takes the critical path from the very ops that grew.

**[decision] The work first.** A flagged CPU wait on some ranks is *the ranks' own work* when that
work grew against their like peers: the sum, over the functions the ranks run themselves (every
function but the collectives, the link and host-bound patterns and the CPU wait), of what each holds
above the peers' median β — beyond the ranks' uniform stretch (``stretch``) — is at least
``WORK_GREW`` of the peers' own β, and the function it names (the one that grew most) grew by
that much on its own. The stretch is there for a CPU quota (the CPU fault suite's
slow-compute-rank): a throttled cgroup is not on the run queue, so schedstat's run_delay misses much
of its wait and every op of the rank runs longer alike; without it, the op that happened to grow
most (a dataset's ``__getitem__``, ``_single_tensor_sgd``) was named as extra work. The bar on the
named function is there for the same quota: its ops stretch unevenly (1.1-1.7× in one window, 1.26×
the lower quartile), and the growth beyond the stretch of twenty small Python frames, each under
0.2% of the window, summed past the bar while the rank's CPU wait was 2.4× its peers' (then the
report named ``backward``, 0.24% of the window, as the rank's "Python work"). Only the functions they hold
*more* count: a pipeline stage's peers wait for it in Python frames (``_wait_batch_p2p``), which are
"own" functions by category but shrink on the late rank. The finding then names the function whose
β grew most, and the CPU wait is a clause of it. *CPU starvation* is the cause only when the work did
not grow and the wait did (a CPU quota, another process on the rank's cores).

Why not the wait per unit of run time (schedstat's ``run_delay / run_time``): the patterns' μ is the
thread's CPU utilization inside each function, and under contention it is measured over the waits
too (aten::mm at μ 0.35 on a loaded host, a p2p wait at 0.17), so β·μ does not give the run time.

**[decision] Shared cores are no rank's starvation.** A rank whose CPU place (its host, cgroup and
allowed CPUs: ``PatternSet.cpu_place``, agent/daemon/cpu_place.py) is that of a peer it is compared
with has no neighbour or quota of its own: what runs on those cores competes with both, and which of
them waits longer in a window is the scheduler's placement. Its CPU wait beyond its peers' is then
not CPU starvation (``shares_cores``): the finding folds, and the wait is no cause of lateness (a
lateness inside the ranks' CPU wait is then the host's contention, contention.py). Measured on the
2-core host: a clean 2-rank FSDP2 job (both ranks on CPUs 0-1, one cgroup) read "rank 0 spends 1.7×
longer in CPU wait (42% vs 25%) — CPU starvation" at load 11; with each rank pinned to a core of its
own and a busy loop pinned beside rank 1, rank 1 waited 0.62 against 0.42 (1.5×): the size of the
wait does not separate the two, the places do. Where a place is unknown (an older worker, offline
traces, a worker that exited before its window was summarized) nothing changes.

Pure functions over the pattern arrays; ``findings`` applies the verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from perftracker.localizer.diagnose.evidence.host_bound import HOST_KEY
from perftracker.localizer.diagnose.method.arrays import FunctionInfo, PatternArrays

from perftracker.model import LINK_KEY, Category
from perftracker.model.hardware import is_health

CPU_WAIT_KEY = "CPU wait (runnable, no core)"  # the summarizer's pseudo-function (agent/summarize/summarizer.py)
WORK_GREW = 0.1  # own work this share of the peers' own β above theirs has grown


@dataclass(frozen=True)
class CpuWaitVerdict:
    """The judgement on a CPU wait of some ranks against their like peers."""

    excess: float  # β the ranks hold above their peers' median, summed over their own functions
    own_peers: float  # the peers' median own β
    work: int | None  # the own function whose β grew most on the ranks (None: none grew)
    work_excess: float = 0.0  # what that function alone holds above the stretched peers' median

    @property
    def work_grew(self) -> bool:
        """The wait came with the ranks' own work: name the work, not the wait. The function named
        must itself have grown by WORK_GREW of the peers' own β: growth spread thinly over many
        functions is the uneven stretch of a slower processor, not work that one of them added."""
        bar = WORK_GREW * self.own_peers
        return self.work is not None and self.excess > 0 and self.excess >= bar and self.work_excess >= bar


def is_cpu_wait(info: FunctionInfo) -> bool:
    return info.key == CPU_WAIT_KEY or info.label == CPU_WAIT_KEY


def own_functions(functions: Sequence[FunctionInfo]) -> list[int]:
    """The functions a rank runs itself: not a collective (waiting for peers), not the link or
    host-bound pattern, not the CPU wait."""
    return [f for f, i in enumerate(functions) if i.category is not Category.COLLECTIVE
            and i.key not in (LINK_KEY, HOST_KEY) and not is_cpu_wait(i) and not is_health(i.key)]


def cpu_wait_function(functions: Sequence[FunctionInfo]) -> int | None:
    return next((f for f, i in enumerate(functions) if is_cpu_wait(i)), None)


def stretch(on_ranks: np.ndarray, on_peers: np.ndarray) -> float:
    """How much longer the ranks run all their own functions alike: the lower quartile of the
    per-function ratios ranks / peers, weighted by the peers' β (functions the peers do not run left
    out), at least 1. A processor that runs everything slower (a CPU quota, a lower clock) stretches
    every function alike, and this is that factor; work added to functions that hold up to three
    quarters of the peers' own β leaves it at the others' ratio, near 1."""
    ok = on_peers > 0
    if not ok.any():
        return 1.0
    ratio, weight = on_ranks[ok] / on_peers[ok], on_peers[ok]
    order = np.argsort(ratio)
    cum = np.cumsum(weight[order])
    i = int(np.searchsorted(cum, cum[-1] / 4))
    return max(1.0, float(ratio[order][min(i, order.size - 1)]))


def judge_cpu_wait(beta: np.ndarray, own_fs: Sequence[int], ranks: np.ndarray, peers: np.ndarray) -> CpuWaitVerdict:
    """``beta``: functions × workers; ``ranks``/``peers``: worker columns (peers not empty). A
    function's growth counts beyond the ranks' uniform stretch (``stretch``): every op longer by the
    same factor is a slower or starved processor, not more work."""
    if not own_fs:
        return CpuWaitVerdict(0.0, 0.0, None)
    own = beta[list(own_fs)]
    on_ranks, on_peers = np.median(own[:, ranks], axis=1), np.median(own[:, peers], axis=1)
    more = on_ranks - stretch(on_ranks, on_peers) * on_peers
    i = int(np.argmax(more))
    return CpuWaitVerdict(float(np.clip(more, 0.0, None).sum()), float(np.median(own[:, peers].sum(axis=0))),
                          list(own_fs)[i] if float(more[i]) > 0 else None, max(0.0, float(more[i])))


def like_peers(arr: PatternArrays, ranks: np.ndarray) -> np.ndarray:
    """The other workers of the ranks' pipeline stage where the ranks are of one stage and it has
    others, else every other worker (a stage's work differs from another's)."""
    others = np.setdiff1d(np.arange(arr.n_workers), ranks)
    if arr.stage is not None and others.size:
        st = np.unique(arr.stage[ranks])
        same = others[arr.stage[others] == st[0]] if st.size == 1 and st[0] >= 0 else others[:0]
        if same.size:
            return same
    return others


def shares_cores(arr: PatternArrays, ranks: np.ndarray, peers: np.ndarray) -> bool:
    """Every one of ``ranks`` (worker columns) has a known CPU place that one of ``peers`` has too: the
    same host, cgroup and allowed CPUs (see the module doc)."""
    places = arr.cpu_places
    if not places or ranks.size == 0:
        return False
    theirs = {places[int(p)] for p in peers if places[int(p)]}
    return all(places[int(r)] and places[int(r)] in theirs for r in ranks)
