"""A training process that ends (or deactivates perftracker) while a profile window is open must
exit 0, within the bounded exit delay: a Kineto profiler left enabled at interpreter exit crashes
the process (SIGSEGV, rc 139) and a writer thread must not hold it up for longer than the delay.
At exit the window is handed over, not dropped (issue 16): a running window is cut at its last
complete iteration and written, a window being written is finished at full speed, and only a writer
that cannot finish within the delay is discarded (logged once).

No test here races the writer thread or the iteration boundaries against the wall clock: the
in-process tests drive boundaries by hand against a FakeClock (so a boundary opens or closes the
window because the test said so), hold the writer with ``WindowOptions.writer_gate`` for as long as
they need it in "finishing", and wait on the delivery callback instead of sleeping; the scripts
wait for a definite window state before they end."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import torch

from perftracker.clock import FakeClock
from perftracker.runtime.window import ProfileWindow, WindowOptions, WindowResult

SCRIPT = textwrap.dedent("""\
    import logging, sys, time
    logging.basicConfig(level=logging.INFO, format="LOG %(name)s %(message)s", stream=sys.stdout)
    import torch
    import perftracker
    from perftracker.config import Config
    from perftracker.runtime.window import ProfileWindow, WindowOptions

    mode, out_dir = sys.argv[1], sys.argv[2]
    rt = perftracker.activate(Config.from_env(autostart_agent=False))
    holder = []
    # "writing": the writer waits at its gate until the exit hook starts (its exit event), so the
    # script can wait for the definite state "finishing" (it never races a fast writer to "idle").
    # "too-slow": the writer waits until the exit hook cancels it (a build longer than the delay).
    gate = {"running": None, "writing": lambda exiting: exiting.wait(120),
            "too-slow": lambda exiting: holder[0].writer.cancelled.wait(120)}[mode]
    opts = WindowOptions(spawn_sampler=(mode == "running"), writer_duty=0.02,
                         exit_wait_s=1.0 if mode == "too-slow" else 30.0, writer_gate=gate)
    win = ProfileWindow(rt.identity, out_dir, runtime=rt, options=opts)
    holder.append(win)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    win.arm("s1", 60.0 if mode == "running" else 0.2,
            lambda res: print("DONE", repr(res.error), res.end_ns, res.iterations, flush=True))
    deadline = time.monotonic() + 90
    want = "active" if mode == "running" else "finishing"
    i = 0
    while time.monotonic() < deadline:
        model(torch.randn(64, 32)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        i += 1
        # "running": end with complete iterations in the window (one with none is discarded by
        # design); waiting for i % 20 alone raced the window's start on a loaded host
        if win.state == want and (mode != "running" or (i % 20 == 0 and len(win._cur.boundaries_ns) >= 3)):
            break
    model(torch.randn(64, 32)).pow(2).mean().backward()  # half an iteration: cut off at exit
    print("STATE", win.state, flush=True)
    if mode == "running":
        print("LAST", win._cur.boundaries_ns[-1], len(win._cur.boundaries_ns) - 1, flush=True)
    print("END", time.monotonic_ns(), flush=True)
    """)


def _children_of(pid: int) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"])
            if "perftracker.agent.samplers" in " ".join(p.info["cmdline"] or ()) and str(pid) in (p.info["cmdline"] or ())]


@pytest.mark.parametrize("mode", ["running", "writing", "too-slow"])
def test_script_ending_mid_window_hands_it_over_within_the_delay(mode: str, tmp_path: Path,
                                                                 clean_env: dict[str, str]) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = {**clean_env, "PERFTRACKER_AUTOSTART_AGENT": "0", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(script), mode, str(tmp_path / "out")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate(timeout=150)
    ended_ns = time.monotonic_ns()
    assert proc.returncode == 0, out[-4000:]
    lines = out.splitlines()
    want = "active" if mode == "running" else "finishing"
    assert f"STATE {want}" in lines, out[-4000:]
    done = [ln.split() for ln in lines if ln.startswith("DONE")]
    assert len(done) == 1, out[-4000:]  # one result, whatever happened
    discarded = [ln for ln in lines if ln.startswith("LOG perftracker.runtime.window") and "discarded" in ln]
    end_ns = int(next(ln for ln in lines if ln.startswith("END")).split()[1])
    if mode == "too-slow":  # cancelled at the delay: discarded, logged once, exit not held up
        assert len(discarded) == 1 and "while it was written" in discarded[0], out[-4000:]
        assert done[0][1] == "'discarded:" and not list((tmp_path / "out").glob("*.raw.npz")), out[-4000:]
        assert (ended_ns - end_ns) / 1e9 < 15.0  # 1 s delay + 1 s join (generous: 2 loaded cores)
    else:  # written and delivered: the agent would get it
        assert not discarded and done[0][1] == "''", out[-4000:]
        assert len(list((tmp_path / "out").glob("*.raw.npz"))) == 1, out[-4000:]
        assert any("handed over at exit" in ln for ln in lines), out[-4000:]
    if mode == "running":  # cut at the last complete iteration: the half iteration after it is not in it
        last = next(ln.split() for ln in lines if ln.startswith("LAST"))
        assert int(done[0][2]) == int(last[1]) and int(done[0][3]) == int(last[2]) >= 1, (done, last)
        assert any("cut at exit at its last complete iteration" in ln for ln in lines), out[-4000:]
    assert not _children_of(proc.pid)  # the sampler process is gone too


TORCHRUN_JOB = textwrap.dedent("""\
    import logging, os, sys, time
    logging.basicConfig(level=logging.INFO, format="LOG %(name)s %(message)s", stream=sys.stdout)
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    import perftracker
    from perftracker.runtime import window_local
    from perftracker.config import Config
    from perftracker.runtime.window_local import LocalWindowSink

    dist.init_process_group("gloo")
    rt = perftracker.activate(Config.from_env(autostart_agent=False))
    rt.set_sink(LocalWindowSink(rt, sys.argv[1], window_s=30.0))
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(400000, 32)), batch_size=16)
    deadline = time.monotonic() + 60
    for i, (x,) in enumerate(data):
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        if i == 3:
            perftracker.trigger("manual", {"session": "exit-test"})
        win = window_local._local
        active = win is not None and win.state == "active" and len(win._cur.boundaries_ns) >= 2  # 1 iteration
        flag = torch.tensor([1 if active or time.monotonic() > deadline else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # end together, inside every rank's window
        if flag.item():
            break
    os.write(1, f"RANK {dist.get_rank()} ENDS\\n".encode())  # one write: the ranks share stdout
    dist.destroy_process_group()
    """)


def test_torchrun_job_ending_mid_window_exits_zero_and_hands_both_windows_over(tmp_path: Path, free_port: int,
                                                   clean_env: dict[str, str]) -> None:
    job = tmp_path / "job.py"
    job.write_text(TORCHRUN_JOB)
    env = {**clean_env, "PERFTRACKER_AUTOSTART_AGENT": "0", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_port", str(free_port), str(job), str(tmp_path / "windows")],
                       capture_output=True, text=True, timeout=150, env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert sorted(re.findall(r"RANK (\d) ENDS", r.stdout)) == ["0", "1"], out[-4000:]  # (ranks share stdout)
    started = re.findall(r"window exit-test started", r.stdout)
    cut = re.findall(r"window exit-test cut at exit at its last complete iteration", r.stdout)
    assert len(started) == 2 and len(cut) == 2 and "discarded" not in r.stdout, out[-4000:]  # once per rank
    assert sorted(p.name for p in (tmp_path / "windows").glob("*.raw.npz")) == [
        "exit-test-rank0.raw.npz", "exit-test-rank1.raw.npz"], out[-4000:]


class _Ident:
    rank, world_size, local_rank, host, job = 0, 1, 0, "h", "j"
    pid = 0
    training_tid = threading.get_native_id()


def _boundary(win: ProfileWindow, clock: FakeClock, i: int, advance_s: float = 0.0) -> None:
    """One training iteration: some work for the profiler, then a boundary at the fake clock's time.
    The window reads the fake clock, so whether this boundary starts, continues or ends the window
    follows from ``advance_s`` alone, never from how fast this machine runs."""
    torch.ones(32, 32).matmul(torch.ones(32, 32))
    clock.advance_s(advance_s)
    win.on_boundary(clock.now_ns(), i)


def _start(win: ProfileWindow, clock: FakeClock) -> None:
    clock.t_ns = max(clock.t_ns, time.monotonic_ns())  # timestamps near the profiler's own
    _boundary(win, clock, 0)  # no sampler process to wait for: the first boundary opens the window
    assert win.state == "active", win.state


def _end(win: ProfileWindow, clock: FakeClock, window_s: float) -> None:
    _boundary(win, clock, 1, 0.01)
    assert win.state == "active", win.state
    _boundary(win, clock, 2, window_s)  # the first boundary after window_s closes the window
    assert win.state in ("finishing", "idle"), win.state  # (idle: an ungated writer already delivered)


def _recorder() -> tuple[list[WindowResult], threading.Event, Callable[[WindowResult], None]]:
    done: list[WindowResult] = []
    delivered = threading.Event()

    def on_done(res: WindowResult) -> None:
        done.append(res)
        delivered.set()

    return done, delivered, on_done


def _stack_sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "perftracker-stack-sampler"]


def test_deactivate_stops_an_open_window(tmp_path: Path, clean_env: dict[str, str]) -> None:
    from perftracker.config import Config
    from perftracker.runtime import runtime as rt_mod

    switch = sys.getswitchinterval()
    clock = FakeClock(time.monotonic_ns())
    rt = rt_mod.activate(Config.from_env(autostart_agent=False))
    try:
        win = ProfileWindow(_Ident(), tmp_path, clock=clock, runtime=rt)
        done: list[WindowResult] = []
        assert win.arm("d1", 60.0, done.append)
        _start(win, clock)
        _boundary(win, clock, 1, 1.0)
        assert win.state == "active" and torch._C._autograd._profiler_enabled()
    finally:
        rt_mod.deactivate()  # in the training thread, as a training script would
    assert not torch._C._autograd._profiler_enabled()
    assert sys.getswitchinterval() == pytest.approx(switch)
    assert not _stack_sampler_threads()
    assert win.state == "idle" and len(done) == 1 and done[0].error.startswith("discarded: perftracker deactivated")
    assert done[0].raw_path is None and not list(tmp_path.glob("*.raw.npz"))
    # an armed (not yet started) window is cancelled too, and the window can be used again afterwards
    assert win.arm("d2", 60.0, done.append)
    rt = rt_mod.activate(Config.from_env(autostart_agent=False))
    rt_mod.deactivate()
    assert win.state == "idle" and len(done) == 2 and "discarded" in done[1].error
    assert win.arm("d3", 0.05, done.append)
    _start(win, clock)
    _end(win, clock, 0.05)
    assert win.wait(60) and len(done) == 3 and done[2].error == "" and done[2].raw_path is not None, done
    assert not torch._C._autograd._profiler_enabled()


@pytest.mark.timeout(60)
def test_shutdown_waits_for_a_cancelled_writer(tmp_path: Path) -> None:
    reached = threading.Event()

    def gate(cancel: threading.Event) -> None:  # hold the writer until the exit path cancels it
        reached.set()
        cancel.wait(30)

    clock = FakeClock(time.monotonic_ns())
    win = ProfileWindow(_Ident(), tmp_path, clock=clock,
                        options=WindowOptions(writer_duty=0.01, spawn_sampler=False, writer_gate=gate))
    done, delivered, on_done = _recorder()
    assert win.arm("w1", 1.0, on_done)
    _start(win, clock)
    _end(win, clock, 1.0)
    assert reached.wait(30) and win.state == "finishing" and not done
    assert not torch._C._autograd._profiler_enabled()  # the training thread stopped it already
    t0 = time.monotonic()
    win.shutdown("process exiting", writer_wait_s=20.0)
    assert time.monotonic() - t0 < 20.0
    assert not win.writer.thread.is_alive()  # shutdown returned once the writer ended, not at the limit
    assert win.state == "idle" and len(done) == 1, (win.state, done)
    assert done[0].error == "discarded: process exiting" and done[0].raw_path is None, done
    assert not list(tmp_path.glob("*.raw.npz"))


@pytest.mark.timeout(60)
def test_shutdown_waits_for_a_stuck_writer_at_most_writer_wait_s(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    reached, release = threading.Event(), threading.Event()

    def gate(cancel: threading.Event) -> None:  # a writer that does not get to a cancel check
        reached.set()
        release.wait(30)

    clock = FakeClock(time.monotonic_ns())
    win = ProfileWindow(_Ident(), tmp_path, clock=clock,
                        options=WindowOptions(spawn_sampler=False, exit_wait_s=0.3, writer_gate=gate))
    done, delivered, on_done = _recorder()
    assert win.arm("w2", 1.0, on_done)
    _start(win, clock)
    _end(win, clock, 1.0)
    assert reached.wait(30)
    t0 = time.monotonic()
    with caplog.at_level("WARNING", logger="perftracker.runtime.window"):
        win.shutdown("process exiting", writer_wait_s=win.options.exit_wait_s)
    waited_s = time.monotonic() - t0
    assert 0.25 <= waited_s < 10.0, waited_s  # (the upper bound is generous: 2 loaded cores)
    assert win.state == "finishing" and not done
    assert any("writer still busy after 0.3 s" in r.getMessage() for r in caplog.records), caplog.text
    release.set()  # the writer goes on, sees the cancel and discards the window: one result
    assert delivered.wait(30) and win.wait(30)
    assert len(done) == 1 and done[0].error == "discarded: process exiting", done


@pytest.mark.timeout(60)
def test_a_hang_mid_window_is_abandoned_and_the_next_boundary_cleans_up(tmp_path: Path) -> None:
    switch = sys.getswitchinterval()
    clock = FakeClock(time.monotonic_ns())
    # the watchdog is a real timer (window_s + overrun_s); 2 s keeps it well clear of h3's two
    # back-to-back boundaries below
    win = ProfileWindow(_Ident(), tmp_path, clock=clock, options=WindowOptions(overrun_s=2.0))
    done, delivered, on_done = _recorder()
    assert win.arm("h1", 0.2, on_done)
    _start(win, clock)
    assert delivered.wait(30)  # the training thread "hangs": no boundary until the watchdog fired
    assert win.state == "overrun" and len(done) == 1, (win.state, done)
    assert done[0].error.startswith("abandoned: no iteration boundary") and done[0].raw_path is None
    assert not _stack_sampler_threads()  # sampler stopped
    assert sys.getswitchinterval() == pytest.approx(switch)
    assert torch._C._autograd._profiler_enabled()  # only the training thread can stop it ...
    assert not win.arm("h2", 0.2, on_done)  # ... so no new window until then
    _boundary(win, clock, 10**6, 30.0)  # training resumes
    assert win.state == "idle" and not torch._C._autograd._profiler_enabled(), win.state
    assert len(done) == 1 and not list(tmp_path.glob("*.raw.npz")), done  # dropped, reported once
    assert win.arm("h3", 0.05, on_done)  # usable again, and a normal window is not abandoned
    _start(win, clock)
    _end(win, clock, 0.05)
    assert win.wait(60), win.state
    assert len(done) == 2 and done[1].error == "" and done[1].raw_path is not None, done


@pytest.mark.timeout(60)
def test_exit_during_an_abandoned_window_stops_the_profiler(tmp_path: Path) -> None:
    clock = FakeClock(time.monotonic_ns())
    win = ProfileWindow(_Ident(), tmp_path, clock=clock, options=WindowOptions(overrun_s=0.5))
    done, delivered, on_done = _recorder()
    assert win.arm("h4", 0.1, on_done)
    _start(win, clock)
    assert delivered.wait(30)  # the watchdog abandoned it
    assert win.state == "overrun" and torch._C._autograd._profiler_enabled()
    win.shutdown("process exiting", writer_wait_s=1.0)  # the exit hook, in the training thread
    assert win.state == "idle" and not torch._C._autograd._profiler_enabled() and len(done) == 1
    assert done[0].error.startswith("abandoned:"), done
