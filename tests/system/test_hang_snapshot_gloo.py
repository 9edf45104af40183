"""Hang snapshots in real gloo jobs (2 ranks): a torchrun DDP job whose rank 1 sleeps in forward,
and the survivor of a SIGKILLed peer (the snapshot itself, from threads of this process:
tests/component/test_hang_snapshot.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from perftracker.localizer.diagnose.incidents.hang import localize_hang

from perftracker.model import Frame, HangSnapshot

REPO = Path(__file__).resolve().parents[2]

WORKER = textwrap.dedent(
    """
    import json, os, sys, threading, time
    from types import SimpleNamespace
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from perftracker.runtime.hang_capture import take_snapshot

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out = sys.argv[1]
    HANG_AT = 3

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(32, 32)
            self.b = torch.nn.Linear(32, 1)
            self.it = 0

        def forward(self, x):
            if rank == 1 and self.it == HANG_AT:
                time.sleep(600)
            return self.b(torch.relu(self.a(x)))

    state = SimpleNamespace(iteration=0, last=None)
    runtime = SimpleNamespace(
        identity=SimpleNamespace(rank=rank, world_size=2, local_rank=rank, host="h", pid=os.getpid(),
                                 training_tid=threading.get_native_id(), job="j"),
        last_event=lambda: state.last)
    net = Net()
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    taken = threading.Event()  # this rank's snapshot is written

    def controller():
        while state.iteration < HANG_AT:
            time.sleep(0.05)
        time.sleep(2.0)  # both ranks are blocked by now
        runtime.iteration = state.iteration
        snap = take_snapshot(runtime, session="t")
        path = os.path.join(out, f"snap{rank}.json")
        with open(path + ".tmp", "w") as fh:
            json.dump(snap.to_dict(), fh)
        os.rename(path + ".tmp", path)
        taken.set()
        # a rank that exits ends its peer's collective with an error: wait until every rank has
        # taken its snapshot (on a loaded host the two controllers need not wake together)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(
                os.path.exists(os.path.join(out, f"snap{r}.json")) for r in range(2)):
            time.sleep(0.05)
        os._exit(0)

    threading.Thread(target=controller, daemon=True).start()
    try:
        for it in range(10):
            net.it = it
            loss = model(torch.randn(16, 32)).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            state.iteration = it + 1
            state.last = ("optimizer.step", time.monotonic_ns())
    except RuntimeError:
        # the peer exited once both snapshots were written, which ends this rank's collective:
        # its controller ends this process (exit 0) in a moment
        if not taken.is_set():
            raise
    time.sleep(30)
    """
)


def test_real_gloo_ddp_hang_snapshots(tmp_path: Path, free_port: int) -> None:
    """2 ranks, gloo, DDP: rank 1 sleeps in forward; rank 0 must be seen waiting in allreduce."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
         "--master_port", str(free_port), str(script), str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    snaps = [HangSnapshot.from_dict(json.loads((tmp_path / f"snap{r}.json").read_text())) for r in (0, 1)]
    waiter, culprit = snaps
    # what a gloo rank shows while its peer is missing in DDP backward (grounded, torch 2.13)
    assert waiter.stack[-1] == Frame("<lib>/torch/autograd/graph.py", waiter.stack[-1].line, "_engine_run_backward")
    assert "futex" in waiter.kernel_state
    assert waiter.current_op == "c10d allreduce (DDP backward)"
    assert culprit.stack[-1].file == "worker.py" and culprit.stack[-1].function == "forward"
    assert culprit.current_op == "time.sleep" and culprit.kernel_state.startswith("S")
    assert culprit.last_iteration == 3 and culprit.idle_s >= 1.5
    report = localize_hang(snaps, {}, [0, 1])
    assert report is not None
    assert [s.rank for s in report.hang_states if s.state == "culprit"] == [1]
    line = culprit.stack[-1].line
    assert report.summary == (f"hang: rank 1 stopped at worker.py:{line} in forward (time.sleep) since "
                              "iteration 3; all other ranks wait in c10d allreduce (DDP backward)")


KILLED_PEER = textwrap.dedent(
    """
    import json, os, signal, sys, threading, time
    from types import SimpleNamespace
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from perftracker.runtime.hang_capture import exit_snapshot

    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    runtime = SimpleNamespace(
        identity=SimpleNamespace(rank=rank, world_size=2, local_rank=rank, host="h", pid=os.getpid(),
                                 training_tid=threading.get_native_id(), job="j"),
        iteration=0, last_event=lambda: None)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))

    def step():
        loss = model(torch.randn(8, 32)).sum()
        loss.backward()

    try:
        for it in range(1000):
            if rank == 1 and it == 5:
                os.kill(os.getpid(), signal.SIGKILL)
            step()
            runtime.iteration = it + 1
    except Exception as exc:
        snap = exit_snapshot(runtime, exc)
        with open(sys.argv[1], "w") as fh:
            json.dump(snap.to_dict(), fh)
    """
)


def test_real_gloo_survivor_of_a_killed_peer_fails_in_the_collective(tmp_path: Path, free_port: int) -> None:
    script = tmp_path / "killed.py"
    script.write_text(KILLED_PEER)
    base = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(free_port), WORLD_SIZE="2")
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / f"exit{r}.json")], cwd=tmp_path,
                              env=dict(base, RANK=str(r)), stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    try:
        rc0 = procs[0].wait(timeout=300)
        rc1 = procs[1].wait(timeout=10)
    finally:
        for p in procs:
            p.kill()
    assert rc1 == -9 and rc0 == 0, procs[0].stderr.read()[-2000:]  # type: ignore[union-attr]
    snap = HangSnapshot.from_dict(json.loads((tmp_path / "exit0.json").read_text()))
    # what a gloo survivor shows: the exception ends DDP backward's allreduce wait
    assert snap.current_op == "c10d allreduce (DDP backward)", snap
    assert snap.stack[-1].function == "_engine_run_backward" and snap.stack[-2].function == "backward"
    assert snap.error.startswith("RuntimeError") and ("Connection" in snap.error or "closed" in snap.error)
    assert snap.last_iteration == 5
    assert not (tmp_path / "exit1.json").exists()
