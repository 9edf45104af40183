"""Crashes are not hangs (issue 22): the capture chain, the agent's view of an exit, the crash verdict.

- the excepthooks are chained: the user's own hooks still run, and a failure of ours never reaches
  user code;
- the agent reads a real zombie's wait status: exit 0 after "exited" is no failure, exit 3 and
  SIGKILL are; the OOM killer from a memory cgroup's counter (files in the kernel's format);
- the localizer: a failure snapshot gives a crash report naming the first failing rank, not the
  ranks that failed in the collective after it; a single-process crash inside a c10d call is never
  "all ranks wait in a collective"; live blocked ranks without a failure are still a hang.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from perftracker.agent.daemon.liveness import started_at
from perftracker.agent.daemon.worker_exits import (
    ExitStatus,
    MemoryCgroup,
    error_file_of,
    is_failure,
    oom_killed,
    read_error_file,
    watch_exit,
    zombie_status,
)
from perftracker.localizer.diagnose.incidents.crash import localize_crash
from perftracker.localizer.diagnose.incidents.hang import localize_hang

from perftracker.model import Frame, HangSnapshot
from perftracker.runtime import exit_capture as crash

T0 = 1_700_000_000_000_000_000


@pytest.fixture
def fresh_hooks() -> Iterator[None]:
    saved = sys.excepthook, threading.excepthook, crash._installed
    crash._installed = False
    crash._failures.clear()
    yield
    sys.excepthook, threading.excepthook, crash._installed = saved
    crash._failures.clear()


def test_excepthooks_chain_to_the_users_hooks_and_never_raise(fresh_hooks: None, monkeypatch) -> None:
    seen: list[str] = []
    sys.excepthook = lambda tp, v, tb: seen.append(f"user sys {v}")
    threading.excepthook = lambda args: seen.append(f"user thread {args.exc_value}")
    crash.install()
    crash.install()  # idempotent: one link in the chain
    try:
        raise ValueError("main")
    except ValueError as exc:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    t = threading.Thread(target=lambda: (_ for _ in ()).throw(KeyError("worker")), name="w")
    t.start()
    t.join()
    assert seen == ["user sys main", "user thread 'worker'"]
    fs = crash.failures()
    assert [(type(f.exc).__name__, f.main) for f in fs] == [("ValueError", True), ("KeyError", False)]
    assert crash.training_failure() is fs[0]  # the worker thread's exception did not end training
    # our part failing (here: the clock) must not stop the user's hook nor raise into the caller
    monkeypatch.setattr(crash.time, "time_ns", lambda: 1 / 0)
    sys.excepthook(RuntimeError, RuntimeError("again"), None)
    assert seen[-1] == "user sys again"


def test_a_real_process_with_a_user_hook_keeps_it_and_reports_its_crash(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text(
        "import sys\n"
        "sys.excepthook = lambda *a: print('USER HOOK', a[1])\n"
        "from perftracker.runtime import exit_capture as crash\n"
        "crash.install()\n"
        "import atexit\n"
        "atexit.register(lambda: print('ENDING', type(crash.ending_exception()[0]).__name__))\n"
        "raise OSError('disk gone')\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
                              "PERFTRACKER_DISABLE": "1"})
    assert out.returncode == 1
    assert "USER HOOK disk gone" in out.stdout and "ENDING OSError" in out.stdout


def _child(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code])


def test_agent_reads_a_zombies_exit_status_and_tells_exit_from_failure() -> None:
    ok, bad, killed = _child("pass"), _child("import sys; sys.exit(3)"), _child("import time; time.sleep(60)")
    killed.send_signal(signal.SIGKILL)
    try:
        statuses = [watch_exit(p.pid, timeout_s=30) for p in (ok, bad, killed)]  # not reaped yet: zombies
    finally:
        for p in (ok, bad, killed):
            p.wait()
    assert statuses == [ExitStatus("exit", 0), ExitStatus("exit", 3), ExitStatus("signal", 9)]
    assert not is_failure(True, statuses[0], oom=False)  # a normal exit is no crash
    assert not is_failure(True, None, oom=False)  # said "exited", status not seen: no crash either
    assert is_failure(True, statuses[1], oom=False)
    assert not is_failure(True, ExitStatus("signal", 2), oom=False)  # Ctrl-C after atexit: interrupted, no crash
    assert is_failure(False, statuses[2], oom=False) and is_failure(False, None, oom=False)
    assert statuses[2].describe() == "killed by signal 9 (SIGKILL)"


def test_a_zombie_of_another_creation_time_is_not_read_and_the_error_file_comes_from_the_environment(
        tmp_path: Path) -> None:
    err = str(tmp_path / "error.json")
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read(); sys.exit(4)"], stdin=subprocess.PIPE,
                            env={"PATH": "/usr/bin:/bin", "TORCHELASTIC_ERROR_FILE": err})
    try:
        # between fork and exec the child still shows this process's environment: wait for the exec
        deadline = time.monotonic() + 30
        while error_file_of(proc.pid) != err and time.monotonic() < deadline:
            time.sleep(0.01)
        assert error_file_of(proc.pid) == err
        started = started_at(proc.pid)
        assert zombie_status(proc.pid, started) is None  # alive
        assert proc.stdin is not None
        proc.stdin.close()
        assert watch_exit(proc.pid, started, timeout_s=30) == ExitStatus("exit", 4)
        assert zombie_status(proc.pid, started + 0.01) is None  # the pid of a process created at another time
    finally:
        if proc.poll() is None and proc.stdin is not None and not proc.stdin.closed:
            proc.kill()  # an assertion failed while it still waits for its stdin
        proc.wait()
    assert zombie_status(proc.pid, started) is None and error_file_of(proc.pid) == ""  # reaped
    assert watch_exit(proc.pid, started, timeout_s=5) is None  # gone: returns at once, not at the timeout


def test_oom_killer_from_the_cgroup_counter(tmp_path: Path) -> None:
    # memory.oom_control and memory.events as the kernel writes them (v1 and v2); not a real OOM here
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    cg = MemoryCgroup(str(v1), False, 0)
    sigkill = ExitStatus("signal", 9)
    assert not oom_killed(cg, sigkill)  # killed, but not by the OOM killer
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    assert oom_killed(cg, sigkill) and oom_killed(cg, None)
    assert not oom_killed(cg, ExitStatus("exit", 1))  # it exited by itself
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 2\noom_group_kill 0\n")
    assert oom_killed(MemoryCgroup(str(v2), True, 1), sigkill)
    assert not oom_killed(MemoryCgroup(str(v2), True, 2), sigkill)


def test_torchelastic_error_file(tmp_path: Path) -> None:
    f = tmp_path / "error.json"  # the shape torch.distributed.elastic's @record writes
    f.write_text('{"message": {"message": "RuntimeError: bad batch\\nmore", "extraInfo": '
                 '{"py_callstack": "...", "timestamp": "1700000000"}}}')
    assert read_error_file(str(f)) == ("RuntimeError: bad batch", 1_700_000_000 * 10**9)
    assert read_error_file(str(tmp_path / "missing.json")) == ("", 0)


# ------------------------------------------------------------------------------------------------
# the verdict (pure)
# ------------------------------------------------------------------------------------------------

ALLREDUCE = (Frame("train.py", 40, "main"), Frame("train.py", 30, "step"),
             Frame("<lib>/torch/distributed/c10d_logger.py", 81, "wrapper"),
             Frame("<lib>/torch/distributed/distributed_c10d.py", 2800, "all_reduce"))


def _snap(rank: int, world: int = 4, **kw: object) -> HangSnapshot:
    base = dict(job="j", rank=rank, world_size=world, host="h", pid=100 + rank, taken_ns=T0 + 10**9,
                last_iteration=200, idle_s=0.1, stack=ALLREDUCE, current_op="c10d allreduce")
    base.update(kw)
    return HangSnapshot(**base)  # type: ignore[arg-type]


def test_dead_rank_is_the_crash_and_the_peer_losses_fold_under_it() -> None:
    peer = "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1234"
    snaps = [
        # survivors fail in the collective; rank 0's hook ran before the agent saw rank 3 go
        _snap(0, end="exception", error=peer, failed_ns=T0 - 5_000_000),
        _snap(1, end="exception", error=peer, failed_ns=T0 + 20_000_000),
        _snap(2, end="exception", error=peer, failed_ns=T0 + 30_000_000),
        _snap(3, stack=(), current_op="", end="signal", exit_code=9, error="killed by signal 9 (SIGKILL)",
              failed_ns=T0),
    ]
    r = localize_crash(snaps, {}, [0, 1, 2, 3])
    assert r is not None and r.kind == "crash"
    states = {s.rank: s.state for s in r.hang_states}
    assert states == {0: "waiting", 1: "waiting", 2: "waiting", 3: "culprit"}, r.summary
    assert r.summary.startswith("crash: rank 3 was killed by signal 9 (SIGKILL), at iteration 200")
    assert "ranks 0-2 then failed in c10d allreduce (Connection closed by peer)" in r.summary


def test_exception_rank_is_first_and_later_failures_are_not_blamed() -> None:
    raise_stack = (Frame("train.py", 40, "main"), Frame("train.py", 22, "forward"))
    snaps = [_snap(1, stack=raise_stack, current_op="", end="exception", error="RuntimeError: bad", failed_ns=T0),
             _snap(2, stack=raise_stack, current_op="", end="exception", error="ValueError: later",
                   failed_ns=T0 + 10**9),
             _snap(0), _snap(3)]  # alive, blocked in the collective
    r = localize_crash(snaps, {}, [0, 1, 2, 3])
    assert r is not None
    assert {s.rank: s.state for s in r.hang_states} == {0: "waiting", 1: "culprit", 2: "failed", 3: "waiting"}
    assert r.summary.startswith("crash: rank 1 failed with RuntimeError: bad at train.py:22 in forward")
    assert "ranks 0,3 wait in c10d allreduce" in r.summary
    assert "ranks 0,3 wait in c10d allreduce since iteration 200" in r.summary, r.summary


def test_single_process_crash_in_a_c10d_call_is_a_crash_not_a_collective_hang() -> None:
    stack = (Frame("train.py", 22, "main"), Frame("<lib>/torch/distributed/distributed_c10d.py", 1423,
                                                  "_get_default_group"))
    s = _snap(0, world=1, stack=stack, current_op="c10d get_default_group", end="exception",
              error="ValueError: Default process group has not been initialized", last_iteration=0)
    r = localize_crash([s], {}, [0])
    assert r is not None and r.kind == "crash"
    assert "wait" not in r.summary and "collective" not in r.summary
    assert r.summary.startswith("crash: rank 0 (a single-process job) failed with ValueError: Default process group")
    assert "before its first iteration" in r.summary and "raised in <lib>/torch/distributed" in r.summary


def test_blocked_live_ranks_are_a_hang_not_a_crash() -> None:
    sleeping = (Frame("train.py", 40, "main"), Frame("train.py", 88, "forward"), Frame("<stdlib>/time.py", 1, "sleep"))
    snaps = [_snap(0), _snap(1, stack=sleeping, current_op="time.sleep", kernel_state="S hrtimer_nanosleep")]
    assert localize_crash(snaps, {}, [0, 1]) is None
    r = localize_hang(snaps, {}, [0, 1])
    assert r is not None and r.kind == "hang" and {s.rank: s.state for s in r.hang_states}[1] == "culprit"


def test_exit_status_unseen_the_rank_that_exited_is_named_over_peer_losses() -> None:
    from perftracker.localizer.diagnose.incidents.hang import SilentRank

    peer = "RuntimeError: Connection reset by peer"
    snaps = [_snap(r, end="exception", error=peer, failed_ns=T0 + r) for r in (0, 1, 3)]
    r = localize_crash(snaps, {2: SilentRank(2, "process exited", silent_s=3.0, last_iteration=200)}, [0, 1, 2, 3])
    assert r is not None and [s.rank for s in r.hang_states if s.state == "culprit"] == [2], r.summary


# ------------------------------------------------------------------------------------------------
# `perftracker run`'s wait for its command (end to end on a real job: tests/system/test_crash_run.py)
# ------------------------------------------------------------------------------------------------


def test_run_keeps_a_failed_command_a_zombie_for_the_agent_and_reaps_a_clean_one_at_once() -> None:
    from perftracker.cli.run import wait_keeping_failed_zombie

    seen: list[ExitStatus | None] = []
    failing = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    watcher = threading.Thread(target=lambda: seen.append(watch_exit(failing.pid, 0, 5.0)))
    watcher.start()
    assert wait_keeping_failed_zombie(failing, hold_s=1.0) == 3
    watcher.join(10)
    assert seen == [ExitStatus("exit", 3)]  # the agent's reader saw the zombie before the reap

    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    killed.send_signal(signal.SIGKILL)
    seen.clear()
    watcher = threading.Thread(target=lambda: seen.append(watch_exit(killed.pid, 0, 5.0)))
    watcher.start()
    assert wait_keeping_failed_zombie(killed, hold_s=1.0) == -signal.SIGKILL
    watcher.join(10)
    assert seen == [ExitStatus("signal", signal.SIGKILL)]

    clean = subprocess.Popen([sys.executable, "-c", "pass"])
    assert wait_keeping_failed_zombie(clean, hold_s=30.0) == 0  # a clean exit: no hold (30 s would time out)

