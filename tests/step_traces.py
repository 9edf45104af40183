"""Two-rank CPU DDP Kineto traces in the format torch 2.13 writes (``user_annotation``
``ProfilerStep#N`` around ``cpu_op`` events, ``distributedInfo`` with the gloo group; header as
tests/fixtures/kineto_formats/gloo_cpu), whose ranks may record different steps: the offline
step-alignment tests (``perftracker.agent.summarize.step_align``). Each step: ``aten::addmm`` 1 ms,
``aten::mm`` (``mm_us`` per rank, seeded jitter), then ``c10d::allreduce_`` that waits for the
slowest rank; ``stall_us`` adds a wait to one rank's step (a peer that stopped profiling to export
its trace while this rank still records)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

T0_US = 4994475645721.0
HOST = "vm"


def job_docs(steps: dict[int, list[int]], mm_us: dict[int, float], stall_us: dict[int, dict[int, float]] | None = None,
             seed: int = 0, host: str = HOST) -> dict[int, dict[str, Any]]:
    """rank -> trace document. ``steps``: the step numbers each rank recorded."""
    rng = np.random.default_rng(seed)
    stall_us = stall_us or {}
    every = sorted(set().union(*map(set, steps.values())))
    t = T0_US
    plan: dict[int, tuple[float, dict[int, float], dict[int, float]]] = {}
    for n in every:
        work = {r: 1000.0 + mm_us[r] + float(rng.normal(0.0, 50.0)) for r in steps}
        wait = {r: max(work.values()) - work[r] + 150.0 + stall_us.get(r, {}).get(n, 0.0) for r in steps}
        plan[n] = (t, work, wait)
        t += max(work[r] + wait[r] for r in steps) + 300.0
    docs = {}
    for r, mine in steps.items():
        pid = 100 + r
        ev: list[dict[str, Any]] = []
        for n in mine:
            s, work, wait = plan[n]
            ev += [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": pid, "tid": pid,
                    "ts": s, "dur": work[r] + wait[r] + 100.0},
                   {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": pid, "tid": pid, "ts": s + 10.0,
                    "dur": 1000.0},
                   {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": pid, "tid": pid, "ts": s + 1020.0,
                    "dur": work[r] - 1000.0},
                   {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": pid, "tid": pid,
                    "ts": s + 20.0 + work[r], "dur": wait[r]}]
        docs[r] = {"schemaVersion": 1, "deviceProperties": [], "host_name": host, "displayTimeUnit": "ms",
                   "distributedInfo": {"backend": "gloo", "rank": r, "world_size": len(steps), "pg_count": 1,
                                       "pg_config": [{"pg_name": "0", "pg_desc": "default_pg",
                                                      "backend_config": "cpu:gloo", "pg_size": len(steps),
                                                      "ranks": sorted(steps)}]},
                   "traceEvents": ev}
    return docs


def strip_steps(doc: dict[str, Any]) -> dict[str, Any]:
    """The document without its ProfilerStep marks (a trace recorded without a schedule)."""
    return {**doc, "traceEvents": [e for e in doc["traceEvents"] if not e["name"].startswith("ProfilerStep#")]}


def write_job(directory: Path, docs: dict[int, dict[str, Any]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for r, doc in docs.items():
        (directory / f"rank{r}.json").write_text(json.dumps(doc))
    return directory
