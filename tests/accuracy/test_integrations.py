"""perftracker in the training stacks people use (issue 16): real frameworks, CPU, 2 ranks (one for the
single-process job), the default embedded setup (an autostarted node agent and localizer).

Each script under tests/framework_jobs/ is a plain user script but for its `import perftracker` line.
Each injects a clear slowdown (extra matrix products in the forward, well over +40 % of an
iteration) on one rank from a given optimizer step. The test runs the job to its end as a user
would, then waits for the agent to finish (the last window may be handed over at exit) and checks:

- the job ran to the end (rc 0) and no perftracker traceback reached its output;
- every rank registered under one job id (no job split by a guessed identity), the script's name;
- no hang report: the job ended cleanly, so no rank may look dead to the agent;
- the job's last slowdown report of every rank has a headline (its summary) that names the slow
  rank (a session opened in the job's last seconds may miss a rank that ended first). The slowdown
  lasts to the end of training, so the last session's window lies in it. On a loaded machine a
  noise trigger just before the slowdown may open that session, and the slowdown's own detection
  is then absorbed by its window (by design: docs/detection.md), so the test does not insist on a
  trigger after the slowdown; a window before the slowdown cannot name the slow rank.

Short windows and a short trigger cooldown come from PERFTRACKER_* variables only. Whether a noise
trigger or the slowdown opens the last session depends on the host's load, so these jobs run with
the accuracy tier (``python -m pytest -q tests/accuracy``; ``-m integration`` selects them alone).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from agent_helpers import REPO, cleanup, env_for_tests, short_run_dir

# A real 2-rank job on a shared 2-core machine is at the mercy of its scheduling: in repeated runs
# here each case passed most times, and a run failed now and then with no trigger at all, or with a
# noise trigger whose session missed a rank (docs/compatibility.md lists the runs). A second and
# third attempt keep one bad draw from failing the suite; a case that is broken fails all three.
pytestmark = [pytest.mark.integration, pytest.mark.flaky(reruns=2)]

SCRIPTS = REPO / "tests" / "framework_jobs"


@dataclass(frozen=True)
class Case:
    script: str
    launcher: str  # "torchrun" | "python" (the script or its framework starts the other rank)
    ranks: int
    slow_rank: int
    slow_from: int  # optimizer step from which the slow rank is slow
    steps: int
    extra: int  # extra matrix products per forward on the slow rank


CASES = {
    "hf_trainer": Case("hf_trainer.py", "torchrun", 2, 1, 100, 320, 6),
    "accelerate": Case("accelerate_loop.py", "torchrun", 2, 1, 100, 600, 1),
    "lightning": Case("lightning_ddp.py", "python", 2, 1, 100, 600, 1),
    "mp_spawn": Case("mp_spawn_ddp.py", "python", 2, 1, 100, 600, 1),
    "iterable_accum4": Case("iterable_accum.py", "torchrun", 2, 1, 60, 220, 1),
    "single_process": Case("single_process.py", "python", 1, 0, 100, 600, 1),
}
# the agent's log line for each detector trigger it forwards (agent/daemon/localizer_link.py)
_TRIGGERED = re.compile(r"triggered: slowdown \{[^\n]*'iteration': (\d+)")


def _command(case: Case, port: int) -> list[str]:
    args = [str(SCRIPTS / case.script), "--steps", str(case.steps), "--slow-rank", str(case.slow_rank),
            "--slow-from", str(case.slow_from), "--extra", str(case.extra)]
    if case.launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(case.ranks),
                "--master_port", str(port), *args]
    return [sys.executable, *args]


def _reports(runs: Path) -> list[dict[str, object]]:
    out = []
    for path in (runs / "reports").glob("*.json"):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):  # being written
            continue
    return sorted(out, key=lambda r: int(r.get("created_ns", 0)))  # type: ignore[call-overload]


def _settled(runs: Path) -> bool:
    """Every session of the embedded localizer has ended (reported or failed), and there is one."""
    import sqlite3

    try:
        with sqlite3.connect(f"file:{runs / 'localizer.sqlite'}?mode=ro", uri=True, timeout=5) as db:
            states = [s for (s,) in db.execute("SELECT state FROM sessions")]
    except sqlite3.Error:
        return False
    return bool(states) and not any(s in ("open", "localizing") for s in states)


def _stop_agent(run_dir: Path) -> None:
    try:
        pid = int(json.loads((run_dir / "agent.json").read_text())["pid"])
        os.kill(pid, signal.SIGTERM)
        psutil.Process(pid).wait(20)
    except (OSError, ValueError, KeyError, psutil.NoSuchProcess, psutil.TimeoutExpired):
        pass


def _agent_log(run_dir: Path, tail: int = 3000) -> str:
    try:
        return (run_dir / "agent.log").read_text(errors="replace")[-tail:]
    except OSError as exc:
        return f"(no agent log: {exc})"


@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", list(CASES))
def test_framework_job_ends_in_a_report_naming_the_slow_rank(name: str, tmp_path: Path, free_port: int) -> None:
    case = CASES[name]
    run_dir = short_run_dir(name[:6])
    env = env_for_tests(
        PERFTRACKER_RUN_DIR=str(run_dir), PERFTRACKER_AUTOSTART_AGENT="1",
        PERFTRACKER_WINDOW_S="3", PERFTRACKER_TRIGGER_COOLDOWN_S="5",
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port),
    )
    runs = tmp_path / "perftracker-runs"
    t0 = time.monotonic()
    try:
        job = subprocess.run(_command(case, free_port), cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=300)
        out = job.stdout + job.stderr
        trained_s = time.monotonic() - t0
        assert job.returncode == 0, out[-4000:] + "\nagent log:\n" + _agent_log(run_dir)
        assert f"{REPO}/perftracker/" not in out and f"{REPO}/agent/" not in out, out[-4000:]  # no traceback of ours
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not _settled(runs):  # the agent finishes after the job ended
            time.sleep(0.5)
        reports = _reports(runs)
        listing = "\n".join(f"  {r.get('trigger_reason')} | {r.get('summary')}" for r in reports)
        log = _agent_log(run_dir, 10**7)
        triggered = [int(m) for m in _TRIGGERED.findall(log)]  # detector triggers, by iteration (for the record)
        assert reports, f"no report (triggers at {triggered}):\n{log[-3000:]}\njob output:\n{out[-3000:]}"
        assert not [r for r in reports if r.get("kind") == "hang"], listing  # it ended cleanly: no death, no hang
        # a session opened in the last seconds of training may miss a rank that ended before its
        # window could start (a partial report, by design); the last report with every rank counts
        slowdowns = [r for r in reports if r.get("kind") == "slowdown"
                     and list(r.get("ranks_reported", ())) == list(range(case.ranks))]  # type: ignore[call-overload]
        assert slowdowns, f"no slowdown report of every rank:\n{listing}\n{log[-6000:]}"
        found = slowdowns[-1]
        headline = str(found["summary"])
        print(f"\n{name}: trained {trained_s:.0f} s, report after {time.monotonic() - t0:.0f} s, "
              f"triggers at iterations {triggered}; headline: {headline}")
        stem = Path(case.script).stem
        jobs = {str(r["job"]) for r in reports}
        assert len(jobs) == 1 and next(iter(jobs)).startswith(stem), jobs  # one job id, named after the script
        assert re.match(rf"rank {case.slow_rank}\b", headline), f"{name}: headline {headline!r}\n{listing}"
    finally:
        _stop_agent(run_dir)
        cleanup(run_dir)
