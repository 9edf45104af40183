"""The first look end to end (issue 30, Deliver 2): a real 2-rank gloo DDP job under `perftracker
run` (agent + embedded localizer, PERFTRACKER_FIRST_LOOK=1). From iteration 150, rank 1's batches
take 25 ms longer to load (its collate_fn sleeps, in the training thread: num_workers=0). The
detector fires, the heartbeats carry both ranks' per-step phase times, and the localizer closes the
session with a report of the level "first look" naming rank 1's data loading; no window runs.
The detector often fires a few iterations after the onset, before the heartbeats carry ten slow
steps: that first session then runs a window (the first look defers), and the next ones (the other
rank's trigger, the post-window check) are settled by the first look.

The twin (not found by the first look): the same job with rank 1's *forward* 25 ms slower. The
hooks put that in "forward/backward and collectives", which needs kernel detail: the session opens
and the window runs, and its report's level is "window".
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from agent_helpers import env_for_tests, wait_until
from perftracker.agent.daemon.localizer_client import Uplink

from perftracker.model import Report

JOB = textwrap.dedent("""\
    import os, sys, time
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    import perftracker

    where, progress = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    it = [0]
    slow = lambda: rank == 1 and it[0] >= 150

    def collate(items):
        if where == "data" and slow():
            time.sleep(0.025)
        return torch.stack([x for x, in items])

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))

        def forward(self, x):
            if where == "forward" and slow():
                time.sleep(0.025)
            return self.body(x)

    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(64 * 32, 64))
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and not os.path.exists(os.path.join(progress, "stop")):
        for x in DataLoader(data, batch_size=32, collate_fn=collate):
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            time.sleep(0.01)
            it[0] += 1
    dist.barrier()
    dist.destroy_process_group()
    """)


def _run(tmp_path: Path, where: str, sessions: int) -> tuple[list[Report], Path]:
    """Run the job until ``sessions`` sessions are localized; every report of the run."""
    job = tmp_path / "job.py"
    job.write_text(JOB)
    progress = tmp_path / "progress"
    progress.mkdir()
    env = env_for_tests(PERFTRACKER_JOB_ID="firstlook", OMP_NUM_THREADS="1", PERFTRACKER_FIRST_LOOK="1")
    # --wait-s 0: every report the test reads is in before the job is stopped; sessions the detector
    # opens later are not waited for at exit (``perftracker run`` waits for them by default)
    proc = subprocess.Popen(
        [sys.executable, "-m", "perftracker", "run", "--window-s", "3", "--nproc-per-node", "2", "--wait-s", "0", "--",
         str(job), where, str(progress)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    runs = tmp_path / "perftracker-runs"
    reports: list[Report] = []
    try:
        wait_until(lambda: (runs / "localizer.json").exists(), 60, what="the localizer")
        info = json.loads((runs / "localizer.json").read_text())
        up = Uplink(info["url"], (runs / "token").read_text().strip(), retries=1)

        def localized() -> list[Report]:
            done = [s for s in up.list_sessions("firstlook") if s.get("state") == "done"]
            got = [up.get_report(s["session"]) for s in done]
            return [r for r in got if r is not None] if len(done) >= sessions else []

        reports = wait_until(localized, 150, step_s=0.5, what=f"{sessions} localized sessions")
        (progress / "stop").write_text("")
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return reports, runs / "reports"


@pytest.mark.timeout(400)
def test_slow_data_loading_on_one_rank_is_settled_by_the_first_look(tmp_path: Path) -> None:
    reports, files = _run(tmp_path, "data", 2)  # the first may run a window (see the module docstring)
    looks = [r for r in reports if r.level == "first look"]
    assert looks, [r.to_dict() for r in reports]
    for r in looks:  # every first-look report names rank 1's data loading, with no window
        assert [f.ranks for f in r.findings] == [(1,)] and r.findings[0].label == "data loading", r.to_dict()
        assert r.window_s == 0.0
        assert json.loads((files / f"{r.session}.json").read_text())["level"] == "first look"  # as a window's
    print(f"first look settled {len(looks)} of {len(reports)} sessions: {looks[0].headline}")


@pytest.mark.timeout(400)
def test_slow_forward_on_one_rank_runs_the_window(tmp_path: Path) -> None:
    reports, _ = _run(tmp_path, "forward", 1)
    assert all(r.diagnosis_level == "window" and r.window_s > 0 for r in reports), [r.to_dict() for r in reports]
    print(f"window reports: {[r.headline for r in reports]}")
