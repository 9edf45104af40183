"""When the host link's TCP pattern is evidence against a rank (issue 31).

The summarizer's link pattern (``LINK_KEY``, ``agent/summarize/summarizer.py``) has as β the rank's
collective share of the critical path and as μ the share of TCP segments its host's network
namespace retransmitted in the window. Two things follow:

- **β is no link evidence.** A rank that waits for a late peer holds its collectives longer, so its
  link pattern's β is larger than its peers' for a reason that has nothing to do with its link.
  Judged by the differential test on β, the waiting rank of an FSDP × TP job on a loaded host was
  named a slow link, and every collective finding of the ranks that waited was folded into it (the
  link rule: one host's bad link slows every collective through it). So, like the hardware health
  patterns, the link is a fault only where its μ is outside its healthy range (``needs_range``).
- **μ is the host's, not the rank's.** Every rank of one host reads one counter (a namespace's
  ``/proc/net/snmp``), each over its own window, so ranks of one host differ only by when they
  read it. A rank's link is a cause of the others' waits only when its μ stands apart from the
  median rank's, by ``LINK_APART`` × (a lossy host against healthy ones: 1.4% against 0.015-0.12%
  in the fault bench, ≥ 10×). A rank just over the bound beside peers just under it (0.51% and
  0.49%, one loopback under load) is one host's counter, not a link of its own (``apart``); so is a
  bound exceeded on every rank, which stays a finding of the job (common), never a rank's.

Pure functions over the pattern values.
"""

from __future__ import annotations

from perftracker.model import LINK_KEY

LINK_APART = 2.0  # a rank's retransmitted share this many times the median rank's is its host's own


def needs_range(key: str) -> bool:
    """The pattern is a fault only on ranks outside its expected range (its β is its category's time)."""
    return key == LINK_KEY


def apart(key: str, observed_mu: float, median_mu: float) -> bool:
    """The link pattern of some ranks (``observed_mu``, their median) stands apart from the median
    rank's (``median_mu``): their host retransmits more than the others', not just reads the same
    counter at another time. Always true for other keys."""
    if key != LINK_KEY:
        return True
    return observed_mu >= LINK_APART * median_mu and observed_mu > median_mu
