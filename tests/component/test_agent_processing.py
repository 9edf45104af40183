"""The agent's helper processes: the long-lived summarizer worker and the samplers control protocol."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest
from agent_helpers import synthetic_window
from perftracker.agent.daemon import helper_processes as processing

from perftracker.model import Category
from perftracker.model.raw_window import SampleSet


def _raw(tmp_path: Path, name: str, compute_ms: float) -> Path:
    t = time.monotonic_ns()
    raw = synthetic_window("j", "s1", 0, 1, threading.get_native_id(), t, t + int(1e9), compute_ms)
    return raw.save(tmp_path / f"{name}.npz")


def test_summarizer_worker_serves_several_windows_and_survives_a_bad_one(tmp_path: Path) -> None:
    async def go() -> None:
        worker = processing.SummarizerWorker()
        try:
            ps1 = await processing.summarize(_raw(tmp_path, "a", 8.0), None, tmp_path / "a.patterns", worker=worker)
            pid = worker._proc.pid  # type: ignore[union-attr]
            bad = tmp_path / "bad.npz"
            bad.write_bytes(b"not a raw window")
            with pytest.raises(processing.ProcessingError, match="bad.npz"):
                await worker.run(bad, None, tmp_path / "bad.patterns")
            ps2 = await processing.summarize(_raw(tmp_path, "b", 16.0), None, tmp_path / "b.patterns", worker=worker)
            assert worker._proc.pid == pid, "one process for all windows"  # type: ignore[union-attr]
            mm1 = next(p for p in ps1.patterns if p.key == "aten::mm")
            mm2 = next(p for p in ps2.patterns if p.key == "aten::mm")
            assert mm1.category is Category.COMPUTE and mm2.beta > mm1.beta
            # pinned to one core at low priority
            with open(f"/proc/{pid}/stat") as fh:
                nice = int(fh.read().rsplit(")", 1)[1].split()[16])
            assert nice == 19
            assert len(os.sched_getaffinity(pid)) == 1
        finally:
            await worker.close()

    asyncio.run(go())


def test_one_shot_fallback_when_the_worker_is_gone(tmp_path: Path) -> None:
    async def go() -> None:
        worker = processing.SummarizerWorker()
        await worker._ensure()
        worker._proc.kill()  # type: ignore[union-attr]
        await worker._proc.wait()  # type: ignore[union-attr]
        worker._proc.returncode  # noqa: B018 - the next request restarts it
        ps = await processing.summarize(_raw(tmp_path, "c", 8.0), None, tmp_path / "c.patterns", worker=worker)
        assert any(p.key == "aten::mm" for p in ps.patterns)
        await worker.close()

    asyncio.run(go())


def test_samplers_follow_the_window_bounds_they_are_told(tmp_path: Path) -> None:
    """A standby sampler idles until told to start, then stops at the bounds it is given."""

    async def go() -> None:
        far = time.monotonic_ns() + int(86400e9)
        out = tmp_path / "s.npz"
        stop = threading.Event()
        def busy() -> None:
            while not stop.is_set():
                sum(range(1000))

        spin = threading.Thread(target=busy, daemon=True)
        spin.start()
        try:
            proc = await processing.start_sampler(os.getpid(), spin.native_id, far, far + 1, out)
            await asyncio.sleep(0.5)
            assert not out.exists() and proc.returncode is None  # idle
            start = time.monotonic_ns()
            assert proc.stdin is not None
            proc.stdin.write(f"start {start}\nend {start + int(30e9)}\n".encode())
            await proc.stdin.drain()
            await asyncio.sleep(1.0)
            await processing.finish_sampler(proc, start, time.monotonic_ns(), 20.0)
        finally:
            stop.set()
        cpu = SampleSet.load(out).get("cpu")
        assert cpu is not None and len(cpu.t_ns) > 100
        assert cpu.t_ns.min() >= start - int(0.1e9)
        assert float(cpu.value.max()) > 0.3 and float(cpu.value.mean()) > 0.02  # it measured the busy thread

    asyncio.run(go())
