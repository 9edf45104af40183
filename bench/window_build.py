"""CPU cost of turning one window's capture (Kineto result + stack samples + GC pauses) into a
RawWindow: the current code against a baseline revision's code, on the same capture, interleaved.

    python bench/window_build.py --window-s 5 --baseline-rev HEAD~1

Runs datagen's training loop in one process, captures one ProfileWindow (stack sampler on) but
keeps the capture instead of writing it, then builds the RawWindow with both versions
``--repeat`` times each, alternating, unthrottled (the writer's throttle only stretches this CPU
time), and checks that both give the same rows. The baseline's ``profiler.py``, ``stacks.py`` and
``rawbuild.py`` are loaded from ``git show REV:path``. Progress on stderr; last stdout line is one
JSON object.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

os.environ.setdefault("PERFTRACKER_DISABLE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import datagen  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from perftracker.model.raw_window import RawWindow, WindowMeta  # noqa: E402
from perftracker.runtime import profiler as new_profiler  # noqa: E402
from perftracker.runtime import raw_window_build as new_rawbuild  # noqa: E402
from perftracker.runtime import stack_sampler as new_stacks  # noqa: E402
from perftracker.runtime.window.profile import ProfileWindow, WindowOptions, WindowResult  # noqa: E402


def note(msg: str) -> None:
    print(f"[window_build] {msg}", file=sys.stderr, flush=True)


def load_baseline(rev: str) -> dict[str, types.ModuleType]:
    """profiler/stacks/rawbuild at ``rev`` as private modules wired to each other."""
    mods: dict[str, types.ModuleType] = {}
    for name in ("stacks", "profiler", "rawbuild"):
        src = subprocess.run(["git", "show", f"{rev}:perftracker/{name}.py"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout
        for dep in ("stacks", "profiler"):
            src = src.replace(f"from perftracker.{dep} import", f"from _baseline_{dep} import")
        mod = types.ModuleType(f"_baseline_{name}")
        mod.__file__ = f"<{rev}:perftracker/{name}.py>"
        sys.modules[mod.__name__] = mod
        exec(compile(src, mod.__file__, "exec"), mod.__dict__)  # noqa: S102 - our own repository's code
        mods[name] = mod
    return mods


class CapturingWindow(ProfileWindow):
    """Keeps the capture instead of writing it (its writer's thread captures)."""

    captured: tuple[Any, Any, int] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.writer.finish = self._capture  # type: ignore[method-assign]

    def _capture(self, cur: Any, result: Any, end_ns: int, blocking_ns: int, child: int | None) -> None:
        self.captured = (cur, result, end_ns)
        self._deliver(cur, WindowResult(cur.session, None, cur.start_ns, end_ns))


def build(mods: dict[str, Any], cur: Any, result: Any, end_ns: int, tid: int, meta: WindowMeta) -> RawWindow:
    """What ProfileWindow._build does, with the given module versions, unthrottled."""
    krows = mods["profiler"].kineto_rows(result, cur.capture.offset_ns, tid, cur.start_ns, end_ns)
    ss = cur.stack_sampler
    pyexec = mods["stacks"].python_executions(ss.t_ns, ss.samples, cur.start_ns, end_ns, ss.period_ns)
    return mods["rawbuild"].build_raw_window(meta, krows, pyexec, cur.gc.pauses)


def canonical(raw: RawWindow) -> list[tuple]:
    """Rows with names and stacks decoded (id-order independent), in file order."""
    names, stacks = raw.names, raw.stacks
    cols = {k: raw.col(k).tolist() for k in raw.columns}
    return [(cols["kind"][i], names[cols["name_id"][i]], cols["tid"][i], cols["device"][i], cols["start_ns"][i],
             cols["end_ns"][i], tuple(names[j] for j in stacks[cols["stack_id"][i]]) if cols["stack_id"][i] >= 0
             else (), cols["parent"][i]) for i in range(len(raw))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--window-s", type=float, default=5.0)
    p.add_argument("--baseline-rev", default="HEAD")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--profile", action="store_true", help="print a cProfile of the current code's build to stderr")
    args = p.parse_args()
    torch.set_num_threads(1)
    tr = datagen.Trainer(argparse.Namespace(dim=args.dim, depth=args.depth, batch=args.batch))
    ident = type("Ident", (), {"rank": 0, "world_size": 1, "host": "bench", "pid": os.getpid(),
                               "training_tid": threading.get_native_id(), "job": "bench", "local_rank": 0})()
    win = CapturingWindow(ident, "/tmp", options=WindowOptions(spawn_sampler=False))
    for _ in range(5):
        tr.step()
    done: list[WindowResult] = []
    win.arm("bench", args.window_s, done.append)
    while not done:
        tr.step()
        win.on_boundary(time.monotonic_ns(), tr.iteration)
    assert win.captured is not None
    cur, result, end_ns = win.captured
    meta = WindowMeta(job="bench", session="bench", rank=0, world_size=1, host="bench", pid=os.getpid(),
                      training_tid=ident.training_tid, window_start_ns=cur.start_ns, window_end_ns=end_ns)
    note(f"captured {args.window_s} s: {tr.iteration} iterations, {len(cur.stack_sampler.samples)} stack samples")
    versions = {"baseline": load_baseline(args.baseline_rev),
                "current": {"profiler": new_profiler, "stacks": new_stacks, "rawbuild": new_rawbuild}}
    cpu: dict[str, list[float]] = {k: [] for k in versions}
    wall: dict[str, list[float]] = {k: [] for k in versions}
    raws: dict[str, RawWindow] = {}
    for r in range(args.repeat):
        for name, mods in versions.items() if r % 2 == 0 else reversed(versions.items()):
            c0, w0 = time.thread_time(), time.perf_counter()
            raws[name] = build(mods, cur, result, end_ns, ident.training_tid, meta)
            cpu[name].append(time.thread_time() - c0)
            wall[name].append(time.perf_counter() - w0)
            note(f"{name}: {cpu[name][-1]:.3f} s CPU, {wall[name][-1]:.3f} s wall, {len(raws[name])} rows")
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        build(versions["current"], cur, result, end_ns, ident.training_tid, meta)
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(25)
        print(s.getvalue(), file=sys.stderr)
    same_rows = canonical(raws["baseline"]) == canonical(raws["current"])
    identical = same_rows and raws["baseline"].names == raws["current"].names and \
        raws["baseline"].stacks == raws["current"].stacks and all(
            np.array_equal(raws["baseline"].col(k), raws["current"].col(k)) for k in raws["current"].columns)
    base_cpu, cur_cpu = min(cpu["baseline"]), min(cpu["current"])
    print(json.dumps({
        "window_s": args.window_s, "rows": len(raws["current"]), "baseline_rows": len(raws["baseline"]),
        "stack_samples": len(cur.stack_sampler.samples), "baseline_cpu_s": round(base_cpu, 3),
        "cpu_s": round(cur_cpu, 3), "speedup": round(base_cpu / max(cur_cpu, 1e-9), 2),
        "baseline_wall_s": round(min(wall["baseline"]), 3), "wall_s": round(min(wall["current"]), 3),
        "same_rows": same_rows, "identical_file_columns": identical, "baseline_rev": args.baseline_rev,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
