"""Helpers for the agent tests: a real agent process, a wire-level worker, a synthetic raw window."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from perftracker.model.raw_window import COLUMNS, EventKind, RawWindow, WindowMeta
from perftracker.wire import framing as wire
from perftracker.wire.framing import MessageType

REPO = Path(__file__).resolve().parents[1]


SHORT_RUN_DIRS: list[Path] = []  # conftest ends whatever still runs in them when the suite ends


def short_run_dir(tag: str) -> Path:
    """AF_UNIX paths must stay under 108 bytes: pytest's tmp_path is often too long."""
    d = Path(tempfile.mkdtemp(prefix=f"pt-{tag}-", dir="/tmp"))
    SHORT_RUN_DIRS.append(d)
    return d


# kept from the suite's environment (conftest.py): a private run dir and no agent autostart, so a
# subprocess given no run dir never reaches /tmp/perftracker-<uid> (a developer's agent)
_ISOLATION = ("PERFTRACKER_RUN_DIR", "PERFTRACKER_AUTOSTART_AGENT")


def env_for_tests(**extra: str) -> dict[str, str]:
    """os.environ without PERFTRACKER_* settings (but the suite's isolation), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFTRACKER_") or k in _ISOLATION}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    # the suite's jobs are a minute long and may need a second automatic window (a noise window
    # before the fault): the whole hour's 2 % from the first second, as documented for short jobs
    # (docs/window-cost.md, "The cost budget"); a test that is about the budget overrides it
    env["PERFTRACKER_WINDOW_BUDGET_INITIAL_S"] = "72"
    env.update(extra)
    return env


class AgentProc:
    """`python -m perftracker agent --embedded-localizer` as a real subprocess."""

    def __init__(self, run_dir: Path, runs: Path, *extra: str, env: dict[str, str] | None = None,
                 cwd: Path | None = None) -> None:
        self.run_dir = run_dir
        self.runs = runs
        self.log_path = run_dir.parent / f"{run_dir.name}-agent.log"
        cmd = [sys.executable, "-m", "perftracker", "-v", "agent", "--run-dir", str(run_dir), "--runs-dir", str(runs),
               "--embedded-localizer", *extra]
        self._log = open(self.log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env or env_for_tests(),
                                     cwd=str(cwd or REPO))

    def wait_ready(self, timeout_s: float = 20.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        info = self.run_dir / "agent.json"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"agent exited {self.proc.returncode}: {self.log()}")
            if info.exists() and os.path.exists(wire.socket_path(self.run_dir)):
                try:
                    return json.loads(info.read_text())
                except ValueError:
                    pass
            time.sleep(0.05)
        raise AssertionError(f"agent not ready in {timeout_s}s: {self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text()[-4000:]
        except OSError:
            return ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(10)
        self._log.close()

    def uplink(self):  # type: ignore[no-untyped-def]
        from perftracker.agent.daemon.localizer_client import Uplink

        loc = json.loads((self.runs / "localizer.json").read_text())
        return Uplink(loc["url"], (self.runs / "token").read_text().strip(), retries=1)


class WireWorker:
    """A training process emulated at the wire level: registers, answers START_WINDOW with a raw window."""

    def __init__(self, run_dir: Path, rank: int, world_size: int, job: str = "jobT",
                 compute_ms: float = 8.0) -> None:
        self.run_dir, self.rank, self.world_size, self.job = run_dir, rank, world_size, job
        self.compute_ms = compute_ms
        self.sock = wire.connect(wire.socket_path(run_dir), 5.0)
        self.received: list[dict[str, Any]] = []
        self.tid = threading.get_native_id()
        wire.send_message(self.sock, wire.make_message(
            MessageType.REGISTER, protocol=wire.PROTOCOL_VERSION, job=job, rank=rank, world_size=world_size,
            local_rank=rank, pid=os.getpid(), training_tid=self.tid, host=socket.gethostname()))
        self.ack = wire.recv_message(self.sock)

    def send(self, kind: MessageType, **fields: Any) -> None:
        wire.send_message(self.sock, wire.make_message(kind, **fields))

    def recv(self, timeout_s: float = 30.0) -> dict[str, Any]:
        self.sock.settimeout(timeout_s)
        msg = wire.recv_message(self.sock)
        self.received.append(msg)
        return msg

    def answer_window(self, msg: dict[str, Any], out_dir: Path, delay_s: float = 0.0) -> Path:
        """Build and save a raw window for a START_WINDOW message, then send WINDOW_DONE."""
        time.sleep(delay_s)
        start = time.monotonic_ns()
        end = start + int(float(msg["window_s"]) * 1e9)
        raw = synthetic_window(self.job, msg["session"], self.rank, self.world_size, self.tid, start, end,
                               self.compute_ms)
        out_dir.mkdir(parents=True, exist_ok=True)
        path = raw.save(out_dir / f"{msg['session']}-rank{self.rank}.npz")
        self.send(MessageType.WINDOW_DONE, session=msg["session"], raw_path=str(path), start_ns=start, end_ns=end,
                  error="")
        return path

    def close(self) -> None:
        self.sock.close()


def synthetic_window(job: str, session: str, rank: int, world_size: int, tid: int, start_ns: int, end_ns: int,
                     compute_ms: float, comm_ms: float = 2.0) -> RawWindow:
    """Iterations of python step -> aten::mm (compute) -> gloo allreduce (collective) on one thread."""
    names = ["train.py(10): step", "aten::mm", "c10d::allreduce_"]
    rows: list[tuple[int, int, int, int, int, int]] = []  # kind, name, start, end, stack, parent
    t = start_ns
    it_ns = int((compute_ms + comm_ms + 1.0) * 1e6)
    while t + it_ns <= end_ns:
        p = len(rows)
        rows.append((EventKind.PYTHON, 0, t, t + it_ns, 0, -1))
        c0 = t + int(0.5e6)
        rows.append((EventKind.CPU_OP, 1, c0, c0 + int(compute_ms * 1e6), -1, p))
        a0 = c0 + int(compute_ms * 1e6)
        rows.append((EventKind.CPU_OP, 2, a0, a0 + int(comm_ms * 1e6), -1, p))
        t += it_ns
    n = len(rows)
    arr = np.array(rows, dtype=np.int64).reshape(n, 6)
    cols = {
        "kind": arr[:, 0].astype(COLUMNS["kind"]),
        "name_id": arr[:, 1].astype(COLUMNS["name_id"]),
        "tid": np.full(n, tid, dtype=COLUMNS["tid"]),
        "device": np.full(n, -1, dtype=COLUMNS["device"]),
        "start_ns": arr[:, 2].astype(COLUMNS["start_ns"]),
        "end_ns": arr[:, 3].astype(COLUMNS["end_ns"]),
        "stack_id": arr[:, 4].astype(COLUMNS["stack_id"]),
        "parent": arr[:, 5].astype(COLUMNS["parent"]),
    }
    meta = WindowMeta(job=job, session=session, rank=rank, world_size=world_size, host=socket.gethostname(),
                      pid=os.getpid(), training_tid=tid, window_start_ns=start_ns, window_end_ns=end_ns,
                      local_rank=rank, iteration_ms=(compute_ms + comm_ms + 1.0,) * 5)
    return RawWindow(meta=meta, columns=cols, names=tuple(names), stacks=((0,),))


def run_demo(tmp_path: Path, *args: str) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    """`perftracker demo ARGS` run in tmp_path: its stdout, its stderr, its result (the last line)
    and the report that the result names."""
    proc = subprocess.run([sys.executable, "-m", "perftracker", "demo", *args], cwd=tmp_path, env=env_for_tests(),
                          capture_output=True, text=True, timeout=400)
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0, out[-4000:] + err[-4000:]
    result = json.loads(out.strip().splitlines()[-1])
    report = json.loads((tmp_path / "perftracker-runs" / "reports" / f"{result['session']}.json").read_text())
    return out, err, result, report

def wait_until(pred, timeout_s: float, step_s: float = 0.1, what: str = "condition"):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def cleanup(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
