"""`perftracker export-trace` end to end: Chrome/Perfetto trace of one rank's raw window with a
critical-path track, from a hand-built window with a known critical path and from a window taken in
this process (the track itself, and a real 8-rank GPU Kineto trace: tests/unit/test_export_trace_track.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from perftracker.cli.export_trace import CRITICAL_PID
from perftracker.model.raw_window import COLUMNS, EventKind, RawWindow, WindowMeta

REPO = Path(__file__).resolve().parents[2]
TID = 4242


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "perftracker", "export-trace", *args], capture_output=True,
                          text=True, timeout=120, env=env, cwd=REPO)


def _window(tmp_path: Path) -> Path:
    """Training thread: step() 0-10 ms calls aten::addmm 2-6 ms and a gloo allreduce 7-9 ms."""
    names = ("train.py(12): step", "aten::addmm", "gloo:all_reduce")
    rows = [  # kind, name, tid, start_ms, end_ms, stack
        (EventKind.PYTHON, 0, TID, 0.0, 10.0, 0),
        (EventKind.CPU_OP, 1, TID, 2.0, 6.0, -1),
        (EventKind.CPU_OP, 2, TID, 7.0, 9.0, -1),
    ]
    cols = {k: np.zeros(len(rows), dtype=dt) for k, dt in COLUMNS.items()}
    for i, (k, n, t, a, b, st) in enumerate(rows):
        cols["kind"][i] = k
        cols["name_id"][i] = n
        cols["tid"][i] = t
        cols["device"][i] = -1
        cols["start_ns"][i] = int(1_000_000_000 + a * 1e6)
        cols["end_ns"][i] = int(1_000_000_000 + b * 1e6)
        cols["stack_id"][i] = st
        cols["parent"][i] = -1
    meta = WindowMeta(job="j", session="s-1", rank=3, world_size=4, host="h", pid=777, training_tid=TID,
                      window_start_ns=1_000_000_000, window_end_ns=1_010_000_000)
    raw = RawWindow(meta=meta, columns=cols, names=names, stacks=((0,),))
    out = tmp_path / "run" / "windows"
    out.mkdir(parents=True)
    return raw.save(out / "s-1-rank3.raw.npz")


def test_cli_exports_hand_built_window_found_in_run_dir(tmp_path: Path) -> None:
    path = _window(tmp_path)
    out = tmp_path / "t.json"
    r = _cli("s-1", "--rank", "3", "--run-dir", str(tmp_path / "run"), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "ui.perfetto.dev" in r.stderr
    trace = json.loads(out.read_text())
    evs = trace["traceEvents"]
    raw_x = [e for e in evs if e["ph"] == "X" and e["pid"] != CRITICAL_PID]
    assert len(raw_x) == len(RawWindow.load(path))
    addmm = next(e for e in raw_x if e["name"] == "aten::addmm")
    assert (addmm["ts"], addmm["dur"], addmm["tid"], addmm["pid"]) == (2000.0, 4000.0, TID, 777)
    step = next(e for e in raw_x if e["name"].endswith("step"))
    assert step["args"]["stack"] == ["train.py(12): step"]
    crit = [(e["name"], e["ts"], e["dur"]) for e in evs if e["pid"] == CRITICAL_PID and e["ph"] == "X"]
    assert crit == [
        ("python: train.py(12): step", 0.0, 2000.0),
        ("compute: aten::addmm", 2000.0, 4000.0),
        ("python: train.py(12): step", 6000.0, 1000.0),
        ("collective: gloo:all_reduce", 7000.0, 2000.0),
        ("python: train.py(12): step", 9000.0, 1000.0),
    ]
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] in ("process_name", "thread_name")}
    assert names[(CRITICAL_PID, None)].startswith("critical path") and names[(777, TID)] == "training thread"
    assert trace["otherData"]["session"] == "s-1" and trace["otherData"]["rank"] == 3


def test_latest_is_found_in_the_data_dir_where_keep_windows_keeps_it(tmp_path: Path) -> None:
    """`perftracker run/demo --keep-windows` move the windows to <data-dir>/windows/; `latest` is the
    newest of the rank's; the old --runs-dir spelling still works (issue 35)."""
    path = _window(tmp_path)
    data = tmp_path / "data"
    (data / "windows").mkdir(parents=True)
    kept = path.rename(data / "windows" / "20261128-020900-c5e6ca-rank3.raw.npz")
    for option in ("--data-dir", "--runs-dir"):
        out = tmp_path / f"t{option}.json"
        r = _cli("latest", "--rank", "3", option, str(data), "--run-dir", str(tmp_path / "none"), "-o", str(out))
        assert r.returncode == 0, r.stderr
        evs = json.loads(out.read_text())["traceEvents"]
        assert evs and all({"ph", "pid", "name"} <= e.keys() for e in evs)
        assert all({"ts", "tid"} <= e.keys() for e in evs if e["ph"] == "X")
    r = _cli("--rank", "3", "--data-dir", str(data), "--run-dir", str(tmp_path / "none"), "-o", str(tmp_path / "d.json"))
    assert r.returncode == 0, r.stderr  # SESSION defaults to latest
    r = _cli("20261128-020900-c5e6ca", "--rank", "3", "--data-dir", str(data), "-o", str(tmp_path / "s.json"))
    assert r.returncode == 0 and kept.is_file(), r.stderr
    r = _cli("latest", "--rank", "0", "--data-dir", str(data), "--run-dir", str(tmp_path / "none"),
             "-o", str(tmp_path / "x.json"))
    assert r.returncode == 1 and "--keep-windows" in r.stderr


def test_cli_errors_are_clear(tmp_path: Path) -> None:
    r = _cli("s-404", "--rank", "0", "--run-dir", str(tmp_path), "-o", str(tmp_path / "x.json"))
    assert r.returncode == 1 and "no raw window for session 's-404' rank 0" in r.stderr and "--keep-files" in r.stderr
    bad = tmp_path / "bad.raw.npz"
    bad.write_bytes(b"not a zip")
    r = _cli("x", "--raw", str(bad), "-o", str(tmp_path / "x.json"))
    assert r.returncode == 1 and "bad.raw.npz" in r.stderr and "not a readable" in r.stderr
    assert not (tmp_path / "x.json").exists()


def test_real_online_window(tmp_path: Path) -> None:
    """A window taken by perftracker.runtime.window.profile in this process: Python functions and aten ops."""
    import threading
    import time

    import torch

    from perftracker.runtime.window.profile import ProfileWindow, WindowResult

    class Ident:
        rank, world_size, local_rank, host, job = 0, 1, 0, "test", "export"
        pid = os.getpid()
        training_tid = threading.get_native_id()

    def spin(ms: float) -> None:
        t = time.perf_counter()
        while time.perf_counter() - t < ms / 1000:
            pass

    def matmuls(a: torch.Tensor) -> None:
        for _ in range(5):
            a @ a

    win = ProfileWindow(Ident(), tmp_path)
    done: list[WindowResult] = []
    assert win.arm("online", 0.6, done.append)
    a = torch.randn(64, 64)
    matmuls(a)  # warm up outside the window
    it = 0
    deadline = time.monotonic() + 30
    while not done and time.monotonic() < deadline:
        spin(15)
        matmuls(a)
        it += 1
        win.on_boundary(time.monotonic_ns(), it)
    assert done and done[0].error == "" and done[0].raw_path is not None
    out = tmp_path / "t.json"
    r = _cli("online", "--raw", str(done[0].raw_path), "-o", str(out))
    assert r.returncode == 0, r.stderr
    evs = json.loads(out.read_text())["traceEvents"]
    crit = [e for e in evs if e["pid"] == CRITICAL_PID and e["ph"] == "X"]
    names = {e["name"] for e in crit}
    assert any(n.startswith("compute: aten::") for n in names), names
    assert any(n.startswith("python:") and "spin" in n for n in names), names
    # the track agrees with the summarizer's beta of the same window
    from perftracker.agent.summarize.summarizer import summarize_window

    raw = RawWindow.load(done[0].raw_path)
    window_us = (raw.meta.window_end_ns - raw.meta.window_start_ns) / 1000
    beta_mm = sum(p.beta for p in summarize_window(raw).patterns if p.key == "aten::mm")
    track_mm = sum(e["dur"] for e in crit if e["name"] == "compute: aten::mm") / window_us
    assert beta_mm > 0 and track_mm == pytest.approx(beta_mm, abs=0.01)

