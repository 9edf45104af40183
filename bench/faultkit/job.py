"""One scenario run: a localizer, one agent and one torchrun per (emulated) host, faults, trigger, report.

Every process is started in its own session so that teardown can kill whole process groups;
``JobRun.__exit__`` kills them, removes cgroups, qdiscs and competitor processes, even when the run
failed or was interrupted.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from bench.faultkit.hosts import CGROUP_PREFIX, Host
from bench.faultkit.inject import Competitor, CpuQuota, MemoryLimit, RateLimit, send
from bench.faultkit.scenario import HARNESS, IN_SCRIPT, Fault, Scenario
from perftracker.errors import PerftrackerError
from perftracker.model import Report

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "perftracker" / "examples" / "train.py"


@dataclass
class RunResult:
    report: Report | None  # the session at (or after) the fault's onset, else the last one
    report_s: float | None  # trigger -> stored report (minus the window for profile sessions)
    detection_delay_iters: int | None  # trigger iteration - fault onset (detector trigger only)
    trigger_iter: int | None
    summary: str
    iterations: dict[int, int]
    reports: tuple[Report, ...] = ()  # every session's report, in order (all are scored)
    sessions: tuple[str, ...] = ()  # "iteration N: reason" of each session, in order
    fault_to_report_s: float | None = None  # first out-of-process fault applied -> the answer's report stored


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class JobRun:
    def __init__(
        self, sc: Scenario, job: str, token: str, run_dir: Path, hosts: list[Host] | None, iters_cap: int | None = None,
        zero_setup: bool = False,
    ) -> None:
        """``zero_setup``: start no localizer and no agent and pass no URL: each emulated host's
        workers start their own agent (own run dir and working dir), and the job finds its one
        localizer through its rendezvous store (issue 42); the harness reads it from host 0."""
        self.sc, self.job, self.token, self.run_dir, self.hosts = sc, job, token, run_dir, hosts
        self.zero_setup = zero_setup
        self.iterations = min(sc.iterations, iters_cap) if iters_cap else sc.iterations
        self.procs: list[subprocess.Popen[bytes]] = []
        # the workers write their iteration here every iteration: keep that off the disk (tmpfs),
        # so the harness's own bookkeeping does not show up on the training thread's critical path
        shm = Path("/dev/shm")
        self.progress_dir = (shm if shm.is_dir() and os.access(shm, os.W_OK) else run_dir) / f"perftracker-{job}"
        self.stack = ExitStack()
        self.addr = hosts[0].bridge_ip if hosts else "127.0.0.1"
        self.port = _free_port(self.addr)
        self.url = f"http://{self.addr}:{self.port}"
        self.env = dict(os.environ)
        self.env.pop("PERFTRACKER_DISABLE", None)  # the harness may run with it; the job must not
        self.env.update(
            PERFTRACKER_TOKEN=token,
            PERFTRACKER_JOB_ID=job,
            PERFTRACKER_LOCALIZER_URL=self.url,
            PERFTRACKER_AUTOSTART_AGENT="0",
            PERFTRACKER_WINDOW_S=str(sc.window_s),
            PERFTRACKER_LOG_LEVEL="INFO",
            PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            PYTHONUNBUFFERED="1",
            OMP_NUM_THREADS="1",
            # the scenarios are a minute long: the budget's whole hour from the start, so that a noise
            # window before the fault does not use up its advance (docs/window-cost.md, the budget)
            PERFTRACKER_WINDOW_BUDGET_INITIAL_S="72",
        )
        if zero_setup:  # the user's setup: nothing but `import perftracker`
            for var in ("PERFTRACKER_TOKEN", "PERFTRACKER_LOCALIZER_URL", "PERFTRACKER_AUTOSTART_AGENT"):
                self.env.pop(var, None)
            self.url = ""
        if sc.baseline:  # the localizer takes the job's healthy baseline once it runs steadily (issue 49)
            self.env["PERFTRACKER_BASELINE"] = "1"
        if sc.trigger != "detector":
            # only the CLI (or nothing) triggers: keep the detector from opening a session on its own
            self.env["PERFTRACKER_TRIGGER_COOLDOWN_S"] = "100000"
            self.env["PERFTRACKER_SLOWDOWN_THRESHOLD"] = "1000"

    # -- process management ------------------------------------------------------------------
    def _spawn(self, argv: list[str], name: str, env: dict[str, str] | None = None,
               cwd: Path | None = None) -> subprocess.Popen[bytes]:
        logf = open(self.run_dir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the stack
        self.stack.callback(logf.close)
        proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, env=env or self.env, start_new_session=True,
                                cwd=cwd)
        self.procs.append(proc)
        log.debug("started %s (pid %d): %s", name, proc.pid, " ".join(argv))
        return proc

    def __enter__(self) -> JobRun:
        if self.zero_setup:
            return self
        store = self.run_dir / "store.db"
        self._spawn(
            [sys.executable, "-m", "perftracker", "localizer", "--host", self.addr, "--port", str(self.port),
             "--store", str(store)],  # the token comes from PERFTRACKER_TOKEN (self.env), never argv: ps shows argv
            "localizer",
        )
        self._wait_http(f"{self.url}/v1/healthz", 30)
        return self

    def __exit__(self, *exc: object) -> None:
        # torchrun starts each worker in its own session: killing torchrun's group leaves it running,
        # so collect every descendant first (and the pids the workers reported), then kill them all
        victims: set[int] = set()
        for p in self.procs:
            try:
                victims.update(c.pid for c in psutil.Process(p.pid).children(recursive=True))
            except psutil.Error:
                pass
        victims.update(pid for pid in (self._worker_pid(r) for r in range(self.sc.workers)) if pid)
        victims.update(self._autostarted_agents())
        for pid in victims:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGCONT)
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.warning("process %d did not exit", p.pid)
        self.stack.close()
        if self.progress_dir != self.run_dir:
            import shutil

            for f in self.progress_dir.glob("*.times"):  # iteration end times: kept with the run
                shutil.copy(f, self.run_dir / f.name)
            shutil.rmtree(self.progress_dir, ignore_errors=True)

    def _autostarted_agents(self) -> list[int]:
        out = []
        for rank in range(self.sc.workers):
            try:
                out.append(int(json.loads((self.run_dir / f"host{rank}" / "agent.json").read_text())["pid"]))
            except (OSError, ValueError, KeyError):
                pass
        return out

    def _agent_up(self, rank: int, t_start: float) -> bool:
        """Zero-setup: a fault on a rank's process waits for the agent that process starts (at most
        20 s), so that a cgroup put on the process does not catch the agent forked after it: the
        fault is the training process's, as in the explicit mode whose agents the harness starts."""
        if not self.zero_setup:
            return True
        return (self.run_dir / f"host{rank}" / "agent.json").exists() or time.monotonic() - t_start > 20

    def _discover(self) -> bool:
        """Zero-setup: the job's localizer, from host 0's runs dir (the job record its agent left,
        else its embedded localizer's file) and that runs dir's token. False until it is there."""
        if self.url:
            return True
        runs = self.run_dir / "host0" / "work" / "perftracker-runs"
        try:
            token = (runs / "token").read_text().strip()
            if self.hosts and self.sc.workers > 1:  # a job of several hosts: the URL its rank 0's agent serves
                url = json.loads((runs / "jobs" / f"{self.job}.json").read_text())["url"]
            else:  # one host: its embedded localizer, on loopback
                url = json.loads((runs / "localizer.json").read_text())["url"]
        except (OSError, ValueError, KeyError):
            return False
        self.url, self.token = str(url), token
        log.info("zero-setup: the job's localizer is %s", self.url)
        return True

    def _wait_http(self, url: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                self._get(url)
                return
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        raise PerftrackerError(f"{url} did not come up within {timeout_s:.0f} s (see {self.run_dir}/localizer.log)")

    def _get(self, url: str) -> Any:
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            body = resp.read()
            return json.loads(body) if body else None

    # -- the run -----------------------------------------------------------------------------
    def _script_args(self, rank: int) -> list[str]:
        args = ["--iters", str(self.iterations), "--seed", str(self.sc.seed), "--progress-dir", str(self.progress_dir)]
        for f in self.sc.faults:
            if f.kind in IN_SCRIPT and rank in f.ranks:
                if f.kind in ("hang", "raise", "exit", "oom"):
                    keys = {"hang": ("at_iter",), "raise": ("at_iter",), "exit": ("at_iter", "code"),
                            "oom": ("at_iter", "mb")}[f.kind]
                    kv = ",".join(f"{k}={f.params[k]}" for k in keys if k in f.params)
                    args += ["--fault", f"{f.kind}:{kv}"]
                else:
                    args += ["--fault", f.script_arg(), "--fault-start-iter", str(f.start_iter)]
        return args

    def _start_workers(self) -> None:
        n = self.sc.workers
        master_port = _free_port()
        for rank in range(n):
            host = self.hosts[rank] if self.hosts else None
            rdir = self.run_dir / f"host{rank}"
            rdir.mkdir(exist_ok=True)
            # gloo picks its address from the hostname, which every namespace shares: name the link
            env = dict(self.env, PERFTRACKER_RUN_DIR=str(rdir), GLOO_SOCKET_IFNAME="eth0" if host else "lo")
            agent = [sys.executable, "-m", "perftracker", "agent", "--run-dir", str(rdir),
                     "--url", self.url, "--keep-windows"]  # token: PERFTRACKER_TOKEN in env
            master = self.hosts[0].addr if self.hosts else "127.0.0.1"
            train = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(n), "--node_rank", str(rank),
                     "--nproc_per_node", "1", "--master_addr", master, "--master_port", str(master_port),
                     str(TRAIN), *self._script_args(rank)]
            if host:
                agent, train = host.wrap(agent, keep_sysfs=True), host.wrap(train)
            if self.zero_setup:  # its own agent (autostarted: own run dir) and ./perftracker-runs/
                work = rdir / "work"
                work.mkdir(exist_ok=True)
                self._spawn(train, f"train{rank}", env, cwd=work)
                continue
            self._spawn(agent, f"agent{rank}", env)
            self._spawn(train, f"train{rank}", env)

    def _progress(self) -> dict[int, int]:
        out = {}
        for rank in range(self.sc.workers):
            try:
                out[rank] = int((self.progress_dir / f"rank{rank}.iter").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                out[rank] = -1
        return out

    def _worker_pid(self, rank: int) -> int | None:
        try:
            return int((self.progress_dir / f"rank{rank}.iter").read_text().split()[1])
        except (OSError, ValueError, IndexError):
            return None

    def _apply(self, f: Fault, rank: int) -> None:
        pid = self._worker_pid(rank)
        if pid is None:
            raise PerftrackerError(f"no pid known for rank {rank}")
        if f.kind == "cpu_quota":
            q = self.stack.enter_context(CpuQuota(f"{CGROUP_PREFIX}{self.job}-r{rank}", float(f.params["fraction"])))
            q.add(pid)
        elif f.kind == "net_rate":
            if not self.hosts:
                raise PerftrackerError("net_rate needs emulated hosts")
            h = self.hosts[rank]
            self.stack.enter_context(RateLimit(h.veth_root, h.netns, float(f.params["mbit"])))
        elif f.kind == "competitor":
            c = self.stack.enter_context(Competitor(cpu=rank % max(1, os.cpu_count() or 1)))
            c.pin(pid)
        elif f.kind == "stop":
            send(pid, signal.SIGSTOP)
        elif f.kind == "kill":
            send(pid, signal.SIGKILL)
        elif f.kind == "oom":
            m = self.stack.enter_context(MemoryLimit(f"{CGROUP_PREFIX}{self.job}-m{rank}",
                                                     int(f.params.get("limit_mb", 512))))
            m.add(pid)
        log.info("applied %s to rank %d (pid %d)", f.kind, rank, pid)

    def _sessions(self) -> list[dict[str, Any]]:
        try:
            data = self._get(f"{self.url}/v1/sessions?job={self.job}")
        except (urllib.error.URLError, OSError, ValueError):
            return []
        return list(data.get("sessions", data) if isinstance(data, dict) else data or [])

    def _report(self, session: str) -> Report | None:
        try:
            d = self._get(f"{self.url}/v1/sessions/{session}/report")
        except urllib.error.HTTPError as exc:
            if exc.code in (404, 409, 425):
                return None
            raise
        except (urllib.error.URLError, OSError):
            return None
        if not isinstance(d, dict) or "schema_version" not in d:
            return None  # 202: the session is still collecting
        return Report.from_dict(d)

    def execute(self, timeout_s: float) -> RunResult:
        """Run the job until the report that answers the scenario is stored.

        That is the first report of a session triggered at or after the fault's onset (a detector
        may fire on host noise before it; that session is kept and scored too), or, with no onset,
        the first report. Reports of every session seen are collected."""
        sc = self.sc
        self._start_workers()
        t_start = time.monotonic()
        pending = [(f, r) for f in sc.faults if f.kind in HARNESS for r in f.ranks]
        applied_at: list[int] = []  # iterations at which out-of-process faults were applied
        applied_t: list[float] = []  # ... and when (monotonic)
        opened: dict[str, tuple[float, int]] = {}  # session -> (monotonic time seen, trigger iteration)
        reasons: dict[str, str] = {}
        reports: dict[str, Report] = {}
        stored_at: dict[str, float] = {}  # session -> monotonic time its report was first seen
        answer: str | None = None  # the session whose report answers the scenario
        # a hang is answered by a hang report: a slowdown session open when the hang began (a window
        # the hang stopped, issue 19) has a report of its own that does not answer it
        # (likewise a crash, issue 22, by a crash report)
        wants_kind = next((c for c in ("hang", "crash") if any(m.category == c for m in sc.expect)), None)
        cli_iter: int | None = None
        progress: dict[int, int] = {}
        last_log = 0.0
        while time.monotonic() - t_start < timeout_s:
            time.sleep(0.1)
            progress = self._progress()
            alive = [it for it in progress.values() if it >= 0]
            it_max = max(alive) if alive else -1
            for f, r in list(pending):
                at = 1 if f.kind == "oom" else int(f.params.get("at_iter", f.start_iter))  # oom: the limit, early
                if progress.get(r, -1) >= at and self._agent_up(r, t_start):
                    self._apply(f, r)
                    if f.kind != "oom":  # oom's limit is set early; the fault itself begins in the script
                        applied_t.append(time.monotonic())
                    pending.remove((f, r))
                    # polled every 0.1 s: the fault lands a few iterations after `at`; the
                    # detection delay counts from where it really began (oom begins in the script)
                    if f.kind != "oom":
                        applied_at.append(max(at, progress.get(r, at)))
            if not self._discover():
                continue
            if sc.trigger == "cli" and cli_iter is None and it_max >= sc.trigger_at_iter:
                subprocess.run(
                    [sys.executable, "-m", "perftracker", "trigger", "--job", self.job, "--url", self.url,
                     "--window-s", str(sc.window_s), "--no-wait"],
                    env=dict(self.env, PERFTRACKER_TOKEN=self.token), check=True, capture_output=True,
                )
                cli_iter = it_max
                log.info("CLI trigger at iteration %d", it_max)
            onset = self._onset(applied_at)
            for s in self._sessions():
                sid = str(s.get("session") or s.get("id"))
                if sid not in opened:
                    m = re.search(r"iteration (\d+)", str(s.get("reason", "")))
                    it = int(m.group(1)) if m else (cli_iter if cli_iter is not None else it_max)
                    opened[sid] = (time.monotonic(), it)
                    reasons[sid] = f"iteration {it}: {s.get('reason')}"
                    log.info("session %s opened: %s", sid, s.get("reason"))
                if sid not in reports and (rep := self._report(sid)) is not None:
                    reports[sid], stored_at[sid] = rep, time.monotonic()
                    # a baseline window (issue 49) is scored but never answers the scenario
                    if answer is None and (wants_kind is None or rep.kind == wants_kind) and (
                            onset is None or sc.trigger != "detector" or opened[sid][1] >= onset) \
                            and rep.trigger_reason != "baseline":
                        answer = sid
            if answer is not None:
                break
            if time.monotonic() - last_log > 10:
                last_log = time.monotonic()
                log.info("%s: iterations %s", sc.name, progress)
            if alive and all(it >= self.iterations - 1 for it in alive) and not pending:
                break
        if answer is None and reports:
            answer = list(reports)[-1]  # no session after the onset: show the last one
        report = reports.get(answer) if answer else None
        report_s = None
        trigger_iter = None
        if report is not None and answer is not None:
            t_open, trigger_iter = opened[answer]
            report_s = stored_at[answer] - t_open - (sc.window_s if report.kind not in ("hang", "crash") else 0.0)
        onset = self._onset(applied_at)
        delay = None
        if sc.trigger == "detector" and onset is not None:
            after = [it for _, it in opened.values() if it >= onset]
            delay = min(after) - onset if after else None
        summary = report.summary if report is not None else "no report"
        if report is not None and not report.summary and report.findings:
            summary = report.findings[0].sentence
        fault_s = stored_at[answer] - min(applied_t) if answer is not None and answer in stored_at and applied_t else None
        return RunResult(report, report_s, delay, trigger_iter, summary, progress, tuple(reports.values()),
                         tuple(reasons[sid] for sid in opened), fault_s)

    def _onset(self, applied_at: list[int]) -> int | None:
        """The fault's first iteration: out-of-process faults count from where they were applied."""
        onset = self.sc.onset_iter
        if applied_at:
            in_script = [int(f.params.get("at_iter", f.start_iter)) for f in self.sc.faults if f.kind in IN_SCRIPT]
            onset = min(in_script + applied_at)
        return onset
