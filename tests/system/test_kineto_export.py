"""perftracker.agent.kineto on a trace that torch.profiler writes now, in a child process (the
reader on the shared dlrm traces and on bad files: tests/unit/test_kineto.py)."""

from __future__ import annotations

from pathlib import Path

from perftracker.agent.kineto import read_kineto_trace
from perftracker.agent.summarize.summarizer import summarize_window

from perftracker.model import Category
from perftracker.model.raw_window import EventKind

_PROFILE_SCRIPT = """
import gc, sys, threading
import torch
from torch.profiler import ProfilerActivity, profile


def _busy(n):
    s = 0
    for i in range(n):
        s += i * i
    return s


def _garbage():
    for _ in range(2000):
        a = []
        a.append(a)


cfg = torch._C._profiler._ExperimentalConfig(record_python_gc_info=True)
x = torch.randn(128, 128)
with profile(activities=[ProfilerActivity.CPU], with_stack=True, experimental_config=cfg) as prof:
    for _ in range(3):
        _busy(20000)
        torch.mm(x, x)
        _garbage()
        gc.collect()
prof.export_chrome_trace(sys.argv[1])
print(threading.get_native_id())
"""


def test_fresh_torch_profiler_export_with_stacks_and_gc(tmp_path: Path) -> None:
    """A trace that torch 2.13 writes now, with Python stacks and GC events. Profiled in a child
    process: torch's in-process profiler state (Python tracer, GC callbacks) would otherwise leak
    into later tests that run profile windows in the pytest process."""
    import subprocess
    import sys

    script = tmp_path / "profile_job.py"
    script.write_text(_PROFILE_SCRIPT)
    out = tmp_path / "rank0.pt.trace.json"
    env = dict(__import__("os").environ, PERFTRACKER_DISABLE="1")
    proc = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    raw = read_kineto_trace(out)
    assert raw.meta.training_tid == int(proc.stdout.split()[-1])
    kinds = set(raw.col("kind").tolist())
    assert {EventKind.PYTHON, EventKind.CPU_OP, EventKind.GC} <= kinds
    ps = summarize_window(raw)
    keys = {p.key: p for p in ps.patterns}
    assert "Python GC" in keys and keys["Python GC"].category is Category.PYTHON
    busy = [p for p in ps.patterns if p.key.endswith("_busy")]
    assert busy and busy[0].category is Category.PYTHON and ";" in busy[0].key
    assert "profile_job.py" in busy[0].key.split(";")[-1]
    assert keys["aten::mm"].category is Category.COMPUTE
