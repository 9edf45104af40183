"""A Hugging Face Trainer job with and without `import perftracker`, side by side in one run (issue 16).

The job: tests/framework_jobs/hf_trainer.py's tiny GPT-2 (built from a config, random tokens, no
download), `Trainer` under torchrun with 2 CPU ranks (gloo), no injected fault.

1. **Throughput.** Runs alternate off, on, on, off, ... (ABBA, ``--rounds`` pairs): "off" never
   imports perftracker; "on" imports it and gets the default embedded setup (a node agent is
   autostarted in a fresh run dir, as for a user's first job; detector triggers may open windows,
   which is part of the cost). Each run reports the Trainer's own ``train_samples_per_second``
   (rank 0). ``ratio`` = median(on) / median(off).
2. **A trigger about 30 s before the end** (``--trigger-before-end-s``): one more "on" run, longer,
   with ``perftracker trigger`` (the CLI, default 20 s window) sent once rank 0's remaining steps
   at its recent speed take that long (the detector's own triggers are off in this run, see
   ``--auto-triggers``). The window is still open or being written when
   training ends; it must be handed to the agent and end in a report. ``exit_delay_s`` is how much
   longer the ranks take from the end of ``trainer.train()`` to their last atexit hook than in the
   "off" runs (each rank measures it; the worst rank counts).

Usage: python bench/hf_job.py [--rounds 3] [--steps 600] [--trigger-before-end-s 30] [--hooks-only] [--env K=V]
[--keep-rundir]
Besides the ratio (wall time, which the host's load moves), each run reports the CPU time spent
inside ``trainer.train()`` by the training threads and by the whole rank processes (perftracker's
threads included), summed over the ranks: ``cpu_ratio_*`` = median(on) / median(off) does not
depend on how busy the host is.

Last stdout line: {"ratio": float, "cpu_ratio_training_thread": float, "samples_per_s_off": float, "samples_per_s_on": float,
"exit_delay_s": float, "report_headline": str, ...}
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------- child
def child(args: argparse.Namespace) -> None:
    """One rank of the job (under torchrun)."""
    rank = os.environ.get("RANK", "0")

    def at_exit() -> None:  # registered before perftracker's hooks: it runs after them
        os.write(1, f"EXIT_END {rank} {time.monotonic_ns()}\n".encode())

    atexit.register(at_exit)
    if args.with_perftracker:
        import logging

        handler = logging.StreamHandler(sys.stdout)  # the window's exit lines, for the trigger run
        handler.setFormatter(logging.Formatter(f"PTLOG rank {rank}: %(message)s"))
        win_log = logging.getLogger("perftracker.runtime.window.profile")
        win_log.setLevel(logging.INFO)
        win_log.addHandler(handler)
        import perftracker  # noqa: F401
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    class Tokens(torch.utils.data.Dataset):
        def __init__(self, n: int) -> None:
            self.ids = torch.randint(0, 512, (n, 32), generator=torch.Generator().manual_seed(0))

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=512, n_positions=64))
    training = TrainingArguments(output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=8,
                                 learning_rate=1e-3, logging_steps=10**6, save_strategy="no", report_to=[],
                                 use_cpu=True, dataloader_num_workers=0, disable_tqdm=True, seed=0)
    from transformers import TrainerCallback

    class Progress(TrainerCallback):  # rank 0 tells the bench how far it is (to time the trigger)
        def on_step_end(self, a, state, control, **kw):  # type: ignore[no-untyped-def]
            if rank == "0" and state.global_step % 25 == 0:
                os.write(1, f"STEP {state.global_step} {time.monotonic_ns()}\n".encode())

    trainer = Trainer(model=model, args=training, train_dataset=Tokens(args.steps * 16 + 64),
                      callbacks=[Progress()])
    os.write(1, f"TRAIN_START {rank} {time.monotonic_ns()}\n".encode())
    cpu0, proc0 = time.thread_time_ns(), time.process_time_ns()
    out = trainer.train()
    cpu1, proc1 = time.thread_time_ns(), time.process_time_ns()
    os.write(1, f"TRAIN_END {rank} {time.monotonic_ns()}\n".encode())
    # CPU time inside train(): the training thread's, and the whole process's (perftracker's threads too)
    os.write(1, f"TRAIN_CPU {rank} {cpu1 - cpu0} {proc1 - proc0}\n".encode())
    if rank == "0":
        os.write(1, ("METRICS " + json.dumps(out.metrics) + "\n").encode())


# ---------------------------------------------------------------------------------------- parent
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(run_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFTRACKER_")}
    env.update(PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""), PERFTRACKER_RUN_DIR=str(run_dir),
               PERFTRACKER_AUTOSTART_AGENT="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false")
    return env


def _stop_agent(run_dir: Path) -> None:
    try:
        pid = int(json.loads((run_dir / "agent.json").read_text())["pid"])
        os.kill(pid, signal.SIGTERM)
        for _ in range(200):
            os.kill(pid, 0)
            time.sleep(0.1)
    except (OSError, ValueError, KeyError):
        pass


def _parse(out: str) -> dict[str, object]:
    starts: dict[str, int] = {}
    ends: dict[str, int] = {}
    exits: dict[str, int] = {}
    metrics: dict[str, object] = {}
    cpu: dict[str, tuple[int, int]] = {}
    for line in out.splitlines():
        parts = line.split(maxsplit=2)
        if len(parts) == 3 and parts[0] == "TRAIN_CPU":
            thread_ns, proc_ns = parts[2].split()
            cpu[parts[1]] = (int(thread_ns), int(proc_ns))
        elif parts and parts[0] == "METRICS":
            metrics = json.loads(line.split(" ", 1)[1])
        elif len(parts) == 3 and parts[0] in ("TRAIN_START", "TRAIN_END", "EXIT_END"):
            {"TRAIN_START": starts, "TRAIN_END": ends, "EXIT_END": exits}[parts[0]][parts[1]] = int(parts[2])
    exit_s = max(((exits[r] - ends[r]) / 1e9 for r in ends if r in exits), default=float("nan"))
    return {"metrics": metrics, "start_ns": starts.get("0", 0), "end_ns": ends.get("0", 0), "exit_s": exit_s,
            "train_thread_cpu_s": sum(c[0] for c in cpu.values()) / 1e9 if cpu else float("nan"),
            "train_process_cpu_s": sum(c[1] for c in cpu.values()) / 1e9 if cpu else float("nan")}


def run_job(on: bool, steps: int, trigger_before_end_s: float | None = None,
            env_extra: dict[str, str] | None = None, keep: bool = False) -> dict[str, object]:
    """One job; with ``trigger_before_end_s``, `perftracker trigger` once rank 0's remaining steps at
    its recent speed (the last 100 steps) take no longer than that."""
    import threading

    work = Path(tempfile.mkdtemp(prefix="pt-hfb-", dir="/tmp"))
    run_dir = work / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_free_port()),
           __file__, "--child", "--steps", str(steps), "--out", str(work / "hf-out")]
    if on:
        cmd.append("--with-perftracker")
    env = {**_env(run_dir), **(env_extra or {})}
    proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    due = threading.Event()
    progress: list[tuple[int, int]] = []  # (step, t_ns) of rank 0

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("STEP ") and trigger_before_end_s is not None:
                step, t_ns = (int(x) for x in line.split()[1:3])
                progress.append((step, t_ns))
                old = [p for p in progress if p[0] <= step - 100]
                if old:
                    s_per_step = (t_ns - old[-1][1]) / 1e9 / (step - old[-1][0])
                    if (steps - step) * s_per_step <= trigger_before_end_s:
                        due.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    trigger = None
    trigger_ns = 0
    if trigger_before_end_s is not None and due.wait(1200):
        trigger_ns = time.monotonic_ns()
        trigger = subprocess.run([sys.executable, "-m", "perftracker", "trigger", "--no-wait"], cwd=work, env=env,
                                 capture_output=True, text=True, timeout=60)
    proc.wait(timeout=1800)
    reader.join(30)
    out = "".join(lines)
    res = _parse(out)
    res["trigger_to_end_s"] = (int(res["end_ns"]) - trigger_ns) / 1e9 if trigger_ns else float("nan")
    res.update(rc=proc.returncode, work=str(work), tail=out[-2000:] if proc.returncode else "",
               window_log=[ln.strip() for ln in lines if ln.startswith("PTLOG")])
    if trigger is not None:
        res["trigger"] = (trigger.stdout + trigger.stderr).strip()[-500:]
        m = re.search(r"(?:opened|joined) session (\S+)", trigger.stdout)
        res["report"] = _wait_report(work / "perftracker-runs", m.group(1) if m else "", 180.0)
        res["agent_log_tail"] = ""
        rep = res["report"]
        if rep is None or rep.get("status") != "complete":  # type: ignore[attr-defined]
            try:
                res["agent_log_tail"] = (run_dir / "agent.log").read_text()[-3000:]
            except OSError:
                pass
    if on:  # what `perftracker status` shows: each rank's windows and their measured cost (issue 30)
        st = subprocess.run([sys.executable, "-m", "perftracker", "status", "--run-dir", str(run_dir), "--format", "json"],
                            env=env, capture_output=True, text=True, timeout=60)
        try:
            ledgers = json.loads(st.stdout) if st.returncode == 0 else []
        except ValueError:
            ledgers = []
        res["windows_lost_s"] = {str(g.get("ledger")): [w.get("lost_s") for w in g.get("windows", [])] for g in ledgers}
        res["budget"] = {str(g.get("ledger")): g.get("budget") for g in ledgers}
        _stop_agent(run_dir)
    if keep:  # the run dir (agent log, ledgers, reports) for reading why a window opened
        print(f"kept {work}", flush=True)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return res


def _wait_report(runs: Path, session: str, timeout_s: float) -> dict[str, object] | None:
    """The stored report of ``session`` (the one the trigger opened or joined)."""
    path = runs / "reports" / f"{session}.json"
    deadline = time.monotonic() + timeout_s
    while session and time.monotonic() < deadline:
        try:
            return dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            time.sleep(1.0)
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--with-perftracker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default="hf-out", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=600, help="optimizer steps per throughput run")
    p.add_argument("--rounds", type=int, default=3, help="off/on pairs, in ABBA order, for the throughput ratio")
    p.add_argument("--trigger-before-end-s", type=float, default=30.0, help="0: skip the trigger run")
    p.add_argument("--auto-triggers", action="store_true", help="keep the detector's triggers in the trigger run")
    p.add_argument("--hooks-only", action="store_true",
                   help="the detector's triggers off in the 'on' throughput runs too: the ratio is then the "
                        "always-on cost (hooks, channel, agent) without any profile window")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="a PERFTRACKER_* variable for the 'on' runs, e.g. PERFTRACKER_AUTOSTART_AGENT=0 (repeatable)")
    p.add_argument("--keep-rundir", action="store_true",
                   help="keep each run's work directory (run dir, agent log, ledgers, reports) and print its path")
    p.add_argument("--skip-throughput", type=float, default=0.0, metavar="S_PER_STEP",
                   help="skip the off/on runs; use this many seconds per step for the trigger run")
    args = p.parse_args()
    if args.child:
        child(args)
        return 0
    runs: dict[bool, list[dict[str, object]]] = {False: [], True: []}
    order = [False, True, True, False] * ((args.rounds + 1) // 2)
    no_triggers = {"PERFTRACKER_SLOWDOWN_THRESHOLD": "100"}  # a slowdown of +10,000%: never
    if any("=" not in kv or not kv.startswith("PERFTRACKER_") for kv in args.env):
        p.error("--env takes PERFTRACKER_NAME=VALUE")
    user_env = dict(kv.split("=", 1) for kv in args.env)
    on_env = {**(no_triggers if args.hooks_only else {}), **user_env}
    for on in ([] if args.skip_throughput else order[: 2 * args.rounds]):
        res = run_job(on, args.steps, env_extra=on_env if on else None, keep=args.keep_rundir)
        if res["rc"] != 0:
            print(f"run failed (on={on}):\n{res['tail']}", file=sys.stderr)
            return 1
        m = res["metrics"]
        runs[on].append(res)
        windows = sum(" started" in ln for ln in res["window_log"])  # type: ignore[attr-defined]
        print(f"{'on ' if on else 'off'}: {m['train_samples_per_second']:.1f} samples/s "  # type: ignore[index]
              f"({m['train_runtime']:.1f} s), CPU in train() {float(res['train_thread_cpu_s']):.2f} s training "  # type: ignore[index, arg-type]
              f"threads / {float(res['train_process_cpu_s']):.2f} s processes, "  # type: ignore[arg-type]
              f"exit after train {res['exit_s']:.2f} s"
              + (f", {windows // 2} detector window(s), lost to windows per rank (perftracker status): "
                 f"{res.get('windows_lost_s')}" if on else ""), flush=True)
    result: dict[str, object] = {}
    exit_off = 0.0
    if runs[False]:
        sps = {on: statistics.median(float(r["metrics"]["train_samples_per_second"]) for r in runs[on])  # type: ignore[index]
               for on in (False, True)}
        exit_off = statistics.median(float(r["exit_s"]) for r in runs[False])  # type: ignore[arg-type]
        # CPU time inside train(), summed over the ranks: independent of how busy the host is
        cpu = {(on, k): statistics.median(float(r[k]) for r in runs[on])  # type: ignore[arg-type]
               for on in (False, True) for k in ("train_thread_cpu_s", "train_process_cpu_s")}
        result = {
            "ratio": round(sps[True] / sps[False], 4), "samples_per_s_off": round(sps[False], 2),
            "samples_per_s_on": round(sps[True], 2), "runs_per_side": args.rounds, "steps": args.steps,
            "hooks_only": args.hooks_only, "env": user_env,
            "cpu_ratio_training_thread": round(cpu[True, "train_thread_cpu_s"] / cpu[False, "train_thread_cpu_s"], 4),
            "cpu_ratio_process": round(cpu[True, "train_process_cpu_s"] / cpu[False, "train_process_cpu_s"], 4),
            "exit_after_train_off_s": round(exit_off, 3),
            "windows_lost_s_per_run": [r.get("windows_lost_s") for r in runs[True]],
        }
    if args.trigger_before_end_s > 0:
        s_per_step = args.skip_throughput or (
            statistics.median(float(r["metrics"]["train_runtime"]) for r in runs[False]) / args.steps)  # type: ignore[index]
        steps = max(args.steps, int((args.trigger_before_end_s + 40.0) / s_per_step))
        # the detector's own triggers off for this run (--auto-triggers keeps them): on a loaded
        # machine a noise trigger's 20 s window may still be written when the CLI trigger comes, and
        # the worker then refuses the second window; this run is about the window at exit
        extra = {} if args.auto_triggers else no_triggers
        res = run_job(True, steps, trigger_before_end_s=args.trigger_before_end_s, env_extra=extra,
                      keep=args.keep_rundir)
        if res["rc"] != 0:
            print(f"trigger run failed:\n{res['tail']}", file=sys.stderr)
            return 1
        train_measured_s = round((int(res["end_ns"]) - int(res["start_ns"])) / 1e9, 1)  # rank 0
        rep = res.get("report")
        headline = str(rep.get("summary", "")) if isinstance(rep, dict) else ""
        print(f"trigger run: {steps} steps, {train_measured_s:.0f} s of training, trigger "
              f"{float(res['trigger_to_end_s']):.1f} s before its end: {res.get('trigger')}")
        for line in res["window_log"]:  # type: ignore[attr-defined]
            print(f"  {line}")
        print(f"  report: {json.dumps(rep)[:1500] if rep else 'none'}")
        if res.get("agent_log_tail"):
            print(f"  agent log:\n{res.get('agent_log_tail')}")
        result.update(exit_delay_s=round(float(res["exit_s"]) - exit_off, 3), exit_after_train_on_s=round(float(res["exit_s"]), 3),
                      trigger_steps=steps, trigger_train_s=train_measured_s,
                      trigger_to_end_s=round(float(res["trigger_to_end_s"]), 1), report=bool(rep),
                      report_headline=headline,
                      report_ranks=list(rep.get("ranks_reported", [])) if isinstance(rep, dict) else [])
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
