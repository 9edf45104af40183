"""One profiling session on this node: samplers, START_WINDOW, summarizer, upload (docs/design.md §1 steps 3-4).

For each local worker of the job, in parallel:

1. start the samplers process (``python -m perftracker.agent.samplers --control-stdin``) and wait until it samples;
2. send START_WINDOW; the worker profiles from its next iteration boundary for ``window_s`` and
   answers WINDOW_DONE with its raw-window file and the window's real bounds;
3. tell the samplers those bounds and let them write their SampleSet;
4. summarize (one summarizer process at a time, one core, nice 19);

then upload the node's PatternSets in ONE request (``Uplink.upload_pattern_batch``, the columnar
wire form of ``perftracker.wire.patterns``), so a 100,000-GPU job sends 12,500 uploads, not 100,000.

A worker that fails (no answer in time, a window error, a summarizer error) is logged and left out:
the localizer's deadline names it as missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from perftracker.agent.daemon import handed_window
from perftracker.agent.daemon import helper_processes as processing
from perftracker.agent.daemon.agent_metrics import Metrics
from perftracker.agent.daemon.cpu_place import cpu_place
from perftracker.agent.daemon.workers import Worker

from perftracker.errors import PerftrackerError, SchemaError
from perftracker.model import PatternSet
from perftracker.model.names import is_name
from perftracker.model.window_cost import window_cost_fields
from perftracker.rundir import RunDirError, ensure_private_dir
from perftracker.warnonce import WarnOnce
from perftracker.wire import framing as wire
from perftracker.wire.framing import MessageType

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WindowOptions:
    samplers: bool = True
    window_slack_s: float = 5.0  # samplers' upper bound runs this long past window_s (plus 3 iterations)
    window_timeout_s: float = 60.0  # wait this long past window_s for a worker's WINDOW_DONE
    keep_files: bool = False  # keep raw windows, samples and pattern files after upload
    standby_samplers: bool = True  # keep one idle samplers process per worker, ready for the next session
    # ... started this long after the worker registers (and the summarizer warmed up then), not at
    # once: their start-up (~0.2 s of CPU each) would fall in a short job's first seconds, when no
    # automatic window opens anyway (the trigger hold, perftracker/runtime/trigger/defer.py); a
    # window before then starts its samplers itself (issue 30, docs/window-cost.md)
    standby_after_s: float = 20.0
    summarize_worker: bool = True  # one long-lived summarizer process instead of one per window
    processing: processing.ProcessingOptions = field(default_factory=processing.ProcessingOptions)


@dataclass
class SessionRun:
    session: str
    job: str
    window_s: float
    reason: str
    kind: str
    started: float = field(default_factory=time.monotonic)
    done: dict[int, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)  # rank -> WINDOW_DONE
    uploaded: set[int] = field(default_factory=set)
    failed: dict[int, str] = field(default_factory=dict)
    # summarized, waiting for the node's one upload: rank -> (PatternSet, files to delete after it)
    pending: dict[int, tuple[Any, list[Path]]] = field(default_factory=dict)


class PatternUploader(Protocol):
    """Where the node's patterns go: the localizer (``Upstream``, perftracker.agent.daemon.localizer_link).
    Both raise a PerftrackerError when the upload fails."""

    async def upload_patterns(self, ps: PatternSet) -> None: ...

    async def upload_pattern_batch(self, sets: Sequence[PatternSet]) -> None: ...


class WindowRunner:
    """Runs sessions for the daemon; ``uploader`` takes the summarized patterns to the localizer."""

    def __init__(self, run_dir: str, options: WindowOptions, metrics: Metrics, uploader: PatternUploader) -> None:
        self.options = options
        self.metrics = metrics
        self.uploader = uploader
        self.windows_dir = Path(run_dir) / "windows"  # the workers write their raw windows here
        self.work_dir = Path(run_dir) / "agent"  # the agent's own files (samples, patterns): 0700, ours only
        self._summarize_lock = asyncio.Lock()  # one summarizer at a time: one core
        self._standby: dict[tuple[str, int], asyncio.Task[tuple[Any, Path, int]]] = {}
        self._standby_seq = 0
        self._summarizer = processing.SummarizerWorker(options.processing) if options.summarize_worker else None
        self._warn_once = WarnOnce(log)
        # one window at a time per worker: a session opened while the previous one is still being
        # profiled or processed waits for it (the process can run one profile window only)
        self._worker_locks: dict[tuple[str, int], asyncio.Lock] = {}

    async def run_session(self, run: SessionRun, workers: Sequence[Worker]) -> None:
        log.info("session %s (%s, %s): %d local worker(s), window %.1f s", run.session, run.kind, run.reason,
                 len(workers), run.window_s)
        if run.kind == "hang":
            msg = wire.make_message(MessageType.SNAPSHOT, session=run.session)
            await asyncio.gather(*(send(w, msg) for w in workers))
            return
        loop = asyncio.get_running_loop()
        for w in workers:
            run.done[w.rank] = loop.create_future()
        results = await asyncio.gather(*(self.collect(run, w) for w in workers), return_exceptions=True)
        for w, res in zip(workers, results, strict=True):
            if isinstance(res, BaseException):
                run.failed[w.rank] = repr(res)
                log.error("session %s: rank %d: %r", run.session, w.rank, res)
        try:
            await self.upload_node(run)
        finally:
            for w in workers:
                if w.work_session == run.session:
                    w.work_session = ""
        self.metrics.session("uploaded" if not run.failed else "failed")
        log.info("session %s: uploaded ranks %s%s", run.session, sorted(run.uploaded),
                 f"; failed {run.failed}" if run.failed else "")
        if workers and not run.uploaded and run.failed:
            # nothing of this node reaches the localizer: say so in the training log (once, local rank 0)
            first = next(iter(run.failed.values()))
            text = (f"perftracker: session {run.session}: no report will come from {len(workers)} rank(s) on this "
                    f"node: {first}")
            notice = wire.make_message(MessageType.NOTICE, key="session-failed", text=text)
            await asyncio.gather(*(send(w, notice) for w in workers))

    async def collect(self, run: SessionRun, w: Worker) -> None:
        """Sample the worker over the window, wait for its raw events, summarize and upload; after
        the worker's previous session, if one is still running."""
        lock = self._worker_locks.setdefault((w.job, w.rank), asyncio.Lock())
        if lock.locked():
            log.info("session %s: rank %d waits for its previous session to finish", run.session, w.rank)
        async with lock:
            await self._collect(run, w)

    async def _collect(self, run: SessionRun, w: Worker) -> None:
        sampler = None
        samples_path: Path | None = None
        if self.options.samplers:
            now_ns = time.monotonic_ns()
            slack_s = min(self.options.window_slack_s + 3 * w.iteration_ms / 1e3, 60.0)
            end_ns = now_ns + int((run.window_s + slack_s + self.options.window_timeout_s) * 1e9)
            try:
                sampler, samples_path = await self._take_sampler(w, run.session, now_ns, end_ns)
            except (OSError, processing.ProcessingError) as exc:
                self._warn_once("sampler", "samplers not started (%s); patterns will have no utilization", exc)
        log.info("session %s: rank %d samplers %s after %.1f s; starting the window", run.session, w.rank,
                 "ready" if sampler is not None else "off", time.monotonic() - run.started)
        w.work_session = run.session  # heartbeats say so: the localizer keeps the session open meanwhile
        try:
            await send(w, wire.make_message(MessageType.START_WINDOW, session=run.session, window_s=run.window_s,
                                            reason=run.reason))  # the worker's window budget: manual or not
            wait_s = run.window_s + self.options.window_timeout_s
            try:
                done = await asyncio.wait_for(run.done[w.rank], wait_s)
            except TimeoutError:
                raise processing.ProcessingError(f"rank {w.rank} sent no window within {wait_s:.0f} s") from None
            log.info("session %s: rank %d window done after %.1f s", run.session, w.rank, time.monotonic() - run.started)
            if done.get("error") or not done.get("raw_path"):
                raise processing.ProcessingError(f"rank {w.rank} window failed: {done.get('error') or 'no raw file'}")
            await self.process_window(w, run.session, done, sampler, samples_path, run)
            sampler = None
        except processing.ProcessingError as exc:
            run.failed[w.rank] = str(exc)
            log.warning("session %s: %s", run.session, exc)
        finally:
            if w.work_session == run.session and w.rank not in run.pending:
                w.work_session = ""  # a summarized rank stays "working on" it until the node's upload
            if sampler is not None:
                await processing.stop_process(sampler)
            if w.writer is not None:
                self.prime(w)  # the next session's samplers, started after this window

    # ---------------------------------------------------------------- standby samplers
    def prime(self, w: Worker) -> None:
        """Start a standby samplers process for a worker: it idles until a session moves its start
        to "now", so a session does not wait for a Python process to start (seconds on a busy node)."""
        if self._summarizer is not None and self._summarizer._proc is None:
            asyncio.get_running_loop().create_task(self._summarizer.warm_up())
        if not self.options.samplers or not self.options.standby_samplers:
            return
        key = (w.job, w.rank)
        old = self._standby.pop(key, None)
        if old is not None:
            asyncio.get_running_loop().create_task(self._discard(old))
        self._standby_seq += 1
        path = self.work_dir / f"standby-{w.rank}-{self._standby_seq}.samples.npz"
        far_ns = time.monotonic_ns() + int(30 * 86400 * 1e9)

        async def spawn() -> tuple[Any, Path, int]:
            _private_dir(path.parent)
            return await processing.start_sampler(w.pid, w.training_tid, far_ns, far_ns + 1, path), path, w.pid

        self._standby[key] = asyncio.get_running_loop().create_task(spawn())

    async def _discard(self, task: asyncio.Task[tuple[Any, Path, int]]) -> None:
        with contextlib.suppress(Exception):
            proc, path, _ = await task
            await processing.stop_process(proc)
            path.unlink(missing_ok=True)

    def prime_later(self, w: Worker, still_current: Callable[[Worker], bool]) -> None:
        """``prime`` after ``standby_after_s``, if the worker is still the current one and has no
        standby samplers by then (a session primed them)."""
        delay_s = self.options.standby_after_s

        def go() -> None:
            if still_current(w) and (w.job, w.rank) not in self._standby and not w.work_session:
                self.prime(w)

        if delay_s <= 0:
            go()
        else:
            asyncio.get_running_loop().call_later(delay_s, go)

    def forget(self, w: Worker) -> None:
        """The worker left: stop its standby samplers."""
        task = self._standby.pop((w.job, w.rank), None)
        if task is not None:
            asyncio.get_running_loop().create_task(self._discard(task))

    async def _take_sampler(self, w: Worker, session: str, start_ns: int, end_ns: int) -> tuple[Any, Path]:
        task = self._standby.pop((w.job, w.rank), None)
        if task is not None:
            try:
                proc, path, pid = await task
                if pid == w.pid and proc.returncode is None and proc.stdin is not None:
                    proc.stdin.write(f"start {start_ns}\nend {end_ns}\n".encode())
                    await proc.stdin.drain()
                    return proc, path
                await processing.stop_process(proc)
            except (OSError, ConnectionError, processing.ProcessingError) as exc:
                log.info("standby samplers of rank %d unusable (%s); starting new ones", w.rank, exc)
        path = self.work_dir / session_dir_name(session) / f"samples-rank{w.rank}.npz"
        _private_dir(self.work_dir)
        _private_dir(path.parent)
        return await processing.start_sampler(w.pid, w.training_tid, start_ns, end_ns, path), path

    async def close(self) -> None:
        for key in list(self._standby):
            await self._discard(self._standby.pop(key))
        if self._summarizer is not None:
            await self._summarizer.close()

    async def process_window(self, w: Worker, session: str, done: dict[str, Any], sampler: Any,
                             samples_path: Path | None = None, run: SessionRun | None = None) -> None:
        samples: Path | None = None
        raw = self.worker_file(done.get("raw_path"), "raw_path")  # ProcessingError outside windows/
        own = str(done.get("samples_path") or "")
        own_path = self.worker_file(own, "samples_path") if own else None
        if own_path is not None and own_path.exists():  # the worker ran its own samplers
            samples = own_path
            if sampler is not None:
                await processing.stop_process(sampler)
        elif sampler is not None and samples_path is not None:
            try:
                await processing.finish_sampler(sampler, int(done.get("start_ns") or 0), int(done.get("end_ns") or 0),
                                                self.options.processing.sampler_grace_s)
                samples = samples_path if samples_path.exists() else None
            except processing.ProcessingError as exc:
                self._warn_once("sampler-failed", "samplers failed (%s); summarizing without utilization", exc)
        writer_pid = done.get("writer_pid")
        if isinstance(writer_pid, int) and not isinstance(writer_pid, bool) and writer_pid > 0:
            # written by a child that outlives the worker (its exit, issue 30)
            waited_s = await handed_window.wait_for_file(raw, writer_pid)
            log.info("session %s: rank %d's window, handed over at its exit, written %.1f s later", session,
                     w.rank, waited_s)
        _private_dir(self.work_dir)
        out = self.work_dir / (raw.stem + ".patterns")
        t0 = time.monotonic()
        async with self._summarize_lock:
            ps = await processing.summarize(raw, samples, out, self.options.processing, self._summarizer)
        cost = self._window_cost(done.get("cost"), w.rank)
        if cost:  # what the window cost and the budget, for the report's header (issue 30)
            ps = dataclasses.replace(ps, window_cost=cost)
        place = cpu_place(w.pid, w.training_tid)
        if place:  # which ranks share their cores (issue 31)
            ps = dataclasses.replace(ps, cpu_place=place)
        self.metrics.summarized(time.monotonic() - t0)
        if self.options.keep_files and samples is not None and samples.parent != raw.parent:
            samples = _keep_beside(samples, raw)  # `perftracker run --keep-windows` keeps both
        files = [p for p in (raw, out, samples) if p is not None]
        if run is not None:  # uploaded with the node's other ranks (upload_node)
            run.pending[w.rank] = (ps, files)
            return
        try:
            await self.uploader.upload_patterns(ps)
        except PerftrackerError as exc:
            self.metrics.upload("patterns", ok=False)
            raise processing.ProcessingError(f"upload of rank {w.rank}'s patterns failed: {exc}") from None
        self.metrics.upload("patterns", ok=True)
        log.info("session %s: uploaded rank %d's %d patterns (%.1f s to summarize)", session, w.rank,
                 len(ps.patterns), time.monotonic() - t0)
        self._cleanup(files)

    def _window_cost(self, value: Any, rank: int) -> dict[str, float]:
        """WINDOW_DONE's ``cost`` (window_cost.report_fields), checked; a bad one is dropped with a warning."""
        if value is None:
            return {}
        try:
            if not isinstance(value, dict):
                raise SchemaError(f"not an object: {value!r:.60}")
            return window_cost_fields(value, f"rank {rank}'s window cost")
        except SchemaError as exc:
            self._warn_once("window-cost", "window cost dropped (the report shows none): %s", exc)
            return {}

    async def upload_node(self, run: SessionRun) -> None:
        """Upload the summarized ranks of this node in one request; a failure fails them all."""
        if not run.pending:
            return
        ranks = sorted(run.pending)
        sets = [run.pending[r][0] for r in ranks]
        t0 = time.monotonic()
        try:
            await self.uploader.upload_pattern_batch(sets)
        except PerftrackerError as exc:
            self.metrics.upload("patterns", ok=False)
            kept = sorted({str(f.parent) for r in ranks for f in run.pending[r][1]})
            for r in ranks:
                run.failed[r] = f"upload of rank {r}'s patterns failed: {exc} (its window and patterns stay in {', '.join(kept)})"
            log.warning("session %s: upload of rank(s) %s failed: %s; their windows and patterns stay in %s",
                        run.session, ranks, exc, ", ".join(kept))
            return
        finally:
            pending, run.pending = run.pending, {}
        self.metrics.upload("patterns", ok=True)
        run.uploaded.update(ranks)
        log.info("session %s: uploaded rank(s) %s in one request (%d patterns, %.2f s)", run.session, ranks,
                 sum(len(ps.patterns) for ps in sets), time.monotonic() - t0)
        for _, files in pending.values():
            self._cleanup(files)

    def _cleanup(self, files: list[Path]) -> None:
        if not self.options.keep_files:
            for p in files:
                with contextlib.suppress(OSError):
                    p.unlink()

    def worker_file(self, value: Any, what: str) -> Path:
        """A file a worker names (its raw window, its samples): only a regular file directly in
        ``windows/``, never a symlink or a path elsewhere (the agent reads, then deletes it)."""
        if not isinstance(value, str) or not value or len(value) > 4096 or "\0" in value:
            raise processing.ProcessingError(f"{what}: not a path")
        p = Path(value)
        base = self.windows_dir.resolve()
        try:
            parent = p.parent.resolve(strict=True)
        except OSError:
            raise processing.ProcessingError(f"{what} {value[:200]!r}: its directory does not exist") from None
        if parent != base:
            raise processing.ProcessingError(f"{what} {value[:200]!r} is outside the run dir's windows/ directory; "
                                             "ignored")
        p = base / p.name
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            return p
        except OSError as exc:
            raise processing.ProcessingError(f"{what} {p}: {exc.strerror}") from None
        if not stat.S_ISREG(st.st_mode):
            raise processing.ProcessingError(f"{what} {p} is not a regular file (a symlink?); ignored")
        return p


def _private_dir(path: Path) -> None:
    try:
        ensure_private_dir(path, what="agent work dir")
    except RunDirError as exc:
        raise processing.ProcessingError(str(exc)) from None


def session_dir_name(session: str) -> str:
    """A session id as a directory name, or ProcessingError: ids come from the localizer."""
    if not is_name(session):  # the one pattern (full match): no "/", never "." or ".."
        raise processing.ProcessingError(f"session id {session[:80]!r} is not a safe name")
    return session


async def send(w: Worker, msg: dict[str, Any]) -> None:
    """Send to a worker if it is connected; a lost connection is only logged."""
    writer = w.writer
    if writer is None:
        return
    try:
        await wire.write_message(writer, msg)
    except wire.ConnectionClosed as exc:
        log.info("cannot reach rank %d: %s", w.rank, exc)


def _keep_beside(samples: Path, raw: Path) -> Path:
    """Move a kept window's samples next to its raw window, named for it (``<session>-rank<r>.samples.npz``)."""
    dest = raw.with_name(raw.name.removesuffix(".raw.npz") + ".samples.npz")
    try:
        os.replace(samples, dest)
    except OSError as exc:
        log.info("samples %s not moved beside %s: %s", samples, raw.name, exc)
        return samples
    return dest
