"""The agent's helper processes for one window: the hardware samplers and the summarizer.

Both run as separate processes so that the agent's event loop (and the training processes) never
wait on them. The summarizer is pinned to one core and runs at the lowest priority (nice 19), as
docs/design.md §1 asks: ``python -m perftracker.agent.daemon.summarize_one RAW --samples FILE --out PATTERNS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from perftracker.errors import PerftrackerError
from perftracker.model import PatternSet
from perftracker.role import SAMPLER, SUMMARIZER, child_env

log = logging.getLogger(__name__)


class ProcessingError(PerftrackerError):
    """A sampler or summarizer process failed, timed out or wrote nothing readable."""


@dataclass(frozen=True)
class ProcessingOptions:
    summarize_nice: int = 19
    summarize_cpu: int | None = None  # None: the last core this agent may use
    summarize_timeout_s: float = 180.0
    sampler_grace_s: float = 10.0  # a sampler may run this long past its end_ns before it is killed


def pick_core() -> int:
    try:
        return max(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return 0


def low_priority(cpu: int | None, nice: int) -> Callable[[], None]:
    """A preexec_fn: pin the child to one core and lower its priority (best effort)."""

    def apply() -> None:
        with contextlib.suppress(OSError, AttributeError):
            os.sched_setaffinity(0, {cpu if cpu is not None else pick_core()})
        with contextlib.suppress(OSError):
            os.nice(nice)

    return apply


def sampler_command(pid: int, tid: int, start_ns: int, end_ns: int, out: str | Path,
                    control: bool = True) -> list[str]:
    cmd = [sys.executable, "-m", "perftracker.agent.samplers", "--pid", str(pid), "--tid", str(tid),
           "--start-ns", str(start_ns), "--end-ns", str(end_ns), "--out", str(out)]
    return cmd + (["--control-stdin"] if control else [])


async def start_sampler(pid: int, tid: int, start_ns: int, end_ns: int, out: str | Path,
                        ready_timeout_s: float = 15.0) -> asyncio.subprocess.Process:
    """Start the samplers over [start_ns, end_ns] (an upper bound); returns once they sample."""
    proc = await asyncio.create_subprocess_exec(
        *sampler_command(pid, tid, start_ns, end_ns, out), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=child_env(SAMPLER))
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), ready_timeout_s)
    except TimeoutError:
        line = b""
    if line.strip() != b"ready":
        await stop_process(proc)
        err = b""
        if proc.stderr is not None:
            with contextlib.suppress(Exception):
                err = await asyncio.wait_for(proc.stderr.read(), 1.0)
        raise ProcessingError(f"samplers for pid {pid} did not start: {err.decode(errors='replace')[-300:]}")
    return proc


async def finish_sampler(proc: asyncio.subprocess.Process, start_ns: int, end_ns: int, timeout_s: float) -> None:
    """Tell the samplers the window's real bounds and wait until they have written their file."""
    if proc.stdin is not None and proc.returncode is None:
        with contextlib.suppress(ConnectionError, OSError):
            if start_ns > 0:
                proc.stdin.write(f"start {start_ns}\n".encode())
            if end_ns > 0:
                proc.stdin.write(f"end {end_ns}\n".encode())
            proc.stdin.write(b"stop\n")
            await proc.stdin.drain()
            proc.stdin.close()
    await finish_process(proc, timeout_s, f"samplers (pid {proc.pid})")


def summarize_command(raw: str | Path, samples: str | Path | None, out: str | Path) -> list[str]:
    cmd = [sys.executable, "-m", "perftracker.agent.daemon.summarize_one", str(raw)]
    if samples:
        cmd += ["--samples", str(samples)]
    return cmd + ["--out", str(out)]


async def start_process(cmd: Sequence[str], preexec: Callable[[], None] | None = None) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE, preexec_fn=preexec, env=child_env(SUMMARIZER),
    )


async def finish_process(proc: asyncio.subprocess.Process, timeout_s: float, what: str) -> str:
    """Wait for ``proc``; kill it after ``timeout_s``. Returns its stderr tail; raises ProcessingError on failure."""
    try:
        _, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise ProcessingError(f"{what} timed out after {timeout_s:.0f} s") from None
    tail = (err or b"").decode(errors="replace").strip()[-2000:]
    if proc.returncode != 0:
        raise ProcessingError(f"{what} exited with code {proc.returncode}: {tail[-500:]}")
    return tail


async def stop_process(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 2.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


def read_pattern_set(path: str | Path) -> PatternSet:
    """The summarizer's output: PatternSet.to_bytes() (zlib JSON) or plain JSON of to_dict()."""
    data = Path(path).read_bytes()
    if data[:1] in (b"{", b" ", b"\n"):
        return PatternSet.from_dict(json.loads(data))
    return PatternSet.from_bytes(data)


class SummarizerWorker:
    """``python -m perftracker.agent.daemon.summarizer_worker``: one long-lived summarizer process (one core, nice 19).

    Not thread-safe: the caller runs one request at a time. A worker that dies or times out is
    killed and replaced on the next request."""

    def __init__(self, options: ProcessingOptions | None = None) -> None:
        self.options = options or ProcessingOptions()
        self._proc: asyncio.subprocess.Process | None = None
        self._starting: asyncio.Lock | None = None

    async def _ensure(self) -> asyncio.subprocess.Process:
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._proc is None or self._proc.returncode is not None:
                self._proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "perftracker.agent.daemon.summarizer_worker", stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=child_env(SUMMARIZER),
                    preexec_fn=low_priority(self.options.summarize_cpu, self.options.summarize_nice))
            return self._proc

    async def warm_up(self) -> None:
        """Start the process ahead of the first window (its imports take seconds on a busy node)."""
        with contextlib.suppress(OSError):
            await self._ensure()

    async def run(self, raw: str | Path, samples: str | Path | None, out: str | Path) -> None:
        proc = await self._ensure()
        assert proc.stdin is not None and proc.stdout is not None
        req = {"raw": str(raw), "samples": str(samples) if samples else None, "out": str(out)}
        try:
            proc.stdin.write((json.dumps(req) + "\n").encode())
            await proc.stdin.drain()
            line = await asyncio.wait_for(proc.stdout.readline(), self.options.summarize_timeout_s)
        except (TimeoutError, ConnectionError, OSError) as exc:
            await self.close()
            raise ProcessingError(f"summarizer for {raw} failed: {type(exc).__name__} {exc}") from None
        if not line:
            await self.close()
            raise ProcessingError(f"summarizer for {raw} exited")
        try:
            answer = json.loads(line)
        except ValueError:
            await self.close()
            raise ProcessingError(f"summarizer for {raw}: unreadable answer {line[:100]!r}") from None
        if answer.get("rc") != 0:
            raise ProcessingError(f"summarizer for {raw} failed: {str(answer.get('error', ''))[-500:]}")

    async def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.stdin is not None:
                with contextlib.suppress(Exception):
                    proc.stdin.close()
            await stop_process(proc)


async def summarize(raw: str | Path, samples: str | Path | None, out: str | Path,
                    options: ProcessingOptions | None = None, worker: SummarizerWorker | None = None) -> PatternSet:
    """Summarize one raw window in a separate low-priority process and read the PatternSet back.

    With ``worker`` the long-lived summarizer process does it; otherwise (or if that fails) a
    one-shot ``python -m perftracker.agent.daemon.summarize_one``."""
    opts = options or ProcessingOptions()
    done = False
    if worker is not None:
        try:
            await worker.run(raw, samples, out)
            done = True
        except ProcessingError as exc:
            log.warning("%s; retrying in a one-shot summarizer process", exc)
    if not done:
        cmd = summarize_command(raw, samples, out)
        proc = await start_process(cmd, low_priority(opts.summarize_cpu, opts.summarize_nice))
        tail = await finish_process(proc, opts.summarize_timeout_s, f"summarizer for {raw}")
        if tail:
            log.debug("summarizer: %s", tail)
    try:
        return read_pattern_set(out)
    except (OSError, PerftrackerError, ValueError) as exc:
        raise ProcessingError(f"summarizer wrote no readable PatternSet to {out}: {exc}") from None
