"""Hang diagnosis end to end on real torchrun jobs (gloo, 2 ranks) with the embedded default:
perftracker/examples/train.py imports perftracker, which starts the node agent and its embedded localizer.

hang in forward -> the report names the rank and the place; SIGSTOP -> "process stopped", and the
report is resolved after SIGCONT; SIGKILL -> a crash report (issue 22) naming the dead rank, not the
one torchrun stopped after it;
an all-rank checkpoint pause shorter than PERFTRACKER_HANG_PAUSE_S -> no hang report.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from perftracker.model import Report

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "perftracker" / "examples" / "train.py"
AT_ITER = 60


class Job:
    def __init__(self, tmp_path: Path, port: int, args: list[str], env: dict[str, str] | None = None) -> None:
        self.dir = tmp_path
        (tmp_path / "prog").mkdir()
        # the embedded default: the first worker autostarts the agent (the suite's environment has it off)
        self.env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PERFTRACKER_RUN_DIR=str(tmp_path / "run"),
                        PERFTRACKER_AUTOSTART_AGENT="1",
                        PERFTRACKER_AGENT_IDLE_EXIT_S="30", PERFTRACKER_DETECTOR_MODE="paper",
                        PERFTRACKER_SLOWDOWN_THRESHOLD="1000", PERFTRACKER_TRIGGER_COOLDOWN_S="100000",
                        **(env or {}))
        self.env.pop("PERFTRACKER_DISABLE", None)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(port), str(TRAIN), "--iters", "100000", "--quiet", "--hidden", "64",
               "--in-dim", "64", "--progress-dir", str(tmp_path / "prog"), *args]
        self.log = open(tmp_path / "torchrun.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, cwd=tmp_path, env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.t0 = time.time()
        self.job = f"train-{port}"  # default job id: script name and rendezvous port
        self.worker_pids: set[int] = set()  # torchrun starts workers in their own sessions

    def progress(self, rank: int) -> tuple[int, int, float]:
        """(last completed iteration index, pid, wall time it was written); (-1, 0, 0) before the first."""
        path = self.dir / "prog" / f"rank{rank}.iter"
        try:
            it, pid = path.read_text().split()
            self.worker_pids.add(int(pid))
            return int(it), int(pid), path.stat().st_mtime
        except (OSError, ValueError):
            return -1, 0, 0.0

    def wait_for(self, what: str, cond: Callable[[], object], timeout_s: float, job_may_end: bool = False) -> object:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            got = cond()
            if got:
                return got
            if self.proc.poll() is not None and not job_may_end:
                break
            time.sleep(0.1)
        self.log.flush()
        tail = (self.dir / "torchrun.log").read_bytes()[-3000:].decode(errors="replace")
        agent = self.dir / "run" / "agent.log"
        agent_tail = agent.read_text()[-3000:] if agent.exists() else "(no agent log)"
        raise AssertionError(f"timed out waiting for {what}\n--- torchrun:\n{tail}\n--- agent:\n{agent_tail}")

    def registered(self) -> bool:
        """Both workers are known to the localizer (the agent starts after the first iteration)."""
        db = self.dir / "perftracker-runs" / "localizer.sqlite"
        if not db.exists():
            return False
        try:  # read-only, plain sqlite: the localizer may still be creating the store
            with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as con:
                n = con.execute("SELECT COUNT(*) FROM workers WHERE job=?", (self.job,)).fetchone()[0]
                return int(n) >= 2
        except sqlite3.Error:
            return False

    def hang_reports(self, kind: str = "hang") -> list[Report]:
        out = []
        for f in sorted((self.dir / "perftracker-runs" / "reports").glob("*.json")):
            try:
                r = Report.from_dict(json.loads(f.read_text()))
            except (OSError, ValueError):
                continue  # being written
            if r.kind == kind:
                out.append(r)
        return out

    def stored_hang_report(self, session: str) -> Report | None:
        from perftracker.localizer.store.sqlite_store import Store

        store = Store(self.dir / "perftracker-runs" / "localizer.sqlite")
        try:
            return store.get_report(session)
        finally:
            store.close()

    def stop(self) -> None:
        for rank in (0, 1):
            self.progress(rank)  # learn the workers' pids
        for pid in self.worker_pids:  # a stopped worker must be able to die
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)  # torchrun stops its workers
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=15)
        for pid in self.worker_pids:  # workers live in their own sessions: never leave one behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.log.close()
        info = self.dir / "run" / "agent.json"
        if info.exists():  # the autostarted agent runs detached: end it by its own pid
            try:
                os.kill(int(json.loads(info.read_text())["pid"]), signal.SIGKILL)
            except (ProcessLookupError, ValueError, KeyError):
                pass


@pytest.fixture
def job(tmp_path: Path, free_port: int) -> Iterator[Callable[..., Job]]:
    jobs: list[Job] = []

    def start(args: list[str], env: dict[str, str] | None = None) -> Job:
        j = Job(tmp_path, free_port, args, env)
        jobs.append(j)
        return j

    yield start
    for j in jobs:
        j.stop()


def _culprits(r: Report) -> dict[int, str]:
    return {s.rank: s.state for s in r.hang_states if s.state in ("culprit", "silent")}


def test_rank_hanging_in_forward_is_named_with_its_place(job: Callable[..., Job]) -> None:
    j = job(["--fault", f"hang:at_iter={AT_ITER}", "--fault-ranks", "1"])
    j.wait_for("rank 1 to reach the hang", lambda: j.progress(1)[0] >= AT_ITER - 1, 90)
    _, _, hang_wall = j.progress(1)
    rate_s = (hang_wall - j.t0) / AT_ITER  # an upper bound of the mean iteration (includes startup)
    reports = j.wait_for("a hang report", j.hang_reports, 40)
    r = reports[0]  # type: ignore[index]
    assert _culprits(r) == {1: "culprit"}, r.summary
    where = {s.rank: s.where for s in r.hang_states}
    assert "perftracker/examples/train.py" in where[1] and "in hang_forever (time.sleep)" in where[1] and "forward" in where[1]
    assert where[0] == "c10d allreduce (DDP backward)"
    assert r.summary.startswith("hang: rank 1 stopped at ") and f"since iteration {AT_ITER}" in r.summary
    assert r.summary.endswith("; all other ranks wait in c10d allreduce (DDP backward)")
    delay_s = r.created_ns / 1e9 - hang_wall
    assert delay_s <= 2 * rate_s + 10.0, f"report {delay_s:.1f} s after the hang"


def test_stopped_rank_is_named_and_the_report_resolves_after_sigcont(job: Callable[..., Job]) -> None:
    j = job([])
    j.wait_for("iterations", lambda: j.progress(1)[0] >= AT_ITER and j.registered(), 90)
    _, pid, _ = j.progress(1)
    os.kill(pid, signal.SIGSTOP)
    t_stop = time.time()
    reports = j.wait_for("a hang report", j.hang_reports, 40)
    r = reports[0]  # type: ignore[index]
    assert _culprits(r) == {1: "silent"}, r.summary
    assert r.summary.startswith("hang: rank 1 silent for ") and "(process stopped)" in r.summary
    assert r.summary.endswith("all other ranks wait in c10d allreduce (DDP backward)")
    assert r.created_ns / 1e9 - t_stop <= 10.0 + 1.0
    os.kill(pid, signal.SIGCONT)  # recovery: the job goes on, the hang session is resolved
    resolved = j.wait_for("the report resolved", lambda: (x := j.stored_hang_report(r.session)) is not None
                          and x.status == "resolved" and x, 30)
    assert "resumed" in resolved.summary  # type: ignore[union-attr]
    it_then = j.progress(0)[0]
    j.wait_for("training to go on", lambda: j.progress(0)[0] > it_then + 20, 30)


def test_killed_rank_is_a_crash_named_not_the_rank_torchrun_stopped_after_it(job: Callable[..., Job]) -> None:
    j = job([])
    j.wait_for("iterations", lambda: j.progress(1)[0] >= AT_ITER and j.registered(), 90)
    _, pid, _ = j.progress(1)
    os.kill(pid, signal.SIGKILL)  # torchrun then SIGTERMs rank 0 and exits
    reports = j.wait_for("a crash report", lambda: j.hang_reports("crash"), 30, job_may_end=True)
    r = reports[0]  # type: ignore[index]
    assert _culprits(r) == {1: "culprit"}, r.summary  # a death is a crash (issue 22), not a hang
    # the agent reads the zombie's status (torchrun reaps every 0.1 s); unseen, it still says "died"
    assert r.summary.startswith(("crash: rank 1 was killed by signal 9 (SIGKILL)", "crash: rank 1 ended: process died"))
    # rank 0 is never blamed: torchrun stops it before it fails ("exited (process dead after rank 1)"),
    # or it first catches the collective's failure ("then failed in c10d allreduce (Connection reset
    # by peer)"), or the report is made while it still waits ("waits in c10d allreduce", seen in CI
    # for the hang report before issue 22); which comes first is a race
    assert {s.rank: s.state for s in r.hang_states}[0] in ("waiting", "exited"), r.summary
    assert any(f in r.summary for f in ("rank 0 exited (process dead after rank 1)", "rank 0 then failed in",
                                        "rank 0 waits in c10d allreduce")), r.summary
    assert "rank 0" not in r.summary.split(";")[0], r.summary  # the headline clause names rank 1 only
    assert j.hang_reports("hang") == []


def test_all_rank_checkpoint_pause_raises_no_hang_report(job: Callable[..., Job]) -> None:
    # a 9 s "checkpoint save" on every rank; blocked fires after 3 s; pauses up to 20 s are normal.
    # Checkpoints 2,000 iterations apart (several seconds of training): with 60 (0.2 s) the job was
    # paused 98% of the time, each new pause's snapshot joined the still-open session before a
    # recheck (every 5 s) could see the ranks move on, and the session stayed open past 90 s.
    j = job(["--checkpoint-every", "2000", "--checkpoint-pause-s", "9"],
            env={"PERFTRACKER_HANG_PAUSE_S": "20", "PERFTRACKER_BLOCKED_MIN_S": "3"})
    from perftracker.localizer.store.sqlite_store import Store

    def pause_judged() -> list[object]:
        db = j.dir / "perftracker-runs" / "localizer.sqlite"
        if not db.exists():
            return []
        store = Store(db)
        try:
            return [s for s in store.sessions() if s.state == "done"]
        finally:
            store.close()

    closed = j.wait_for("the pause's hang session to close", pause_judged, 90)
    assert j.progress(0)[0] >= 2000  # the job went on after the checkpoint
    assert j.hang_reports() == []
    assert "reports the job blocked" in (j.dir / "run" / "agent.log").read_text()  # judged, not missed
    store = Store(j.dir / "perftracker-runs" / "localizer.sqlite")
    try:
        for s in closed:  # type: ignore[attr-defined]
            assert s.kind == "hang" and "no hang" in s.error and store.get_report(s.session) is None
    finally:
        store.close()


def test_a_peer_stopped_in_the_middle_of_a_window_is_reported_within_the_limit_plus_the_window(
        job: Callable[..., Job]) -> None:
    """Issue 19: a profile window runs (a CLI trigger, 10 s); rank 1 is SIGSTOPped 3 s into it. Rank
    0 waits in the allreduce; around a window its blocked limit is the normal one (5 s) plus the
    window (before: muted for max(30 s, 2 x window) after the window, 35 s). The hang opens its own
    session, linked to the slowdown session by its reason."""
    window_s = 10.0
    j = job([])
    j.wait_for("iterations", lambda: j.progress(1)[0] >= AT_ITER and j.registered(), 90)
    out = subprocess.run(
        [sys.executable, "-m", "perftracker", "trigger", "--job", j.job, "--runs-dir", str(j.dir / "perftracker-runs"),
         "--window-s", str(window_s), "--no-wait", "--reason", "a window to stop a peer in"],
        env=j.env, cwd=j.dir, capture_output=True, text=True, timeout=60, check=True)
    agent_log = j.dir / "run" / "agent.log"
    j.wait_for("rank 1's window to start", lambda: agent_log.exists() and
               "rank 1 samplers" in agent_log.read_text() and "starting the window" in agent_log.read_text(), 30)
    time.sleep(3.0)  # in the middle of the window
    _, pid, _ = j.progress(1)
    os.kill(pid, signal.SIGSTOP)
    t_stop = time.time()
    reports = j.wait_for("a hang report", j.hang_reports, 45)
    r = reports[0]  # type: ignore[index]
    delay_s = r.created_ns / 1e9 - t_stop
    print(f"hang report {delay_s:.1f} s after the stop in the window")  # the figure for docs/hangs.md
    assert _culprits(r) == {1: "silent"}, r.summary
    assert "(process stopped)" in r.summary, r.summary
    # limit 5 s + window 10 s, + the same allowance as a stop outside a window (the stopped-rank test:
    # 6 s for the blocked poll, the agent's procfs probe after 3 s of silence, upload and localizing)
    assert delay_s <= 5.0 + window_s + 6.0, f"hang report {delay_s:.1f} s after the stop"
    assert "during slowdown session " in r.trigger_reason, r.trigger_reason
    slow_session = r.trigger_reason.rsplit("during slowdown session ", 1)[1].rstrip(")")
    assert slow_session != r.session and slow_session in out.stdout + out.stderr
