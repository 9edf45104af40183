"""Hand-built, realistic Reports for the renderer, CLI and screenshot tests.

The numbers follow what the localizer produces for the slow-compute demo (one rank's CPU
throttled: its compute ops hold the critical path about 2x longer at under half the others' CPU
utilization, and every other rank waits in the allreduce) and for a hang (rank 2 stuck in user
code while the others wait in a collective).
"""

from __future__ import annotations

from perftracker.model import Box, Category, Finding, RankState, Report, TopFunction, Triple
from perftracker.model.trigger import Detection

WORLD = 8
SLOW_RANK = 3
FULL_BOX = Box(Triple(0.0, 0.0, 0.0), Triple(1.0, 1.0, 1.0))


def _series(rank: int, slow: bool) -> tuple[float, ...]:
    base = [101.0 + ((rank * 7 + i * 3) % 5) for i in range(60)]
    if slow:
        base = base[:30] + [x * 2.05 for x in base[30:]]
    return tuple(base)


def slow_compute_report() -> Report:
    compute_points = tuple(
        (r, 0.62 if r == SLOW_RANK else 0.29 + 0.004 * (r % 3), 0.41 if r == SLOW_RANK else 0.90 + 0.01 * (r % 4))
        for r in range(WORLD)
    )
    wait_points = tuple(
        (r, 0.02 if r == SLOW_RANK else 0.31 + 0.005 * (r % 2), 0.05 if r == SLOW_RANK else 0.03) for r in range(WORLD)
    )
    others = tuple(r for r in range(WORLD) if r != SLOW_RANK)
    findings = (
        Finding(
            key="aten::addmm",
            label="aten::addmm",
            category=Category.COMPUTE,
            ranks=(SLOW_RANK,),
            kind="specific",
            tests=("differential",),
            observed=Triple(0.62, 0.41, 0.08),
            median=Triple(0.29, 0.91, 0.05),
            expected=FULL_BOX,
            sentence=(
                "rank 3: compute ops 2.1\u00d7 longer on the critical path at 45% of the others' CPU "
                "utilization: slow or throttled processor"
            ),
            points=compute_points,
        ),
        Finding(
            key="gloo:all_reduce",
            label="gloo:all_reduce",
            category=Category.COLLECTIVE,
            ranks=others,
            kind="common",
            tests=("expectation",),
            observed=Triple(0.31, 0.03, 0.01),
            median=Triple(0.31, 0.03, 0.01),
            expected=Box(Triple(0.0, 0.0, 0.0), Triple(0.15, 1.0, 1.0)),
            sentence=(
                "ranks 0-2,4-7: allreduce holds 31% of the critical path at 3% network utilization: "
                "waiting for a slower peer (rank 3)"
            ),
            points=wait_points,
        ),
    )
    return Report(
        job="examples-train",
        session="s-20261122-125301-7f3a",
        kind="slowdown",
        created_ns=1_795_351_981_000_000_000,
        trigger_reason="rank 3: slowdown at iteration 850 (+106% over 101.0 ms)",
        trigger=Detection(rank=3, reason="slowdown", test="paper", iteration=850, baseline_ms=101.0, slow_ms=208.0,
                          ratio=208.0 / 101.0),
        window_s=20.0,
        ranks_reported=tuple(range(WORLD)),
        ranks_missing=(),
        findings=findings,
        top_functions=(
            TopFunction("aten::addmm", "aten::addmm", Category.COMPUTE, Triple(0.29, 0.91, 0.05)),
            TopFunction("gloo:all_reduce", "gloo:all_reduce", Category.COLLECTIVE, Triple(0.31, 0.03, 0.01)),
        ),
        summary="rank 3 is slow in compute (aten::addmm); the other 7 ranks wait for it in allreduce.",
        profile="cpu",
        iteration_ms={r: _series(r, True) for r in range(WORLD)},
        status="complete",
    )


def clean_report() -> Report:
    return Report(
        job="examples-train",
        session="s-20261122-130000-0001",
        kind="slowdown",
        created_ns=1_795_352_400_000_000_000,
        trigger_reason="manual: perftracker trigger",
        window_s=20.0,
        ranks_reported=(0, 1, 2, 4, 5),
        ranks_missing=(3,),
        findings=(),
        top_functions=(
            TopFunction("aten::addmm", "aten::addmm", Category.COMPUTE, Triple(0.41, 0.93, 0.04)),
            TopFunction("gloo:all_reduce", "gloo:all_reduce", Category.COLLECTIVE, Triple(0.12, 0.21, 0.06)),
            TopFunction(
                "train.py:120 main;train.py:88 step;optim/sgd.py:200 _single_tensor_sgd",
                "_single_tensor_sgd",
                Category.PYTHON,
                Triple(0.004, 0.97, 0.02),
            ),
        ),
        summary="No abnormal functions across 5 ranks.",
        profile="cpu",
        iteration_ms={r: _series(r, False) for r in (0, 1, 2, 4, 5)},
        status="partial",
    )


def hang_report() -> Report:
    states = [
        RankState(
            r,
            "waiting",
            "c10d allreduce (ProcessGroupGloo) from perftracker/examples/train.py:97 in step",
            signature="allreduce",
            idle_s=41.5,
            last_iteration=312,
        )
        for r in range(WORLD)
        if r not in (2, 6)
    ]
    states.insert(
        2,
        RankState(2, "culprit", "perftracker/examples/train.py:74 in load_batch (time.sleep)", signature="user", idle_s=41.8,
                  last_iteration=311, detail="blocked in user code"),
    )
    states.insert(
        6,
        RankState(6, "silent", "no snapshot", idle_s=0.0, last_iteration=-1, detail="process stopped (SIGSTOP)"),
    )
    return Report(
        job="examples-train",
        session="h-20261122-131500-22c1",
        kind="hang",
        created_ns=1_795_353_300_000_000_000,
        trigger_reason="blocked: no iteration for 41.5 s (mean iteration 0.10 s)",
        window_s=0.0,
        ranks_reported=tuple(r for r in range(WORLD) if r != 6),
        ranks_missing=(6,),
        hang_states=tuple(states),
        summary="rank 2 is blocked in perftracker/examples/train.py:74 load_batch (time.sleep) while 6 ranks wait in allreduce; rank 6 sent nothing (process stopped).",
        profile="",
        iteration_ms={r: _series(r, False)[:40] for r in range(WORLD) if r != 6},
        status="complete",
    )
