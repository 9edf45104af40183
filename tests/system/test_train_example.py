"""perftracker/examples/train.py as users run it: real torchrun (gloo) workers, real DataLoader, perftracker imported."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import EXAMPLE_TRAIN, REPO

SUMMARY = re.compile(
    r"\[rank (\d+)/(\d+)\] (\d+) iterations .* phase=(\w+) mode=(\w+) iteration=(\d+) sequence=([\w. ]+?) "
    r"(?:recent mean=([\d.]+) ms min=([\d.]+) ms )?triggers=(\d+) trigger_iterations=\[([\d, ]*)\]"
)


def _train_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("example_train", EXAMPLE_TRAIN)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


def _summaries(stdout: str) -> dict[int, re.Match[str]]:
    return {int(m.group(1)): m for m in SUMMARY.finditer(stdout)}


def test_fault_flags_parse_in_order() -> None:
    train = _train_module()
    faults = train.parse_faults(
        ["--fault", "sleep:where=forward,ms=5,every=2", "--fault-start-iter", "7",
         "--fault", "copy:mb=1,ranks=2+3", "--fault", "gc_stall:probability=0.5,ms=10,start_iter=4"],
        {1},
    )
    assert [(f.kind, f.start_iter, f.ranks) for f in faults] == [
        ("sleep", 7, {1}), ("copy", 0, {2, 3}), ("gc_stall", 4, {1})
    ]
    assert faults[0].num("ms", 0) == 5 and faults[0].where() == "forward"
    defaults = train.parse_faults(["--fault-start-iter", "3", "--fault", "busy_python:where=backward,ms=2"], None)
    assert defaults[0].start_iter == 3 and defaults[0].ranks is None
    with pytest.raises(SystemExit, match="unknown kind"):
        train.parse_faults(["--fault", "meteor:size=9"], None)
    with pytest.raises(SystemExit, match="bad parameter"):
        train.parse_faults(["--fault", "sleep:mb=3"], None)


def test_torchrun_two_workers_learn_sequence(clean_env: dict[str, str], free_port: int, tmp_path: Path) -> None:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "--master_port", str(free_port), str(EXAMPLE_TRAIN), "--iters", "60", "--num-workers", "1",
        "--quiet", "--checkpoint-every", "30", "--checkpoint-pause-s", "0.2",
        "--fault", "busy_python:where=forward,ms=2", "--fault-ranks", "1", "--progress-dir", str(tmp_path),
    ]
    # no node agent: this test is about sequence learning (an autostarted one would idle for 300 s)
    env = dict(clean_env, PERFTRACKER_AUTOSTART_AGENT="0")
    out = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    summaries = _summaries(out.stdout)
    assert sorted(summaries) == [0, 1], out.stdout
    for m in summaries.values():
        assert m.group(2) == "2" and m.group(4) == "tracking"
        assert m.group(6) == "60" and m.group(7) == "dataloader.next optimizer.step"
        assert float(m.group(8)) > 0
    assert "iteration times (ms)" in out.stdout
    it, pid = (tmp_path / "rank1.iter").read_text().split()
    assert it == "59" and int(pid) > 0


def test_injected_slowdown_triggers_the_detector(clean_env: dict[str, str]) -> None:
    """A +40 ms sleep in forward from iteration 150 on (about 3x here) is detected soon after onset.

    On a quiet box it fires 2-5 iterations after the onset; the bound is 20 because this 2-core
    machine is shared and its iteration-time noise (estimated by the detector) sometimes reaches a
    log-sigma near 1, which rightly makes the short windows more cautious.
    """
    cmd = [
        sys.executable, str(EXAMPLE_TRAIN), "--iters", "200", "--quiet", "--hidden", "128",
        "--fault", "sleep:where=forward,ms=40", "--fault-start-iter", "150",
    ]
    # no node agent: this test is about detection, not the profile window the agent would open
    env = dict(clean_env, PERFTRACKER_TRIGGER_COOLDOWN_S="0", PERFTRACKER_AUTOSTART_AGENT="0")
    out = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    m = _summaries(out.stdout)[0]
    iterations = [int(x) for x in m.group(11).split(",") if x.strip()]
    # runtime iteration i is the script's 0-based iteration i - 1; the first slow one is 151
    onset = [i for i in iterations if i >= 151]
    assert onset and onset[0] <= 170, (iterations, out.stdout)


def test_every_injection_point_runs(clean_env: dict[str, str], tmp_path: Path) -> None:
    """Each `where` of the in-script faults really executes (a fault that never runs would score
    perftracker against a fault that is not there: the backward one once sat on the input batch,
    which has no gradient, and never ran)."""
    iters = 6
    faults = [f"sleep:where={w},ms=1" for w in ("dataloader", "forward", "backward", "optimizer")]
    faults += ["busy_python:where=backward,ms=1", "copy:mb=1", "gc_stall:probability=1,ms=1"]
    cmd = [sys.executable, str(EXAMPLE_TRAIN), "--iters", str(iters), "--quiet", "--batch-size", "8"]
    for f in faults:
        cmd += ["--fault", f]
    env = dict(clean_env, PERFTRACKER_AUTOSTART_AGENT="0")  # no node agent: no window is wanted here
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    m = re.search(r"faults ran: (.*)", out.stdout)
    assert m, out.stdout
    ran = dict(kv.split("=") for kv in m.group(1).split())
    assert ran == {
        "sleep@dataloader": str(iters), "sleep@forward": str(iters), "sleep@backward": str(iters),
        "sleep@optimizer": str(iters), "busy_python@backward": str(iters), "copy@forward": str(iters),
        "gc_stall@end": str(iters),
    }
