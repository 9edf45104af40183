"""What changed since the job was fast: a session's patterns against the job's healthy baseline (issue 49).

Pure numpy over two ``PatternArrays``: the baseline window's (taken once the job ran steadily,
perftracker.localizer.service.session.baseline) and this session's. The differential distance
compares workers with each other and cannot see a function that slowed on every rank alike; the
expected ranges cannot see it while its share stays inside them. The baseline can: a function
whose share of the window grew on most ranks since then is a ``Change``.

**[decision]** Per function and per rank, the share β grew when it grew by at least
``min_delta`` of the window in absolute terms *and* by the factor ``min_ratio``: β is a share, so a
function that takes longer per step holds a larger share of every window whatever the step time,
and both gates together keep a large function's window-to-window noise (a few points) and a tiny
function's relative noise (3x of almost nothing) out. A rank absent from the baseline (a job
restarted with more ranks) is compared with the baseline's median worker. A change is job-wide
when it holds on at least ``min_rank_share`` of the compared ranks and the median rank's growth is
at least ``min_delta`` as well (two of four ranks whose noise crossed both gates in the same
window are not a job-wide change: 1 false change in 300 clean seeded 4-rank windows, β noise 0.01,
without that gate or with half of it; 0 with it); fewer ranks are the differential test's case (a rank unlike its peers). μ and σ are carried, then and now, for the
reader; the gate is on β alone (μ, σ of a CPU op move with the host's load between windows).

Only a rank's own work is compared (``own_work``): a collective's share holds the wait for the
slowest peer, and the waiting pseudo-functions (CPU wait, idle, the host link) grow with the host's
load. In the first real run of the onset scenario on a loaded 2-core host (load ~9), the baseline
named ddp.reducer::wait (12 % -> 21 %), its late-peers part and the TCP retransmissions on 3 of 4
reports before the fault began: none of them a cause. A job-wide network slowdown is left to the
collectives' expected ranges.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from perftracker.localizer.diagnose.evidence.cpu_starvation import CPU_WAIT_KEY
from perftracker.localizer.diagnose.evidence.host_bound import HOST_KEY, IDLE_KEY
from perftracker.localizer.diagnose.method.arrays import FunctionInfo, PatternArrays

from perftracker.model import LINK_KEY, Category
from perftracker.model.hardware import is_health
from perftracker.model.patterns import Triple
from perftracker.model.since_fast import Change


@dataclass(frozen=True)
class BaselineRule:
    min_delta: float = 0.03  # β now - β then, as a share of the window
    min_ratio: float = 1.3  # β now / β then
    min_rank_share: float = 0.5  # of the compared ranks, for a job-wide change
    max_changes: int = 8  # at most this many changes are kept, the largest growth first
    own_work_only: bool = True  # compare what a rank runs itself, not what it waits in (``own_work``)


_NOT_WORK = frozenset({CPU_WAIT_KEY, HOST_KEY, IDLE_KEY, LINK_KEY})


def own_work(info: FunctionInfo) -> bool:
    """A function a rank runs itself: not a collective (its share holds the wait for the slowest
    peer, and grows with any rank's lateness or the host's load), not a pseudo-function of waiting
    (for a core, idle, the host link's retransmissions) nor a hardware health series."""
    return (info.category is not Category.COLLECTIVE and info.key not in _NOT_WORK
            and info.label not in _NOT_WORK and not is_health(info.key))


def baseline_columns(then: PatternArrays, now: PatternArrays) -> np.ndarray:
    """(N_now,) int64: for each worker now, its column in the baseline (same rank), or -1."""
    order = np.argsort(then.ranks, kind="stable")
    sorted_ranks = then.ranks[order]
    pos = np.searchsorted(sorted_ranks, now.ranks)
    pos_c = np.minimum(pos, max(sorted_ranks.size - 1, 0))
    hit = (pos < sorted_ranks.size) & (sorted_ranks[pos_c] == now.ranks) if sorted_ranks.size else \
        np.zeros(now.ranks.size, dtype=bool)
    out = np.full(now.ranks.size, -1, dtype=np.int64)
    out[hit] = order[pos_c[hit]]
    return out


def baseline_values(then: PatternArrays, now: PatternArrays) -> tuple[np.ndarray, np.ndarray]:
    """(values then aligned with ``now``: (F_now, 3, N_now), present: (F_now,) bool: the baseline ran
    the function). A function the baseline did not run is 0 there; a worker the baseline lacks gets
    the baseline's median worker."""
    cols = baseline_columns(then, now)
    index = {f.key: i for i, f in enumerate(then.functions)}
    n_f, n_w = len(now.functions), now.ranks.size
    out = np.zeros((n_f, 3, n_w))
    present = np.zeros(n_f, dtype=bool)
    have = cols >= 0
    for f, info in enumerate(now.functions):
        i = index.get(info.key)
        if i is None:
            continue
        present[f] = True
        src = then.values[i]  # (3, N_then)
        out[f][:, have] = src[:, cols[have]]
        if not have.all():
            out[f][:, ~have] = np.median(src, axis=1)[:, None]
    return out, present


def compare(then: PatternArrays, now: PatternArrays, rule: BaselineRule | None = None) -> list[Change]:
    """The functions whose share grew since the baseline on at least ``rule.min_rank_share`` of the
    ranks, the largest median growth first (at most ``rule.max_changes``)."""
    rule = rule or BaselineRule()
    if now.ranks.size == 0 or then.ranks.size == 0 or not now.functions:
        return []
    old, present = baseline_values(then, now)
    beta_now, beta_then = now.values[:, 0, :], old[:, 0, :]
    grown = (beta_now - beta_then >= rule.min_delta) & (beta_now >= rule.min_ratio * beta_then)
    need = max(1, math.ceil(rule.min_rank_share * now.ranks.size))
    # job-wide: enough ranks grew, and the median rank's growth passes the absolute gate too (two
    # ranks of four whose noise crossed the gates together do not make a job-wide change)
    median_growth = np.median(beta_now - beta_then, axis=1)
    ok = (grown.sum(axis=1) >= need) & (median_growth >= rule.min_delta)
    if rule.own_work_only:
        ok &= np.array([own_work(f) for f in now.functions], dtype=bool)
    rows = np.flatnonzero(ok)
    found: list[tuple[float, Change]] = []
    for f in rows.tolist():
        cols = np.flatnonzero(grown[f])
        t_then = np.median(old[f][:, cols], axis=1)
        t_now = np.median(now.values[f][:, cols], axis=1)
        info = now.functions[f]
        found.append((float(t_now[0] - t_then[0]), Change(
            key=info.key, label=info.label or info.key, category=info.category,
            ranks=tuple(int(r) for r in np.sort(now.ranks[cols])), compared=int(now.ranks.size),
            then=Triple(*(float(x) for x in t_then)), now=Triple(*(float(x) for x in t_now)),
            new=not bool(present[f]))))
    found.sort(key=lambda p: (-p[0], p[1].key))
    return [c for _, c in found[:rule.max_changes]]


def median_step_ms(iteration_ms: Mapping[int, Sequence[float]]) -> float:
    """The median step time over every rank's series (0.0: none)."""
    values = [x for series in iteration_ms.values() for x in series if x > 0 and math.isfinite(x)]
    return float(np.median(values)) if values else 0.0


__all__ = ["BaselineRule", "baseline_columns", "baseline_values", "compare", "median_step_ms"]
