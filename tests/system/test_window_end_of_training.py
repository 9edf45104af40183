"""A window cut by the end of training still ends in a report with every rank (issue 30, Deliver 4).

`perftracker run` (agent + embedded localizer) runs a 2-rank gloo DDP job; the test triggers a 20 s
window through the localizer, and the job ends as soon as both ranks are inside it (3 iterations
in), as a job whose trigger comes near its end does. Each rank cuts its window at exit and hands
the profiler's result to a child that outlives it; the agent waits for the child's file and
summarizes it after the rank has gone. The report must name both ranks. Each rank measures its
exit (end of training to its last atexit hook, registered before perftracker's): printed, not
asserted (timed tests do not assert performance); the hand-over itself is checked in the log, and
the window's cost, measured at each rank's exit (partial), in the log and the report.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from agent_helpers import env_for_tests, wait_until

JOB = textwrap.dedent("""\
    import atexit, logging, os, sys, time
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    def at_exit():  # registered before perftracker's hooks: runs after them
        os.write(1, f"EXIT {dist_rank[0]} {(time.monotonic_ns() - ended[0]) / 1e9:.3f}\\n".encode())

    dist_rank, ended = [0], [0]
    atexit.register(at_exit)
    logging.basicConfig(level=logging.INFO, format="LOG %(name)s %(message)s", stream=sys.stdout)
    import perftracker
    from perftracker.runtime.channel import get_channel

    dist.init_process_group("gloo")
    dist_rank[0] = dist.get_rank()
    progress = sys.argv[1]
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    deadline = time.monotonic() + 150
    i = 0
    while True:
        model(torch.randn(32, 64)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        i += 1
        if i % 10 == 0:
            with open(os.path.join(progress, f"rank{dist_rank[0]}.iter"), "w") as f:
                f.write(str(i))
        ch = get_channel()
        win = getattr(ch, "_window", None) if ch is not None else None
        inside = win is not None and win.state == "active" and len(win._cur.boundaries_ns) >= 4
        flag = torch.tensor([1 if inside or time.monotonic() > deadline else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # end together, inside every rank's window
        if flag.item():
            break
    ended[0] = time.monotonic_ns()
    os.write(1, f"RANK {dist_rank[0]} ENDS {i}\\n".encode())
    dist.destroy_process_group()
    """)


@pytest.mark.timeout(300)
def test_a_window_cut_by_the_end_of_training_ends_in_a_report_with_both_ranks(tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text(JOB)
    progress = tmp_path / "progress"
    progress.mkdir()
    env = env_for_tests(PERFTRACKER_JOB_ID="endjob", OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "perftracker", "run", "--window-s", "20", "--nproc-per-node", "2", "--keep-windows",
         "--", str(job), str(progress)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    runs = tmp_path / "perftracker-runs"
    out = err = ""
    try:
        def iters(rank: int) -> int:
            try:
                return int((progress / f"rank{rank}.iter").read_text())
            except (OSError, ValueError):
                return -1

        wait_until(lambda: iters(0) >= 20 and iters(1) >= 20 and (runs / "localizer.json").exists(), 120,
                   what="training")
        from perftracker.agent.daemon.localizer_client import Uplink

        info = json.loads((runs / "localizer.json").read_text())
        up = Uplink(info["url"], (runs / "token").read_text().strip(), retries=1)
        wait_until(lambda: "endjob" in up.jobs(), 30, what="job registered")
        session, _ = up.create_trigger("endjob", "test", 20.0)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            out, err = proc.communicate()
    assert proc.returncode == 0, (out + err)[-5000:]
    ends = sorted(re.findall(r"RANK (\d) ENDS", out))
    assert ends == ["0", "1"], (out + err)[-5000:]
    cut = re.findall(rf"window {session} cut at exit at its last complete iteration", out)
    handed = re.findall(rf"window {session} handed to process (\d+)", out)
    assert len(cut) == 2 and len(handed) == 2 and "discarded" not in out, (out + err)[-5000:]
    report = json.loads((runs / "reports" / f"{session}.json").read_text())
    assert report["ranks_reported"] == [0, 1], json.dumps(report)[:3000]
    # the report says its level and what the window cost (issue 30): sent by the real workers' channel
    cost = report["window_cost"]
    assert report["level"] == "window" and {"window_s", "blocked_s", "budget_s", "left_s"} <= set(cost), cost
    assert 0 < cost["window_s"] <= 20.5 and cost["budget_s"] == 72.0 and cost["left_s"] <= 72.0, cost
    # the process ended before the window's after-phase: its cost was measured at the exit, partial
    assert cost.get("cost_partial") == 1.0 and cost.get("cost_s", -1.0) >= 0.0, cost
    measured = re.findall(rf"window {session} cost (-?[0-9.]+) s of training over [0-9.]+ s "
                          r"\(partial: the process ended\)", out)
    assert len(measured) == 2, (out + err)[-5000:]
    exits = {int(r): float(s) for r, s in re.findall(r"EXIT (\d) ([0-9.]+)", out)}
    assert sorted(exits) == [0, 1], out[-3000:]
    print(f"exit after training, per rank (s): {exits}; window cost in the report: {cost}")
