"""Issue 46 (third red-team round): the attacks of its items, rebuilt from their descriptions, for
``bench/hardening.py`` (items "46.N"). Each builder is also what the regression tests use, scaled
down (tests/component/test_hardening_third.py).

Each item runs a reproduction in a child process under ``/usr/bin/time`` (wall time, peak RSS of
the largest process) with an address-space limit (``LIMIT_AS_BYTES``, as the review's cgroup) and a
timeout, and reports the exit status, the time, the peak RSS and what came out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

LIMIT_AS_BYTES = 3 << 30  # per process; the review used a 2.8 GB cgroup (address space is larger than RSS)
TIMEOUT_S = 120


# ---------------------------------------------------------------- builders (shared with the tests)
def group_bomb_traces(d: Path, files: int = 4, groups: int = 1, size: int = 9_999_999, world: int = 0) -> Path:
    """``files`` rank traces of about 10 KB, each naming ``groups`` process groups through a
    ``record_param_comms`` event with a cut member list ("[0, 1, ..., 29, ...]") and ``Group size``
    ``size`` (item 1). ``world``: the distributedInfo.world_size written (0: ``files``)."""
    d.mkdir(parents=True, exist_ok=True)
    cut = "[" + ", ".join(str(r) for r in range(30)) + ", ...]"
    for r in range(files):
        events: list[dict[str, Any]] = []
        for i in range(12):
            t0 = 1000.0 + i * 1000
            events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 7, "tid": 7,
                           "ts": t0, "dur": 990.0})
            events.append({"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 7, "tid": 7, "ts": t0 + 10,
                           "dur": 700.0})
        for g in range(groups):
            for i in range(3):
                events.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 7, "tid": 7,
                               "ts": 1750.0 + i * 1000 + g, "dur": 1.0,
                               "args": {"Process Group Name": str(g), "Process Group Description": "undefined",
                                        "Process Group Ranks": cut, "Group size": size,
                                        "Collective name": "allreduce", "Seq": i}})
        doc = {"traceEvents": events, "distributedInfo": {"rank": r, "world_size": world or files}}
        (d / f"rank{r}.json").write_text(json.dumps(doc))
    return d


def npz_bomb(path: Path, elements: int = 100_000_000, series: str = "cpu", period_ns: int = 10_000_000) -> Path:
    """A ``SampleSet`` file whose deflated members declare ``elements`` zeros each (item 2: an int64
    array of 100,000,000 zeros is 778 KB deflated). Written in chunks: never held in memory."""
    meta = json.dumps({"schema_version": _schema_version(),
                       "series": {series: {"period_ns": period_ns, "source": "procfs"}}}).encode()
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        _write_npy(zf, "meta_json", np.frombuffer(meta, dtype=np.uint8))
        for name, dtype in ((f"t_{series}", np.int64), (f"v_{series}", np.float32)):
            _write_zeros(zf, name, np.dtype(dtype), elements)
    return path


def _schema_version() -> int:
    from perftracker.model import SCHEMA_VERSION

    return int(SCHEMA_VERSION)


def _write_npy(zf: zipfile.ZipFile, name: str, arr: np.ndarray) -> None:
    with zf.open(name + ".npy", "w", force_zip64=True) as fh:
        np.lib.format.write_array(fh, arr, allow_pickle=False)


def _write_zeros(zf: zipfile.ZipFile, name: str, dtype: np.dtype, n: int) -> None:  # type: ignore[type-arg]
    with zf.open(name + ".npy", "w", force_zip64=True) as fh:
        np.lib.format.write_array_header_1_0(fh, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                  "fortran_order": False, "shape": (n,)})
        chunk = np.zeros(min(n, 1 << 20), dtype=dtype).tobytes()
        left = n * dtype.itemsize
        while left > 0:
            fh.write(chunk[:left])
            left -= len(chunk)


def plain_traces(d: Path, ranks: int = 2) -> Path:
    """``ranks`` small traces (for a samples file beside one of them)."""
    return group_bomb_traces(d, files=ranks, groups=0)


# ---------------------------------------------------------------- measuring a child
def _limit() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_AS_BYTES, LIMIT_AS_BYTES))


def timed(tree: Path, args: list[str], cwd: Path, timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """``python -m perftracker ARGS`` of ``tree`` under /usr/bin/time: rc, wall s, peak RSS MB, stderr tail.
    The child runs in a process group of its own, killed whole at the timeout (its workers too)."""
    import signal

    env = dict(os.environ, PYTHONPATH=str(tree), PERFTRACKER_DISABLE="1")
    fmt = cwd / f"time-{time.monotonic_ns()}.txt"
    cmd = ["/usr/bin/time", "-o", str(fmt), "-f", "%e s %M KB", sys.executable, "-m", "perftracker", *args]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                            preexec_fn=_limit, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        rc: int | str = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        rc = f"killed at the {timeout:.0f} s timeout"
    wall = time.monotonic() - t0
    text = fmt.read_text().split() if fmt.exists() else []
    rss_mb = int(text[-2]) // 1024 if len(text) >= 4 and text[-2].isdigit() else -1
    return {"rc": rc, "s": round(wall, 1), "peak_rss_mb": rss_mb, "stderr": (err or "")[-2000:], "stdout": out or ""}


def _line(r: dict[str, Any], extra: str = "") -> str:
    rss = f"peak RSS {r['peak_rss_mb']} MB" if r["peak_rss_mb"] >= 0 else "peak RSS not reported (killed)"
    why = [ln for ln in r["stderr"].splitlines() if "Error" in ln][-1:] if r["rc"] != 0 else []
    return f"rc {r['rc']}, {r['s']} s, {rss}" + (f", {extra}" if extra else "") + \
        (f" ({why[0].strip()[:160]})" if why else "")


# ---------------------------------------------------------------- the items
def item_group_bomb(tree: Path, tmp: Path) -> str:
    """Item 1: four ~10 KB traces, one cut group of 9,999,999 each (world size 4), then eight
    groups each; then the same with a declared world of 10,000,000 (the members are then possible)."""
    out = []
    for label, groups, world in (("1 group/file, world 4", 1, 0), ("8 groups/file, world 4", 8, 0),
                                 ("8 groups/file, world 10,000,000", 8, 10_000_000)):
        d = group_bomb_traces(tmp / f"g{groups}-{world}", files=4, groups=groups, world=world)
        kb = max(p.stat().st_size for p in d.glob("*.json")) / 1e3
        r = timed(tree, ["analyze", str(d), "--format", "json", "-j", "1"], cwd=tmp)
        out.append(f"{label} ({kb:.1f} KB/file): {_line(r)}")
    return "; ".join(out)


def item_npz_bomb(tree: Path, tmp: Path) -> str:
    """Item 2: rank1.samples.npz of 100,000,000 zeros per member (deflated) beside a trace."""
    d = plain_traces(tmp / "traces")
    bomb = npz_bomb(d / "rank1.samples.npz")
    r = timed(tree, ["analyze", str(d), "--format", "json", "-j", "1"], cwd=tmp)
    said = "refused with a warning" if "samples not read" in (r["stderr"] + r["stdout"]) else "read"
    return f"{bomb.stat().st_size / 1e3:.0f} KB samples file: {_line(r, said)}"


_LEDGER = r"""
import os, sys, pathlib
sys.path.insert(0, sys.argv[1])
from perftracker.runtime.window.cost import WindowCostMeter, ledger_path
class R:
    iteration = 0
    def recent_iteration_ms(self): return [10.0] * 5
run_dir = pathlib.Path(sys.argv[2])
m = WindowCostMeter(R(), ledger_path(run_dir, "job", 0))
sys.stdin.readline()  # the attacker has planted this pid's name (the review planted all 32,768)
m._write()
"""


def item_ledger(tree: Path, tmp: Path) -> str:
    """Item 3: a run dir planted by another user (uid 10001, mode 1777) with the ledger's
    temporary name for the writer's pid symlinked to a root-only file; then a run dir the worker
    creates itself: its mode and the ledger's."""
    import shutil
    import tempfile

    out = []
    shared = Path(tempfile.mkdtemp(prefix="pt-probe-", dir="/tmp"))
    try:
        run_dir = shared / "perftracker-run"
        (run_dir / "budget").mkdir(parents=True)
        victim = tmp / "victim.txt"
        victim.write_text("precious\n")
        os.chmod(victim, 0o600)
        for p in (run_dir, run_dir / "budget"):
            os.chmod(p, 0o1777)
            if os.geteuid() == 0:
                os.chown(p, 10001, 10001)
        t0 = time.monotonic()
        env = dict(os.environ, PERFTRACKER_DISABLE="1")
        child = subprocess.Popen([sys.executable, "-c", _LEDGER, str(tree), str(run_dir)], env=env, text=True,
                                 stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # the review planted a symlink for every pid (about a second); here the one the child has
        link = run_dir / "budget" / f"job-rank0.json.{child.pid}.tmp"
        link.symlink_to(victim)
        if os.geteuid() == 0:
            os.chown(link, 10001, 10001, follow_symlinks=False)
        child.communicate("go\n", timeout=60)
        took = time.monotonic() - t0
        owner = "uid 10001" if os.geteuid() == 0 else "this uid (not root: no other user to plant as)"
        out.append(f"planted run dir ({owner}, 1777, a symlink at the writer's temporary name): victim "
                   f"{'OVERWRITTEN' if victim.read_text() != 'precious' + chr(10) else 'untouched'}, ledger "
                   f"{'written' if (run_dir / 'budget' / 'job-rank0.json').exists() else 'not written'} ({took:.1f} s)")
        fresh = tmp / "fresh" / "perftracker-run"
        subprocess.run([sys.executable, "-c", _LEDGER, str(tree), str(fresh)], env=env, input="go\n",
                       capture_output=True, text=True, timeout=60)
        ledger = fresh / "budget" / "job-rank0.json"
        modes = {p.name: f"{p.stat().st_mode & 0o777:04o}" for p in (fresh, fresh / "budget", ledger) if p.exists()}
        out.append(f"run dir created by the worker: modes {modes}")
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    return "; ".join(out)


ITEMS = {"46.1 group-size bomb": item_group_bomb, "46.2 npz bomb": item_npz_bomb, "46.3 ledger run dir": item_ledger}
