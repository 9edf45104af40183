"""The host link's TCP health over a window: the share of TCP segments it retransmitted.

``/proc/<pid>/net/snmp`` holds the counters of the process's network namespace (the pod, or the
emulated host of the fault bench): ``Tcp: OutSegs`` (segments sent) and
``Tcp: RetransSegs``. A healthy data-centre link retransmits well under 0.1% of its segments; a
policed, congested or faulty link drops packets and its senders retransmit. In a ring collective a
slow link slows every rank alike, so the ranks' critical paths cannot name it, but the host behind
it retransmits far more than the others (measured in the fault bench, a 2,000 Mbit/s tc limit on one
host: its bulk connection retransmitted 1.4% of its bytes, the others 0.015-0.12%).

The sampler reads the counters with the NIC bytes (every ``slow_every`` ticks) and, once the window's
bounds are final, reduces them to one sample: the ``tcp_retrans`` series holds a single value, the
retransmitted share over the window, stamped at its last reading with the window's length as its
period. It is left out when the namespace sent fewer than ``MIN_SEGMENTS`` segments in the window
(a share of a handful of segments says nothing).
"""

from __future__ import annotations

import numpy as np

from perftracker.model.raw_window import TCP_RETRANS, UtilSeries

RESOURCE = TCP_RETRANS
MIN_SEGMENTS = 1000


def parse_snmp_tcp(text: str) -> tuple[int, int]:
    """``/proc/<pid>/net/snmp`` -> (OutSegs, RetransSegs). ValueError if the Tcp lines are missing."""
    rows = [line.split() for line in text.splitlines() if line.startswith("Tcp:")]
    if len(rows) < 2:
        raise ValueError("no Tcp: header and value lines")
    fields = dict(zip(rows[0][1:], rows[1][1:], strict=False))
    return int(fields["OutSegs"]), int(fields["RetransSegs"])


def window_retrans_share(t_ns: np.ndarray, out_segs: np.ndarray, retrans_segs: np.ndarray, start_ns: int,
                         end_ns: int, min_segments: int = MIN_SEGMENTS) -> UtilSeries | None:
    """The retransmitted share of TCP segments between the readings that bracket [start_ns, end_ns].

    Uses the last reading at or before the start and the first at or after the end (the window's
    own edges, within one slow period); None when the readings do not cover it or too few segments
    went out.
    """
    t = np.asarray(t_ns, dtype=np.int64)
    if len(t) < 2:
        return None
    i = max(int(np.searchsorted(t, start_ns, side="right")) - 1, 0)
    j = min(int(np.searchsorted(t, end_ns, side="left")), len(t) - 1)
    if j <= i:
        return None
    sent = int(out_segs[j]) - int(out_segs[i])
    retrans = max(int(retrans_segs[j]) - int(retrans_segs[i]), 0)
    if sent < min_segments:
        return None
    share = min(retrans / sent, 1.0)
    return UtilSeries(RESOURCE, np.array([t[j]], np.int64), np.array([share], np.float32), int(t[j] - t[i]), "procfs")
