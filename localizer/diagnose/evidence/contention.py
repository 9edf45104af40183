"""A lateness with no cause of its own, on a host where the ranks wait for a core (issue 31).

The wait evidence names a late rank when its peers wait for it at a collective by at least
``wait_min`` of the window, and ``cause_of_lateness`` then looks for what the late rank does more;
when nothing it does stands out, the finding says "the cause is not among the profiled functions".
On a quiet host that is worth saying (work before the window, a thread outside the trace). On a host
with more runnable threads than cores it is not: every rank waits for a core (the summarizer's
``CPU wait (runnable, no core)``), the scheduler hands those waits out unevenly within a few
seconds, and one rank ends up later than another by a share of the window that is of the order of
those waits. A clean 2-rank FSDP2 job on the loaded 2-core host read "rank 1 arrives last at
all_gather_single; rank 0 waits 9.6% for it — cause outside the profile", with both ranks runnable
without a core 47% and 53% of the window and nothing else apart.

**[decision] Above the contention.** A late group whose lateness has no cause of its own is named
only when its wait is larger than the CPU wait of its ranks (the median over the late and the
waiting ranks, each a share of the window): a lateness inside the time the ranks spent without a
core is the scheduler's, not a rank's. Where there is a cause (the late rank's own work grew, or it
alone was starved: ``cpu_starvation``), nothing changes; nor on a quiet host (no CPU wait) or a
trace without the CPU-wait pattern (GPU traces). What it cannot tell: a real late start outside
the profile smaller than the host's contention is not named there.

Pure functions over the pattern arrays.
"""

from __future__ import annotations

import numpy as np
from perftracker.localizer.diagnose.evidence.cpu_starvation import cpu_wait_function
from perftracker.localizer.diagnose.method.arrays import PatternArrays


def contention(arr: PatternArrays, cols: np.ndarray) -> float:
    """The median share of the window the workers ``cols`` spent runnable without a core (0 without
    the CPU-wait pattern)."""
    f = cpu_wait_function(arr.functions)
    if f is None or cols.size == 0:
        return 0.0
    return float(np.median(arr.values[f, 0, cols]))


def within_contention(arr: PatternArrays, wait_share: float, late: np.ndarray, waiting: np.ndarray) -> bool:
    """A causeless lateness whose wait (share of the window) is no larger than its ranks' CPU wait."""
    return wait_share <= contention(arr, np.union1d(late, waiting))
