"""Whether a rank's CPU wait is starvation or the shadow of its own work (issue 31).

The summarizer makes the training thread's wait for a core (``CPU wait (runnable, no core)``, from
schedstat ``run_delay``) a function of its own that outranks everything the thread runs: while the
thread waits, the op on its stack makes no progress. On a busy host every rank waits for a core some
of the time it wants to run, so a rank that does more of its own work (more ops, or longer ops) also
waits more, and its CPU wait grows with its work. Judged on its β alone, that wait looks like
starvation, and it takes the critical path from the very ops that grew.

**[decision] Starvation is a higher wait per unit of own work.** For each rank, ``own`` is the β of
everything it runs itself (every function but the collectives, the link and host-bound patterns and
the CPU wait) and ``q = wait / own`` the run-queue delay per unit of its own run time. A flagged CPU
wait on some ranks is

- *the rank's own work* when their own work grew (median ``own`` at least ``WORK_GREW`` × that of
  their like peers) and their ``q`` did not (below ``STARVED_Q`` × the peers'): the wait came with the
  work; the finding names the function whose β grew most;
- *CPU starvation* otherwise: the work did not grow and the wait did (a CPU quota, another process on
  the rank's cores), or both grew and the rank waits for a core more per unit of its work than its
  peers (then the work and the starvation are two findings).

Pure functions over the pattern arrays; ``findings`` applies the verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from perftracker.localizer.diagnose.arrays import FunctionInfo, PatternArrays
from perftracker.localizer.diagnose.host_bound import HOST_KEY

from perftracker.model import LINK_KEY, Category

CPU_WAIT_KEY = "CPU wait (runnable, no core)"  # the summarizer's pseudo-function (agent/summarize/summarizer.py)
WORK_GREW = 1.1  # own work this much above the like peers' median has grown
STARVED_Q = 1.3  # run-queue delay per unit of own work this much above the peers' is starvation


@dataclass(frozen=True)
class CpuWaitVerdict:
    """The judgement on a CPU wait of some ranks against their like peers."""

    own: float  # median own-work β of the ranks
    own_peers: float
    q: float  # median run-queue delay per unit of own work of the ranks
    q_peers: float
    work: int | None  # the own function whose β grew most on the ranks (None: none grew)

    @property
    def work_grew(self) -> bool:
        return self.own >= WORK_GREW * self.own_peers and self.own > self.own_peers

    @property
    def starved(self) -> bool:
        return self.q >= STARVED_Q * self.q_peers and self.q > self.q_peers

    @property
    def is_own_work(self) -> bool:
        """The wait came with the ranks' own work: name the work, not the wait."""
        return self.work_grew and not self.starved and self.work is not None


def is_cpu_wait(info: FunctionInfo) -> bool:
    return info.key == CPU_WAIT_KEY or info.label == CPU_WAIT_KEY


def own_functions(functions: Sequence[FunctionInfo]) -> list[int]:
    """The functions a rank runs itself: not a collective (waiting for peers), not the link or
    host-bound pattern, not the CPU wait."""
    return [f for f, i in enumerate(functions) if i.category is not Category.COLLECTIVE
            and i.key not in (LINK_KEY, HOST_KEY) and not is_cpu_wait(i)]


def cpu_wait_function(functions: Sequence[FunctionInfo]) -> int | None:
    return next((f for f, i in enumerate(functions) if is_cpu_wait(i)), None)


def judge_cpu_wait(beta: np.ndarray, wait_f: int, own_fs: list[int], ranks: np.ndarray, peers: np.ndarray
                   ) -> CpuWaitVerdict:
    """``beta``: functions × workers; ``ranks``/``peers``: worker columns (peers not empty)."""
    own = beta[own_fs].sum(axis=0) if own_fs else np.zeros(beta.shape[1])
    wait = beta[wait_f]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(own > 0, wait / np.where(own > 0, own, 1.0), np.inf)
    work = None
    if own_fs:
        excess = np.median(beta[own_fs][:, ranks], axis=1) - np.median(beta[own_fs][:, peers], axis=1)
        i = int(np.argmax(excess))
        work = own_fs[i] if float(excess[i]) > 0 else None
    return CpuWaitVerdict(float(np.median(own[ranks])), float(np.median(own[peers])), float(np.median(q[ranks])),
                          float(np.median(q[peers])), work)


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
