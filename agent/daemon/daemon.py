"""The node agent: one per node (or per run dir), between the training processes and the localizer.

- Serves the Unix socket ``<run_dir>/agent.sock`` (perftracker.wire.framing). Workers register, send
  heartbeats, iteration statistics, triggers, hang snapshots and WINDOW_DONE.
- Registers each job's local workers with the localizer and forwards heartbeats (with liveness
  from procfs, so dead or stopped ranks are known), triggers and hang snapshots.
- Long-polls the localizer for sessions, one poller per job. For a profiling session it sends
  START_WINDOW to the job's workers, runs the samplers process per worker over the window, then the
  summarizer in a separate process (one core, nice 19), and uploads each PatternSet. For a hang
  session it asks the workers for hang snapshots.
- Serves Prometheus metrics and a liveness endpoint (perftracker.agent.daemon.agent_metrics) over HTTP when a metrics port is given.

The localizer-facing loops (registration, heartbeats, triggers, snapshots, the long poll) are in
perftracker.agent.daemon.localizer_link; the per-rank registry in perftracker.agent.daemon.workers; session windows in perftracker.agent.daemon.window_session.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perftracker.agent.daemon.agent_metrics import Metrics
from perftracker.agent.daemon.job_links import JobLinks
from perftracker.agent.daemon.job_routes import JobServer
from perftracker.agent.daemon.localizer_client import TriggerNotice
from perftracker.agent.daemon.localizer_link import LocalizerUplink, Upstream
from perftracker.agent.daemon.options import AgentOptions
from perftracker.agent.daemon.peer import PeerCred, peer_cred
from perftracker.agent.daemon.window_session import SessionRun, WindowRunner
from perftracker.agent.daemon.worker_exits import (
    ExitStatus,
    error_file_of,
    is_failure,
    memory_cgroup,
    oom_killed,
    read_error_file,
    watch_exit,
)
from perftracker.agent.daemon.workers import (
    FOLLOW_S,
    SESSION_RE,
    BadWorkerMessage,
    Worker,
    check_worker_message,
    liveness,
    phase_rows,
    select_job,
)

from perftracker.model import HangSnapshot
from perftracker.rundir import RunDirError, ensure_private_dir, write_private
from perftracker.warnonce import WarnOnce
from perftracker.wire import framing as wire
from perftracker.wire.framing import MessageType

log = logging.getLogger(__name__)

AGENT_INFO = "agent.json"
MAX_WORKERS = 256  # connected workers per agent (issue 46); a node runs one per GPU or a few dozen CPU ranks
MAX_RANKS_PER_PROCESS = 4  # a training process is one rank (a test harness may hold a few)
REGISTER_TIMEOUT_S = 10.0  # a worker connection sends REGISTER within this, or is closed


def death_snapshot(w: Worker, status: ExitStatus | None, oom: bool, failed_ns: int) -> HangSnapshot:
    """The crash snapshot the agent sends for a worker that failed without sending its own: how it
    ended (perftracker.agent.daemon.worker_exits), its last iteration and idle time from its heartbeats; no stack."""
    if oom:
        end, code = "oom", 9
        what = "killed by the OOM killer"
        if w.cgroup is not None:
            what += f" ({w.cgroup.describe()})"
    elif status is not None:
        end, code, what = status.kind, status.code, status.describe()
    else:
        end, code, what = "dead", 0, "process died (exit status not seen)"
    message, _ = read_error_file(w.error_file, owner=w.uid)  # only a file of the worker's own uid (issue 46)
    if message and not oom:  # torchrun's @record wrote the exception the process died of
        end, what = "exception", f"{message} ({what})"
    return HangSnapshot(job=w.job, rank=w.rank, world_size=w.world_size, host=w.host, pid=w.pid,
                        taken_ns=time.time_ns(), last_iteration=w.iteration, idle_s=round(w.last_event_age_s, 3),
                        stack=(), last_event="", error=what[:300], end=end, exit_code=code, failed_ns=failed_ns)


class AgentDaemon:
    def __init__(self, options: AgentOptions, uplink: LocalizerUplink,
                 idle_check: Callable[[], bool] | None = None, job_server: JobServer | None = None) -> None:
        """``job_server``: this agent's own localizer, which may serve a multi-node job to the job's
        other nodes; ``uplink`` a ``RoutedUplink`` to send such a job to another node's (issue 42)."""
        self.options = options
        self.uplink = uplink
        self.agent_id = options.agent_id or f"{options.host}-{os.getpid()}"
        self.idle_check = idle_check  # extra condition for idle exit (e.g. the embedded localizer is idle)
        self.metrics = Metrics()
        self.workers: dict[tuple[str, int], Worker] = {}
        self.sessions: dict[str, SessionRun] = {}
        self.metrics_url = ""
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._pollers: dict[str, asyncio.Task[None]] = {}
        self._first_death: dict[str, tuple[int, float]] = {}  # job -> (rank, monotonic s) of its first death
        self._stopped = asyncio.Event()
        self._unregistered = 0  # worker connections open that have not registered yet
        self.upstream = Upstream(options, self.agent_id, uplink, self.metrics, self.workers, self._spawn,
                                 self._on_notice)
        self.windows = WindowRunner(options.run_dir, options.window, self.metrics, self.upstream)
        # one localizer per job across nodes (issue 42)
        self.links = JobLinks(self.agent_id, uplink, job_server, self.upstream, self._pollers, self.workers,
                              self._spawn)
        self._last_connected = time.monotonic()
        self._warn_once = WarnOnce(log)
        self._metrics_server: Any = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def socket_path(self) -> str:
        return wire.socket_path(self.options.run_dir)

    async def start(self) -> None:
        self.links.loop = asyncio.get_running_loop()
        gid = self.options.socket_gid
        # refuses a run dir another user owns or one writable by group/others (RunDirError)
        ensure_private_dir(self.options.run_dir, group_gid=gid)
        self._prepare_windows_dir(gid)
        path = self.socket_path
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # the caller holds agent.lock, so a leftover socket is stale
        old_umask = os.umask(0o177)  # the socket is born 0600: no window in which others may connect
        try:
            self._server = await asyncio.start_unix_server(self._handle_worker, path=path,
                                                           limit=wire.MAX_FRAME_BYTES + 16)
        finally:
            os.umask(old_umask)
        if gid is not None:
            os.chown(path, -1, gid, follow_symlinks=False)
            os.chmod(path, 0o660)
        else:
            os.chmod(path, 0o600)
        if self.options.metrics_port is not None:
            await self._start_metrics()
        self._spawn(self.upstream.heartbeat_loop(), "heartbeats")
        if self.options.idle_exit_s > 0:
            self._spawn(self._idle_loop(), "idle")
        self.write_info()
        log.info("agent %s listening on %s%s", self.agent_id, path,
                 f", metrics at {self.metrics_url}" if self.metrics_url else "")

    def _prepare_windows_dir(self, gid: int | None) -> None:
        """``windows/``, where the workers write their raw windows: 0700, ours; with a socket group,
        2770 with that group (the agent's own files are in ``agent/``, never in here)."""
        d = Path(self.options.run_dir) / "windows"
        if gid is None:
            ensure_private_dir(d, what="windows dir")
            return
        with contextlib.suppress(FileExistsError):
            os.mkdir(d, 0o700)
        st = os.lstat(d)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise RunDirError(f"windows dir {d}: not a directory owned by this user; refusing it")
        os.chown(d, -1, gid, follow_symlinks=False)
        os.chmod(d, 0o2770)

    def write_info(self, **extra: Any) -> None:
        info = {"pid": os.getpid(), "agent_id": self.agent_id, "socket": self.socket_path,
                "metrics_url": self.metrics_url, "localizer_url": self.uplink.url,
                "started_wall_ns": time.time_ns(), **extra}
        path = Path(self.options.run_dir) / AGENT_INFO
        try:
            write_private(path, json.dumps(info))  # 0600, never through a planted symlink
        except OSError as exc:
            self._warn_once("info", "cannot write %s: %s", path, exc)

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    def request_stop(self) -> None:
        self._stopped.set()

    async def stop(self) -> None:
        self._stopped.set()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
        for w in self.workers.values():
            if w.writer is not None:
                w.writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.windows.close(), 5)
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._metrics_server is not None:
            self._metrics_server.close()
        for name in (wire.SOCKET_NAME, AGENT_INFO):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.options.run_dir, name))

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("agent task %s failed: %r", task.get_name(), task.exception(), exc_info=task.exception())

    # ------------------------------------------------------------------ workers
    async def _handle_worker(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        worker: Worker | None = None
        self._unregistered += 1
        try:
            if self._unregistered > MAX_WORKERS:  # connections that have not registered yet (issue 46)
                self._unregistered -= 1
                self._warn_once("too-many-connections", "closing worker connections past %d unregistered ones",
                                MAX_WORKERS)
                return
            try:  # a connection that never registers does not hold an fd forever
                msg = await asyncio.wait_for(wire.read_message(reader), REGISTER_TIMEOUT_S)
            except TimeoutError:
                return
            finally:
                self._unregistered -= 1
            if msg["type"] != MessageType.REGISTER.value:
                raise wire.WireError(f"first message must be register, got {msg['type']}")
            if msg["protocol"] != wire.PROTOCOL_VERSION:
                await wire.write_message(writer, {"type": "ack", "ok": False,
                                                  "error": f"protocol {msg['protocol']} unsupported"})
                return
            try:
                check_worker_message(msg)
            except BadWorkerMessage as exc:
                await wire.write_message(writer, wire.make_message(MessageType.ACK, ok=False,
                                                                   error=f"register refused: {exc}"))
                self._warn_once("bad-register", "refused a worker registration: %s", exc)
                return
            cred = peer_cred(writer.get_extra_info("socket"))
            refusal = self._peer_refusal(msg, cred)
            if refusal:
                await wire.write_message(writer, wire.make_message(MessageType.ACK, ok=False, error=refusal))
                self._warn_once(f"peer-{msg['pid']}", "refused a worker registration: %s", refusal)
                return
            holder = self.workers.get((msg["job"], msg["rank"]))
            if holder is not None and holder.connected and holder.pid != msg["pid"] and liveness(holder.pid, holder.started)[0]:
                # two live processes claim one rank of one job (e.g. two runs of the same script): keep
                # the first; the second retries with backoff and gets in once the first is gone
                await wire.write_message(writer, wire.make_message(
                    MessageType.ACK, ok=False, error=f"rank {msg['rank']} of job {msg['job']!r} is already connected "
                    f"(pid {holder.pid}); set PERFTRACKER_JOB_ID to tell the jobs apart"))
                self._warn_once(f"dup-{msg['job']}-{msg['rank']}", "refused pid %d: rank %d of job %s is already "
                                "connected from pid %d", msg["pid"], msg["rank"], msg["job"], holder.pid)
                return
            worker = self._register_worker(msg, writer, uid=cred.uid if cred is not None else -1)
            features = self.links.features()
            await wire.write_message(writer, wire.make_message(MessageType.ACK, ok=True, agent_id=self.agent_id,
                                                               features=features))
            while True:
                try:
                    msg = await wire.read_message(reader)
                except wire.BadFrameBody as exc:  # read whole, the stream in step: ignored (issue 46)
                    self._warn_once(f"badframe-{worker.job}-{worker.rank}", "ignoring a frame of rank %d (job %s): %s",
                                    worker.rank, worker.job, exc)
                    continue
                worker.last_seen = time.monotonic()
                try:
                    check_worker_message(msg)
                except BadWorkerMessage as exc:  # ignored: the worker's training goes on
                    self._warn_once(f"bad-{worker.job}-{worker.rank}-{msg['type']}",
                                    "ignoring a %s message of rank %d (job %s): %s", msg["type"], worker.rank,
                                    worker.job, exc)
                    continue
                await self._on_message(worker, msg)
        except wire.ConnectionClosed:
            pass
        except wire.WireError as exc:
            log.warning("dropping a worker connection after a bad frame: %s", exc)
        except asyncio.CancelledError:
            raise
        finally:
            if worker is not None and worker.writer is writer:
                worker.writer = None
                self.windows.forget(worker)
                self._update_worker_metrics(worker.job)
                log.info("worker rank %d of job %s disconnected", worker.rank, worker.job)
                alive, state = liveness(worker.pid, worker.started)
                if not alive:
                    self._fail_pending(worker, f"worker process {state}")
                if not self._stopped.is_set():
                    self._spawn(self._on_disconnect(worker, time.monotonic(), time.time_ns()), "disconnect")
            writer.close()

    def _peer_refusal(self, msg: dict[str, Any], cred: PeerCred | None) -> str:
        """Why a registration is refused, "" when it is not. The worker's pid is the kernel's
        (``SO_PEERCRED``: ``msg["pid"]`` is replaced), at most ``MAX_RANKS_PER_PROCESS`` live
        registrations per process and ``MAX_WORKERS`` connected workers per agent (issue 46: 30
        registrations naming one pid started 30 samplers processes, 825 MB)."""
        if cred is not None and cred.pid > 0:
            if cred.pid != msg["pid"]:
                self._warn_once(f"pid-{cred.pid}", "a worker declared pid %d but the kernel says %d: using %d",
                                msg["pid"], cred.pid, cred.pid)
            msg["pid"] = cred.pid
        key = (msg["job"], msg["rank"])
        connected = [(k, w) for k, w in self.workers.items() if w.connected]
        if sum(1 for k, w in connected if w.pid == msg["pid"] and k != key) >= MAX_RANKS_PER_PROCESS:
            return f"process {msg['pid']} already holds {MAX_RANKS_PER_PROCESS} ranks"
        if len(connected) >= MAX_WORKERS and all(k != key for k, _ in connected):
            return f"this agent already serves {len(connected)} workers (at most {MAX_WORKERS})"
        return ""

    def _register_worker(self, msg: dict[str, Any], writer: asyncio.StreamWriter, uid: int = -1) -> Worker:
        key = (msg["job"], msg["rank"])
        old = self.workers.get(key)
        if old is not None and old.writer is not None and old.writer is not writer:
            old.writer.close()  # a reconnect (or a restarted rank) replaces the old connection
        started = 0.0
        with contextlib.suppress(Exception):
            from perftracker.agent.daemon.liveness import started_at

            started = started_at(msg["pid"])
        w = Worker(job=msg["job"], rank=msg["rank"], world_size=msg["world_size"], local_rank=msg["local_rank"],
                   pid=msg["pid"], training_tid=msg["training_tid"], host=msg["host"], started=started,
                   writer=writer, cgroup=memory_cgroup(msg["pid"]), error_file=error_file_of(msg["pid"]), uid=uid)
        self.workers[key] = w
        self._last_connected = time.monotonic()
        self._update_worker_metrics(w.job)
        log.info("worker rank %d/%d of job %s registered (pid %d)", w.rank, w.world_size, w.job, w.pid)
        self.links.on_register(w.job, msg)  # a multi-node job: register where its localizer turns out to be
        self.upstream.schedule_register(w.job)
        self.windows.prime_later(w, lambda x: self.workers.get((x.job, x.rank)) is x and x.connected)
        if w.job not in self._pollers and w.job not in self.upstream.held:
            self._pollers[w.job] = self._spawn(self.upstream.poll_loop(w.job), f"poll-{w.job}")
        return w

    def _update_worker_metrics(self, job: str) -> None:
        n = sum(1 for w in self.workers.values() if w.job == job and w.connected)
        self.metrics.workers(job, n)

    def job_workers(self, job: str, connected: bool = True) -> list[Worker]:
        return select_job(self.workers.values(), job, connected)

    async def _on_message(self, w: Worker, msg: dict[str, Any]) -> None:
        kind = msg["type"]
        if kind == MessageType.HEARTBEAT.value:
            w.iteration = msg["iteration"]
            w.phase = msg["phase"]
            w.last_event_age_s = float(msg.get("idle_s") or 0.0)
            self.metrics.heartbeat(w.job, w.rank, w.iteration, w.phase or "")
            if w.phase != "exited":  # the OOM baseline: its memory cgroup (it may have moved) and kill count
                w.cgroup = memory_cgroup(w.pid) or w.cgroup
        elif kind == MessageType.ITER_STATS.value:
            w.iteration = msg["iteration"]
            w.iteration_ms = float(msg.get("mean_ms") or 0.0)
            w.min_ms = float(msg.get("min_ms") or 0.0)
            w.phases_ms = phase_rows(msg.get("phases_ms"))
            w.phases_before_ms = phase_rows(msg.get("phases_before_ms"))
            self.metrics.iteration_times(w.job, w.rank, w.iteration, msg.get("recent_ms") or ())
        elif kind == MessageType.TRIGGER.value:
            self.metrics.trigger(w.job)
            window_s = msg.get("window_s")
            window_s = float(window_s) if isinstance(window_s, (int, float)) and 0.1 <= window_s <= 600 else None
            self._spawn(self.upstream.forward_trigger(w, msg["reason"], msg["detail"], window_s, msg.get("detection")),
                        "trigger")
        elif kind == MessageType.BLOCKED.value:
            log.warning("rank %d of job %s reports the job blocked: %s", w.rank, w.job, msg["detail"])
        elif kind == MessageType.HANG_SNAPSHOT.value:
            if isinstance(msg["snapshot"], dict) and msg["snapshot"].get("end"):
                w.crash_sent = True  # its own crash report: the agent adds none at its exit
            self._spawn(self.upstream.upload_snapshot(w, msg["snapshot"]), "hang-snapshot")
        elif kind == MessageType.WINDOW_DONE.value:
            self._on_window_done(w, msg)
        elif kind == MessageType.JOB_SERVE.value:
            self._spawn(self.links.serve(w, msg), "job-serve")
        elif kind == MessageType.JOB_ROUTE.value:
            self.links.route(w, msg)

    def _fail_pending(self, w: Worker, error: str) -> None:
        for run in self.sessions.values():
            fut = run.done.get(w.rank)
            if run.job == w.job and fut is not None and not fut.done():
                fut.set_result({"error": error, "raw_path": "", "start_ns": 0, "end_ns": 0})

    def _on_window_done(self, w: Worker, msg: dict[str, Any]) -> None:
        run = self.sessions.get(msg["session"])
        fut = run.done.get(w.rank) if run is not None else None
        if fut is not None and not fut.done():
            fut.set_result(msg)
            return
        if run is None and msg["raw_path"] and not msg["error"]:
            try:
                self.windows.worker_file(msg["raw_path"], "raw_path")
            except Exception as exc:  # noqa: BLE001 - a path outside windows/: never read nor deleted
                self._warn_once(f"bad-raw-{w.job}-{w.rank}", "rank %d of job %s: %s", w.rank, w.job, exc)
                return
            # a window started by a previous agent (we restarted mid-window): still summarize and upload it
            log.info("rank %d finished a window of session %s started by an earlier agent; uploading it",
                     w.rank, msg["session"])
            self._spawn(self.windows.process_window(w, msg["session"], msg, None), f"late-{msg['session']}")

    async def _on_disconnect(self, w: Worker, t: float, t_wall_ns: int = 0) -> None:
        """A worker's socket closed: a reconnect, a normal exit, or a failure (issue 22).

        The socket closes as the process exits, a moment before it is a zombie: the agent reads its
        wait status while it is one (perftracker.agent.daemon.worker_exits.watch_exit). A worker that said "exited" with exit
        status 0 (or one not seen) ended normally; one that said "exited" with a nonzero status, or
        died without saying it (a signal, the OOM killer, ``os._exit``), gets a crash snapshot from
        the agent (``end`` and ``failed_ns``: the disconnect time), which opens or joins the job's
        session. A worker that sent its own crash snapshot (an uncaught exception) gets none.

        The disconnect time orders failures: when one rank fails, torchrun SIGTERMs the node's other
        workers tens of milliseconds later; those are marked "dead after rank N" and are not blamed.
        """
        try:
            status = await asyncio.to_thread(watch_exit, w.pid, w.started, 1.0)
        except RuntimeError:  # the loop is closing
            return
        alive, _ = liveness(w.pid, w.started)
        if alive or self._stopped.is_set() or w.writer is not None:
            return  # alive: a reconnect, not an exit; or the agent is stopping and closed it itself
        oom = oom_killed(w.cgroup, status)
        if w.crash_sent or not is_failure(w.phase == "exited", status, oom):
            if w.crash_sent:
                self._first_death.setdefault(w.job, (w.rank, t))
            return  # a normal exit, or its crash is reported already
        first = self._first_death.get(w.job)
        if first is not None and first[0] != w.rank and 0.0 <= t - first[1] < FOLLOW_S \
                and w.phase != "exited":
            w.phase = f"dead after rank {first[0]}"
            return
        self._first_death[w.job] = (w.rank, t)
        snap = death_snapshot(w, status, oom, t_wall_ns or time.time_ns())
        if w.phase != "exited":
            w.phase = "dead"
        log.warning("worker rank %d of job %s %s (pid %d)", w.rank, w.job, snap.error, w.pid)
        await self.upstream.upload_snapshot(w, snap.to_dict())

    # ------------------------------------------------------------------ sessions
    def _on_notice(self, job: str, notice: TriggerNotice) -> None:
        if not isinstance(notice.session, str) or not SESSION_RE.fullmatch(notice.session):
            self._warn_once(f"bad-session-{job}", "ignoring session id %r from the localizer: not a safe name",
                            str(notice.session)[:80])
            return
        if notice.session not in self.sessions:
            self.start_session(job, notice.session, float(notice.window_s), notice.reason, notice.kind)

    def start_session(self, job: str, session: str, window_s: float, reason: str, kind: str = "slowdown") -> SessionRun:
        run = SessionRun(session, job, window_s, reason, kind)
        self.sessions[session] = run
        self.metrics.session("started")
        self._spawn(self.windows.run_session(run, self.job_workers(job)), f"session-{session}")
        return run

    # ------------------------------------------------------------------ idle exit and metrics
    def busy(self) -> bool:
        return any(not t.done() for t in self._tasks if t.get_name().startswith(("session-", "late-", "trigger",
                                                                                   "hang-snapshot")))

    async def _idle_loop(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.options.idle_exit_s / 4))
            if any(w.connected for w in self.workers.values()) or self.busy():
                self._last_connected = time.monotonic()
                continue
            if self.idle_check is not None and not self.idle_check():
                self._last_connected = time.monotonic()
                continue
            if time.monotonic() - self._last_connected >= self.options.idle_exit_s:
                log.info("no worker for %.0f s and nothing running: the agent exits", self.options.idle_exit_s)
                self._stopped.set()
                return

    async def _start_metrics(self) -> None:
        from perftracker.agent.daemon.agent_metrics import MetricsServer

        self._metrics_server = MetricsServer(self.metrics, self.options.metrics_host, int(self.options.metrics_port or 0))
        self.metrics_url = self._metrics_server.url
        self._spawn(self._tick_loop(), "metrics-tick")

    async def _tick_loop(self) -> None:
        """Tell the metrics server's /healthz (the liveness probe) that this event loop runs."""
        while True:
            self.metrics.tick()
            await asyncio.sleep(1.0)

