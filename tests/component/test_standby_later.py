"""A worker's standby samplers start ``standby_after_s`` after it registers, not at once (issue 30):
a short job's first seconds do not pay for helpers no automatic window can use yet."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from perftracker.agent.daemon.window_session import WindowOptions, WindowRunner
from perftracker.agent.daemon.workers import Worker


def _runner(tmp_path: Path, after_s: float) -> tuple[WindowRunner, list[int]]:
    runner = WindowRunner(str(tmp_path), WindowOptions(summarize_worker=False, standby_after_s=after_s),
                          None, None)  # type: ignore[arg-type]
    primed: list[int] = []
    runner.prime = lambda w: primed.append(w.rank)  # type: ignore[method-assign]
    return runner, primed


def _worker(rank: int) -> Worker:
    return Worker(job="j", rank=rank, world_size=3, local_rank=rank, pid=1, training_tid=1, host="h")


@pytest.mark.parametrize("after_s", [0.0, 0.3])
def test_standby_samplers_start_after_the_delay_for_current_idle_workers(tmp_path: Path, after_s: float) -> None:
    async def go() -> list[list[int]]:
        runner, primed = _runner(tmp_path, after_s)
        current = {0: True, 1: False, 2: True}
        busy = _worker(2)
        busy.work_session = "s1"  # a session runs: it primes after its window itself
        for w in (_worker(0), _worker(1), busy):
            runner.prime_later(w, lambda x: current[x.rank])
        early = list(primed)
        await asyncio.sleep(after_s + 0.2)
        return [early, primed]

    early, late = asyncio.run(go())
    assert late == [0]  # rank 1 is no longer the current worker, rank 2 is in a session
    assert early == ([] if after_s > 0 else [0])
