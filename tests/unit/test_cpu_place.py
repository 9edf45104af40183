"""Shared cores are no rank's starvation (issue 31): a rank's CPU place (host, cgroup, allowed CPUs)
read from procfs, carried in its pattern set, and the CPU-wait verdict that uses it
(agent/daemon/cpu_place.py, localizer/diagnose/evidence/cpu_starvation.py: shares_cores).

The twins, from what the 2-core host measured: a clean 2-rank job whose ranks share CPUs 0-1 and
one cgroup read "rank 0 spends 1.7x longer in CPU wait (42% vs 25%) — CPU starvation"; a rank pinned
to a core of its own beside a busy loop pinned there waited 0.62 against 0.42 and must still be
named. Same numbers, places that differ (or unknown): named; the same place: no rank.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from perftracker.agent.daemon.cpu_place import cpu_place
from perftracker.localizer.diagnose.evidence.cpu_starvation import CPU_WAIT_KEY
from perftracker.localizer.diagnose.localize import localize_arrays
from perftracker.localizer.diagnose.method.arrays import (
    FunctionInfo,
    PatternArrays,
    pattern_sets_to_arrays,
)
from perftracker.localizer.diagnose.method.options import LocalizeOptions

from perftracker.model import Category, Pattern, PatternSet
from perftracker.wire.patterns import batch_from_sets, batch_to_sets, decode_batch, encode_batch

OPTS = LocalizeOptions(created_ns=1)
FUNCS = (FunctionInfo("aten::mm", "aten::mm", Category.COMPUTE),
         FunctionInfo("train.py(40): forward", "train.py(40): forward", Category.PYTHON),
         FunctionInfo(CPU_WAIT_KEY, CPU_WAIT_KEY, Category.COMPUTE),
         FunctionInfo("gloo:all_gather", "gloo:all_gather", Category.COLLECTIVE))


def _clean_pair(waits: tuple[float, float], places: tuple[str, ...]) -> PatternArrays:
    """Two ranks with the same own work; rank 0 waits ``waits[0]`` of the window for a core, rank 1
    ``waits[1]``, and rank 1 waits in the all-gather for rank 0 by the difference."""
    values = np.zeros((len(FUNCS), 3, 2))
    values[0, 0, :] = 0.20
    values[1, 0, :] = 0.05
    values[2, 0, :] = waits
    values[3, 0, :] = (0.02, 0.02 + waits[0] - waits[1])
    values[:2, 1, :] = 0.9
    return PatternArrays(job="j", session="s", ranks=np.arange(2), functions=FUNCS, values=values, window_s=3.0,
                         gpu=False, world_size=2, cpu_places=places)


HOST_CG = "h|0::/job"


@pytest.mark.parametrize(("places", "named"), [
    ((f"{HOST_CG}|0-1", f"{HOST_CG}|0-1"), False),  # one cgroup, the same CPUs: the scheduler's
    ((f"{HOST_CG}|0", f"{HOST_CG}|1"), True),  # each rank pinned to a core of its own
    (("h|0::/pod-a|0-1", "h|0::/pod-b|0-1"), True),  # a cgroup (container) each: a quota of its own
    (("a|0::/job|0-1", "b|0::/job|0-1"), True),  # two hosts
    ((), True),  # unknown (an older worker, offline traces): as before
])
def test_a_longer_wait_for_a_core_is_starvation_only_where_the_rank_has_cores_of_its_own(
        places: tuple[str, ...], named: bool) -> None:
    for waits in ((0.42, 0.25), (0.62, 0.42)):
        report = localize_arrays(_clean_pair(waits, places), OPTS)
        rank_findings = [f for f in report.findings if f.ranks != (0, 1)]
        if named:
            assert rank_findings and rank_findings[0].ranks == (0,), report.summary
            assert "CPU starvation" in rank_findings[0].sentence, report.summary
        else:
            assert not rank_findings, [f.sentence for f in rank_findings]


def test_work_that_grew_is_still_named_on_shared_cores() -> None:
    """Shared cores take the CPU wait away as a cause, not the rank's own extra work."""
    arr = _clean_pair((0.42, 0.25), (f"{HOST_CG}|0-1", f"{HOST_CG}|0-1"))
    values = arr.values.copy()
    values[0, 0, 0] = 0.45  # rank 0's aten::mm 2.25x
    report = localize_arrays(dataclasses.replace(arr, values=values), OPTS)
    assert report.findings and report.findings[0].ranks == (0,) and report.findings[0].label == "aten::mm", \
        report.summary


# --- the place, from procfs and through the formats --------------------------------------------------

def test_this_process_place_is_its_cgroup_and_allowed_cpus() -> None:
    place = cpu_place(os.getpid())
    if not Path("/proc/self/status").exists():
        assert place == ""
        return
    cgroup = ";".join(sorted(x.strip() for x in Path("/proc/self/cgroup").read_text().splitlines() if x.strip()))
    assert place.startswith(cgroup + "|"), place
    allowed = set()
    for part in place.rsplit("|", 1)[1].split(","):
        lo, _, hi = part.partition("-")
        allowed.update(range(int(lo), int(hi or lo) + 1))
    assert allowed == os.sched_getaffinity(0)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or not Path("/proc/self/status").exists(),
                    reason="needs procfs and two CPUs")
def test_a_pinned_process_has_a_place_of_its_own_and_an_unpinned_one_shares_ours() -> None:
    """Real processes: one pinned with sched_setaffinity (what taskset does), one left alone."""
    cpu = min(os.sched_getaffinity(0))
    code = "import os, sys, time; {}sys.stdout.write('ok\\n'); sys.stdout.flush(); time.sleep(30)"
    procs = [subprocess.Popen([sys.executable, "-c", code.format(pin)], stdout=subprocess.PIPE, text=True)
             for pin in (f"os.sched_setaffinity(0, {{{cpu}}}); ", "")]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline() == "ok\n"
        pinned, free = (cpu_place(p.pid) for p in procs)
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
    assert pinned.endswith(f"|{cpu}") and pinned != cpu_place(os.getpid()), pinned
    assert free == cpu_place(os.getpid()), free
    assert cpu_place(procs[0].pid) == ""  # exited: unknown


def test_an_unreadable_place_is_unknown(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "status").write_text("Name:\tpython\nCpus_allowed_list:\t0-3\n")  # no cgroup file
    assert cpu_place(7, proc=tmp_path) == ""
    (tmp_path / "7" / "cgroup").write_text("0::/job\n")
    assert cpu_place(7, 99, proc=tmp_path) == "0::/job|0-3"  # no such thread: the process's
    assert cpu_place(0, proc=tmp_path) == ""


def _set(rank: int, place: str) -> PatternSet:
    pats = (Pattern("aten::mm", Category.COMPUTE, 0.2, 0.9, 0.0, "aten::mm"),)
    return PatternSet("j", "s", rank, 2, "h", 0, 10**9, pats, cpu_place=place)


def test_the_place_travels_in_the_pattern_set_and_the_wire_format() -> None:
    sets = [_set(0, "0::/job|0-1"), _set(1, "")]
    assert [PatternSet.from_dict(s.to_dict()).cpu_place for s in sets] == ["0::/job|0-1", ""]
    assert "cpu_place" not in sets[1].to_dict()  # older readers never see it
    back = batch_to_sets(decode_batch(encode_batch(batch_from_sets(sets))))
    assert [s.cpu_place for s in back] == ["0::/job|0-1", ""]
    assert pattern_sets_to_arrays(sets).cpu_places == ("h|0::/job|0-1", "")
    assert pattern_sets_to_arrays([_set(0, ""), _set(1, "")]).cpu_places == ()
