"""A finding's shares mean what they say (issue 44; localizer/diagnose/verdict/shares.py): waits of
different ranks are not added into one rank's window, the impact never passes the window, and the
culprit is never listed among its own waiters."""

from __future__ import annotations

import pytest
from perftracker.localizer.diagnose.verdict.shares import (
    bounded_impact,
    per_rank_wait,
    without_culprits,
)

from perftracker.model import Wait


def test_waits_of_different_ranks_are_not_added_but_one_ranks_waits_are() -> None:
    # a DP4 x PP4 job's slowed worker: its pipeline partners wait 45% at the send/recv, the other
    # replicas 50% at the data-parallel reduction, stage-0 ranks 44% one hop further: summed over
    # ranks the old impact read 139% + its own excess
    waits = [Wait("SendRecv", (1, 2, 3), 0.45), Wait("AllReduce [DP]", (4, 8, 12), 0.50),
             Wait("AllReduce [EMB], one hop further", (1,), 0.44)]
    assert per_rank_wait(waits) == pytest.approx(0.89)  # rank 1: 45% + 44% of its own window
    assert bounded_impact(0.50, waits) == pytest.approx(0.89)
    assert bounded_impact(0.95, waits) == pytest.approx(0.95)  # its own excess, when larger


def test_the_impact_never_passes_the_window() -> None:
    waits = [Wait("SendRecv", (1,), 0.7), Wait("AllReduce", (1,), 0.6)]  # shares are medians: can overshoot
    assert bounded_impact(0.2, waits) == 1.0
    assert bounded_impact(1.3, []) == 1.0
    assert bounded_impact(-0.1, []) == 0.0


def test_the_culprit_is_not_its_own_waiter() -> None:
    waits = [Wait("SendRecv", (0, 1, 2), 0.26), Wait("AllReduce [EMB], one hop further", (3,), 0.13)]
    out = without_culprits(waits, (3, 7))
    assert out == (Wait("SendRecv", (0, 1, 2), 0.26),)  # rank 3's own wait dropped, not its peers'
    assert without_culprits([Wait("SendRecv", (2, 3), 0.2)], [3]) == (Wait("SendRecv", (2,), 0.2),)
    assert without_culprits(waits, ()) == tuple(waits)


def test_a_set_of_ranks_cause_counts_its_largest_wait_once() -> None:
    from perftracker.localizer.diagnose.verdict.shares import largest_wait_impact

    waits = [Wait("SendRecv", (0, 2), 0.24), Wait("AllReduce [DP], one hop further", (0, 2), 0.20)]
    assert largest_wait_impact(0.10, waits) == pytest.approx(0.24)
    assert largest_wait_impact(0.30, waits) == pytest.approx(0.30)
    assert largest_wait_impact(0.10, [Wait("SendRecv", (0,), 1.4)]) == 1.0
