"""`perftracker demo`: a slow rank found end to end on this machine, in about a minute.

1. Starts a node agent with its embedded localizer (reports under ./perftracker-runs/).
2. Runs perftracker/examples/train.py on 4 CPU workers (torchrun, gloo) with `import perftracker`.
3. From iteration 100 on, one rank computes more: perftracker/examples/train.py's ``compute`` fault adds batched
   matmuls (aten::bmm) in its forward pass for 0.5x the rank's own mean iteration time, so the job
   slows down by about half.
4. Waits for perftracker's own detector to trigger, for every worker's profile window and for the
   localizer's report; prints the report, the end-to-end time from trigger to stored report minus
   the window, and whether the report names the throttled rank with compute as the cause.

examples:
  perftracker demo
  perftracker demo --slow-rank 1 --slowdown 0.3 --format json
  perftracker demo --keep-windows && perftracker export-trace latest --rank 2 -o rank2.trace.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from perftracker.cli import output
from perftracker.cli.options import add_alias, add_data_dir
from perftracker.errors import ConfigError, PerftrackerError
from perftracker.model.names import check_name, safe_text

HELP = "run perftracker/examples/train.py on 4 CPU workers with a slow rank and print the diagnosis"
DESCRIPTION = __doc__

log = logging.getLogger(__name__)
JOB = "demo"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc-per-node", dest="workers", type=int, default=4, metavar="N",
                   help="torchrun workers (default %(default)s)")
    add_alias(p, "--workers", "--nproc-per-node", "workers", type=int)  # run's name for it (issue 47)
    p.add_argument("--slow-rank", type=int, default=2, help="the rank with slow compute (default %(default)s)")
    p.add_argument("--slowdown", type=float, default=0.5,
                   help="extra compute on the slow rank, as a fraction of its iteration time (default %(default)s)")
    p.add_argument("--fault-at-iter", type=int, default=100, help="the fault starts at this iteration (default %(default)s)")
    p.add_argument("--window-s", type=float, default=5.0, help="profile window (default %(default)s)")
    p.add_argument("--detector-wait-s", type=float, default=90.0,
                   help="trigger on demand if the detector has not triggered this long after the fault (default %(default)s)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="give up after this long (default %(default)s)")
    add_data_dir(p, "the embedded localizer's store, reports and token")
    p.add_argument("--script", default=None, help="training script (default: the demo job shipped in the package, perftracker/examples/train.py)")
    p.add_argument("--format", choices=("text", "json"), default="text", help="report output (default text)")
    from perftracker.cli.run import add_keep_windows

    add_keep_windows(p)


def find_script(given: str | None) -> Path:
    if given:
        path = Path(given)
    else:
        import perftracker

        path = Path(perftracker.__file__).resolve().parent / "examples" / "train.py"  # package data
    if not path.is_file():
        raise ConfigError(f"training script {path} not found (a broken install?); give --script")
    return path


def _progress(progress_dir: Path, rank: int) -> tuple[int, int]:
    """(iteration, pid) that perftracker/examples/train.py --progress-dir writes for a rank; (-1, 0) if none yet."""
    try:
        it, pid = (progress_dir / f"rank{rank}.iter").read_text().split()[:2]
        return int(it), int(pid)
    except (OSError, ValueError):
        return -1, 0


def _say(msg: str) -> None:
    sys.stderr.write(f"demo: {safe_text(msg)}\n")
    sys.stderr.flush()


def _wait(pred: Any, timeout_s: float, what: str, proc: subprocess.Popen[bytes] | None = None,
          step_s: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise PerftrackerError(f"training exited (code {proc.returncode}) while waiting for {what}")
        time.sleep(step_s)
    raise PerftrackerError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def verdict(report: Any, slow_rank: int) -> tuple[bool, str]:
    """Whether the report names the slow rank with a compute finding."""
    for f in report.findings:
        if f.category.value == "compute" and slow_rank in f.ranks and len(f.ranks) < report_size(report):
            return True, f"the report names rank {slow_rank} with compute as the cause ({f.label})"
    return False, f"the report does not name rank {slow_rank} with a compute finding"


def report_size(report: Any) -> int:
    return max(1, len(report.ranks_reported))


def run(args: argparse.Namespace) -> int:
    from perftracker.cli.run import LocalAgent, free_port

    script = find_script(args.script)
    if not 0 <= args.slow_rank < args.workers:
        raise ConfigError(f"--slow-rank {args.slow_rank}: not a rank of {args.workers} workers")
    t_start = time.monotonic()
    _say(f"starting a node agent with an embedded localizer (reports under {Path(args.runs_dir).resolve()})")
    agent = LocalAgent.start(args.runs_dir, args.window_s, collect_grace_s=60.0, keep_windows=args.keep_windows)
    train = None
    try:
        progress = agent.run_dir / "progress"
        progress.mkdir()
        env = agent.env(args.window_s)
        env["PERFTRACKER_JOB_ID"] = JOB
        # calibrated for a shared machine: fire on a sustained slowdown of 25% or more, not on noise,
        # and if noise fired before the fault anyway, fire again soon
        env.setdefault("PERFTRACKER_SLOWDOWN_THRESHOLD", "0.25")
        env.setdefault("PERFTRACKER_TRIGGER_COOLDOWN_S", "15")
        # a minute-long job whose second window (after a noise one) must not wait for 2 % of its
        # training to pay for the first: the whole hour's 72 s from the start (docs/window-cost.md)
        env.setdefault("PERFTRACKER_WINDOW_BUDGET_INITIAL_S", "72")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.workers),
               "--master_port", str(free_port()), str(script), "--iters", "1000000", "--quiet",
               "--progress-dir", str(progress), "--fault", f"compute:where=forward,frac={args.slowdown:g}",
               "--fault-ranks", str(args.slow_rank), "--fault-start-iter", str(args.fault_at_iter)]
        _say(f"training perftracker/examples/train.py on {args.workers} CPU workers (torchrun, gloo)")
        with open(agent.runs_dir / "demo-train.log", "wb") as out:
            train = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        _wait(lambda: all(_progress(progress, r)[0] >= args.fault_at_iter for r in range(args.workers)),
              args.timeout_s, f"{args.fault_at_iter} iterations on every rank", train)
        fault_wall_ns = time.time_ns()
        _say(f"fault: rank {args.slow_rank} computes {args.slowdown:.0%} more per iteration from iteration "
             f"{args.fault_at_iter} on; waiting for the detector")

        def new_session() -> dict[str, Any] | None:
            return next((s for s in agent.sessions() if int(s.get("opened_ns", 0)) >= fault_wall_ns), None)

        try:
            session = _wait(new_session, args.detector_wait_s, "a detector trigger", train)
            _say(f"detector triggered: {session.get('reason')} -> session {session['session']}")
        except PerftrackerError:
            _say(f"the detector did not trigger within {args.detector_wait_s:.0f} s; triggering on demand instead")
            sid, _ = agent.uplink().create_trigger(JOB, "demo: on demand", args.window_s)
            session = {"session": sid, "opened_ns": time.time_ns()}
        sid = check_name(session["session"], "session id from the localizer")
        up = agent.uplink()
        _say(f"profiling every worker for {args.window_s:g} s, summarizing, localizing")
        report = _wait(lambda: up.get_report(sid), args.window_s + 180, "the report", train, step_s=0.5)
        info = up.get_session(sid)
        opened_ns = int(info.get("opened_ns") or session.get("opened_ns") or 0)
        e2e_s = (report.created_ns - opened_ns) / 1e9 - report.window_s
    finally:
        agent.stop(remove_run_dir=False)  # first: ending the training below is no death to report
        if train is not None and train.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(train.pid, signal.SIGTERM)
            try:
                train.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(train.pid, signal.SIGKILL)
                train.wait()
        shutil.rmtree(agent.run_dir, ignore_errors=True)

    if args.format == "json":
        from perftracker.localizer.render import json as render_json

        render_json.render(report, sys.stdout)
    else:
        from perftracker.localizer.render import text as render_text

        render_text.render(report, sys.stdout, console=output.console())
    ok, why = verdict(report, args.slow_rank)
    report_file = agent.runs_dir / "reports" / f"{sid}.json"
    sys.stdout.write(
        f"\nend-to-end: {e2e_s:.1f} s from trigger to stored report, minus the {report.window_s:g} s window "
        f"(demo wall time {time.monotonic() - t_start:.0f} s)\n"
        f"report: {report_file}\n"
        f"{'OK' if ok else 'MISSED'}: {why}\n")
    sys.stdout.write(json.dumps({"session": sid, "e2e_minus_window_s": round(e2e_s, 2), "slow_rank": args.slow_rank,
                                 "found": ok}) + "\n")
    return 0 if ok else 1
