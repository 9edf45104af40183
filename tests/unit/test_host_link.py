"""The host link's TCP pattern against the wait graph (issue 31, localizer/diagnose/evidence/host_link.py).

Hand-built CPU windows of an FSDP × TP job on one host, from a time model of one step: rank 1 runs
extra matrix products, the others wait for it in their collectives; rank 0, its tensor-parallel
partner, waits in more of them than ranks 2 and 3. The link pattern's β is each rank's collective
share (as the summarizer makes it), μ the share of TCP segments its host retransmitted. Before the
fix, a loaded loopback (μ near or over the 0.5% bound) made the waiting rank 0 "a slow link" by its
β, and the link took every waiting rank's collective findings.
"""

from __future__ import annotations

import numpy as np
import pytest
from perftracker.localizer.diagnose.evidence.host_link import LINK_APART, apart
from perftracker.localizer.diagnose.localize import localize_arrays
from perftracker.localizer.diagnose.method.arrays import FunctionInfo, PatternArrays
from perftracker.localizer.diagnose.method.options import LocalizeOptions
from perftracker.localizer.diagnose.words.next_steps import cause_kind

from perftracker.model import LINK_KEY, Category, Finding, Report

OPTS = LocalizeOptions(created_ns=1)
FUNCS = (FunctionInfo("aten::mm", "aten::mm", Category.COMPUTE),
         FunctionInfo("aten::addmm", "aten::addmm", Category.COMPUTE),
         FunctionInfo("train.py(40): forward", "train.py(40): forward", Category.PYTHON),
         FunctionInfo("all_gather_single", "all_gather_single", Category.COLLECTIVE),
         FunctionInfo("_c10d_functional::wait_tensor", "_c10d_functional::wait_tensor", Category.COLLECTIVE),
         FunctionInfo(LINK_KEY, LINK_KEY, Category.COLLECTIVE, "tcp_retrans"))
MM, ADDMM, PY, AG, WT, LINK = range(6)
N = 4


def _job(mu: list[float], slow: bool, seed: int) -> PatternArrays:
    """``slow``: rank 1 runs aten::mm 8× as long as the others; ranks 0, 2, 3 wait for it at the
    all-gather (rank 0 also at its TP group's wait_tensor)."""
    rng = np.random.default_rng(seed)
    own = np.array([0.010, 0.030, 0.008])[:, None] * np.exp(rng.normal(0, 0.03, (3, N)))
    if slow:
        own[MM, 1] *= 8.0
    comm = 0.012 * np.exp(rng.normal(0, 0.05, N))  # the collectives themselves
    step = float((own.sum(axis=0) + comm).max()) * 1.02
    wait = step - own.sum(axis=0) - comm  # what each rank waits for the slowest
    values = np.zeros((len(FUNCS), 3, N))
    values[:3, 0, :] = own / step
    tp = np.array([0.6, 0.0, 0.0, 0.0])  # rank 0 waits for its TP partner in wait_tensor too
    values[AG, 0, :] = (comm / 2 + wait * (1 - tp)) / step
    values[WT, 0, :] = (comm / 2 + wait * tp) / step
    values[:3, 1, :] = 0.95
    values[AG:WT + 1, 1, :] = 0.05
    values[LINK, 0, :] = values[AG, 0, :] + values[WT, 0, :]
    values[LINK, 1, :] = mu
    return PatternArrays(job="j", session="s", ranks=np.arange(N), functions=FUNCS, values=values, window_s=3.0,
                         gpu=False, world_size=N)


def _link_findings(report: Report) -> list[Finding]:
    return [f for f in report.findings if f.key == LINK_KEY]


@pytest.mark.parametrize("mu", [
    [0.003, 0.003, 0.003, 0.003],      # a loaded loopback under the bound
    [0.006, 0.0062, 0.0061, 0.006],    # over the bound on every rank: one host's counter
    [0.0052, 0.0048, 0.0049, 0.0048],  # the waiting rank 0 just over the bound, its host-mates just under
])
@pytest.mark.parametrize("seed", [1, 2])
def test_a_waiting_rank_is_no_slow_link_and_its_waits_stay_with_the_slowed_rank(mu: list[float], seed: int) -> None:
    report = localize_arrays(_job(mu, slow=True, seed=seed), OPTS)
    assert report.findings, report.summary
    head = report.findings[0]
    assert head.ranks == (1,) and head.label == "aten::mm", report.summary
    assert {r for w in head.waits for r in w.ranks} == {0, 2, 3}, report.summary
    assert not [f for f in _link_findings(report) if f.kind != "common"], report.summary
    assert not [f for f in report.findings if f.category is Category.COLLECTIVE and f.kind != "common"
                and not set(f.ranks) <= {1}], report.summary


@pytest.mark.parametrize(("factor", "named"), [(0.9, False), (1.1, True), (5.0, True)])
def test_a_host_that_retransmits_apart_from_the_others_is_named(factor: float, named: bool) -> None:
    """The must-find twin, no slowed rank: rank 0's host retransmits 0.9×, 1.1× or 5× LINK_APART the
    others' 0.4% (under the 0.5% bound; rank 0 over it in all three)."""
    mu = [0.004 * LINK_APART * factor, 0.004, 0.0041, 0.0039]
    report = localize_arrays(_job(mu, slow=False, seed=3), OPTS)
    links = [f for f in _link_findings(report) if f.kind != "common"]
    if named:
        assert [f.ranks for f in links] == [(0,)], report.summary
        assert "retransmitted" in links[0].sentence, links[0].sentence
    else:
        assert not links, report.summary


def test_apart_is_for_the_host_link_only() -> None:
    assert apart(LINK_KEY, 0.011, 0.005) and not apart(LINK_KEY, 0.009, 0.005)
    assert not apart(LINK_KEY, 0.0, 0.0)  # nothing retransmitted anywhere
    assert apart("InfiniBand port wait (port_xmit_wait)", 0.06, 0.05)


@pytest.mark.parametrize(("text", "kind"), [
    # a collective finding with no hint is its whole sentence: its measure is no link cause
    ("rank 0: collective all_gather_single holds the critical path 1.6× longer than on other ranks, "
     "at 40% of their network utilization", "unknown"),
    ("exposed communication above half the window", "unknown"),  # "nic" inside "communication"
    ("lossy, congested or rate-limited network link on this host (TCP retransmissions)", "slow_link"),
    ("slow or congested InfiniBand link at this rank's port (port_xmit_wait)", "slow_link"),
    ("a slow NIC on this host", "slow_link"),
    ("network congestion", "slow_link"),
])
def test_a_waiting_ranks_network_utilization_is_no_slow_link(text: str, kind: str) -> None:
    """The headline's cause kind comes from the sentence's cause clause, or from the whole sentence
    where it has none; 'network' there was the nic resource's name in a measure (explain.py), and the
    waiting rank's headline read '— slow link'."""
    assert cause_kind(text) == kind
