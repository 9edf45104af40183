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


# ---------------------------------------------------------------- items 4, 5, 8: a real agent
class _Agent:
    """``perftracker agent --embedded-localizer`` of ``tree`` with a short run dir (AF_UNIX paths)."""

    def __init__(self, tree: Path, tmp: Path, *extra: str) -> None:
        import tempfile

        self.run_dir = Path(tempfile.mkdtemp(prefix="pt-h46-", dir="/tmp"))
        self.log = tmp / f"agent-{time.monotonic_ns()}.log"
        env = dict(os.environ, PYTHONPATH=str(tree), PERFTRACKER_DISABLE="1")
        self.env = env
        self.proc = subprocess.Popen([sys.executable, "-m", "perftracker", "-v", "agent", "--run-dir", str(self.run_dir),
                                     "--runs-dir", str(tmp / "runs"), "--embedded-localizer", *extra], env=env,
                                    stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, cwd=str(tree))  # noqa: SIM115
        end = time.monotonic() + 60
        while not (self.run_dir / "agent.json").exists() or not (self.run_dir / "agent.sock").exists():
            if self.proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"agent did not start: {self.log.read_text()[-600:]}")
            time.sleep(0.1)
        time.sleep(0.3)
        self.info = json.loads((self.run_dir / "agent.json").read_text())

    def register(self, rank: int, pid: int, job: str = "jb", timeout: float = 10.0) -> tuple[Any, Any]:
        """(socket, ack) of a REGISTER naming ``pid``; ack None when the agent did not answer in time."""
        import socket as _s

        from perftracker.wire import framing as wire
        from perftracker.wire.framing import MessageType

        sock = _s.socket(_s.AF_UNIX, _s.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect(str(self.run_dir / "agent.sock"))
        wire.send_message(sock, wire.make_message(MessageType.REGISTER, protocol=wire.PROTOCOL_VERSION, job=job,
                                                  rank=rank, world_size=64, local_rank=rank % 8, pid=pid,
                                                  training_tid=pid, host=_s.gethostname()))
        try:
            return sock, wire.recv_message(sock)
        except (OSError, wire.WireError, wire.ConnectionClosed):  # no answer in time (ConnectionClosed on a timeout)
            return sock, None

    def stop(self) -> str:
        """SIGTERM: how it ended (seconds, or 'ignored SIGTERM' and killed)."""
        import shutil
        import signal

        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
            out = f"exited {time.monotonic() - t0:.1f} s after SIGTERM"
        except subprocess.TimeoutExpired:
            import psutil

            for c in psutil.Process(self.proc.pid).children(recursive=True):
                c.kill()
            self.proc.kill()
            self.proc.wait()
            out = "ignored SIGTERM for 15 s (killed)"
        shutil.rmtree(self.run_dir, ignore_errors=True)
        return out


_DYING = r"""
import os, socket, sys
from perftracker.wire import framing as wire
from perftracker.wire.framing import MessageType
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
wire.send_message(s, wire.make_message(MessageType.REGISTER, protocol=wire.PROTOCOL_VERSION, job="jf", rank=0,
                  world_size=2, local_rank=0, pid=os.getpid(), training_tid=os.getpid(), host=socket.gethostname()))
wire.recv_message(s)
os._exit(1)
"""


def item_error_file(tree: Path, tmp: Path) -> str:
    """Item 4: a worker names a FIFO as TORCHELASTIC_ERROR_FILE and dies; then a second worker registers."""
    agent = _Agent(tree, tmp)
    try:
        fifo = tmp / "error.fifo"
        os.mkfifo(fifo)
        subprocess.run([sys.executable, "-c", _DYING, str(agent.run_dir / "agent.sock")], timeout=30,
                       env=dict(agent.env, TORCHELASTIC_ERROR_FILE=str(fifo)), capture_output=True)
        time.sleep(3)  # the agent notices the death (it polls for the zombie for a second)
        t0 = time.monotonic()
        _, ack = agent.register(1, os.getpid(), job="jf", timeout=10)
        answered = f"next worker ACKed in {time.monotonic() - t0:.2f} s" if ack else "next worker: no ACK in 10 s"
        health = ""
        if agent.info.get("metrics_url"):
            health = f", /healthz {_http_status(agent.info['metrics_url'].replace('/metrics', '/healthz'))}"
    finally:
        ended = agent.stop()
    return f"FIFO error file, worker died: {answered}{health}; {ended}"


def _http_status(url: str, timeout: float = 5.0, source: str = "") -> str:
    """GET ``url``'s status and time; ``source``: the local address to connect from (the kubelet
    probes from the node's address, not the attacker's)."""
    import http.client

    hostport, _, path = url.split("//", 1)[1].partition("/")
    host, port = hostport.rsplit(":", 1)
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout, source_address=(source, 0) if source else None)
    try:
        conn.request("GET", "/" + path)
        return f"{conn.getresponse().status} in {time.monotonic() - t0:.2f} s"
    except (OSError, http.client.HTTPException) as exc:
        return f"failed after {time.monotonic() - t0:.1f} s ({type(exc).__name__})"
    finally:
        conn.close()


def _fds_threads(pid: int) -> tuple[int, int]:
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    threads = next(int(ln.split()[1]) for ln in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if ln.startswith("Threads:"))
    return fds, threads


def item_metrics_connections(tree: Path, tmp: Path, n: int = 300) -> str:
    """Item 5: ``n`` idle TCP connections to the agent's metrics port (the review opened 1,009)."""
    import socket as _s

    agent = _Agent(tree, tmp, "--metrics-port", "0")
    conns = []
    try:
        url = agent.info["metrics_url"]
        host, port = url.split("//")[1].split("/")[0].rsplit(":", 1)
        base = _fds_threads(agent.proc.pid)
        for _ in range(n):
            try:
                conns.append(_s.create_connection((host, int(port)), timeout=5))
            except OSError:
                break
        time.sleep(1.0)
        held = _fds_threads(agent.proc.pid)
        during = _http_status(url.replace("/metrics", "/healthz"), source="127.0.0.2")
        time.sleep(6.0)  # past the read timeout, if there is one
        later = _http_status(url.replace("/metrics", "/healthz"))
        after = _fds_threads(agent.proc.pid)
    finally:
        for c in conns:
            c.close()
        ended = agent.stop()
    return (f"{len(conns)} idle connections: agent fds/threads {base} before, {held} with them, {after} 7 s later; "
            f"/healthz from another address with them {during}, 7 s later {later}; {ended}")


def item_declared_pid(tree: Path, tmp: Path, n: int = 30) -> str:
    """Item 8: ``n`` registrations from one process naming one ``sleep``'s pid; the samplers the agent
    starts (a worker's standby samplers start 20 s after it registers) and their memory."""
    import psutil

    agent = _Agent(tree, tmp)
    sleeper = subprocess.Popen(["sleep", "120"])
    socks = []
    try:
        acks = []
        for r in range(n):
            sock, ack = agent.register(r, sleeper.pid)
            socks.append(sock)
            acks.append(bool(ack and ack.get("ok")))
        time.sleep(28)
        kids = [c for c in psutil.Process(agent.proc.pid).children(recursive=True)
                if "samplers" in " ".join(c.cmdline())]
        rss = sum(c.memory_info().rss for c in kids) / 1e6
        watched = {a for c in kids for a in c.cmdline() if a.isdigit() and int(a) in (sleeper.pid, os.getpid())}
        log = agent.log.read_text()
        kernel = "kernel pid used" if "but the kernel says" in log else "declared pid used"
    finally:
        for s_ in socks:
            s_.close()
        sleeper.kill()
        ended = agent.stop()
    return (f"{n} registrations naming sleep's pid: {sum(acks)} accepted ({kernel}); {len(kids)} sampler "
            f"processes, {rss:.0f} MB; watching {'the sleep' if str(sleeper.pid) in watched else 'not the sleep'}; "
            f"{ended}")


# ---------------------------------------------------------------- items 6, 7: the localizer
def item_retention_tenants(tree: Path, tmp: Path) -> str:
    """Item 6: tenant B stores 3 small reports, then tenant A 10 large ones past the size bound."""
    code = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
from perftracker.localizer.service.http_service import LocalizerService, ServiceOptions
from perftracker.localizer.service.retention import RetentionOptions
from perftracker.localizer.store.rank_ranges import RankRanges
from perftracker.localizer.store.sqlite_store import SessionRecord, Store
from perftracker.model import Report
store = Store(sys.argv[2])
now = time.time_ns()
def seed(rows):
    for name, job, age, n in rows:
        t = now - int(age * 1e9)
        store.insert_session(SessionRecord(0, name, job, "slowdown", "r", 20.0, "done", t, t, closed_ns=t, expected=RankRanges.span(2)))
        store.events.put_report(Report(job=job, session=name, kind="slowdown", created_ns=t, trigger_reason="r", window_s=20.0, ranks_reported=(0, 1), summary="x" * n))
seed([(f"b-{i}", "b-job", 3600.0 - i, 5000) for i in range(3)])
seed([(f"a-{i}", "a-job", 600.0 - i, 200000) for i in range(10)])
opts = ServiceOptions(job_tokens={"tenant-a-token-0123456789abcdef": ("a-*",), "tenant-b-token-0123456789abcdef": ("b-*",)},
                      retention=RetentionOptions(max_age_s=0, max_bytes=1_000_000))
svc = LocalizerService(store, "probe-token-0123456789abcdef", opts)
plan = svc.retention.sweep(now)
b = sum(store.events.get_report(f"b-{i}") is not None for i in range(3))
print(f"B's reports kept {b}/3; evicted {len(plan.evicted)} ({', '.join(plan.evicted)})")
"""
    done = subprocess.run([sys.executable, "-c", code, str(tree), str(tmp / "s.sqlite")], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(tree), PERFTRACKER_DISABLE="1"))
    return done.stdout.strip() or done.stderr.strip()[-300:]


def item_snapshot_quota(tree: Path, tmp: Path, n: int = 30) -> str:
    """Item 7: one job-scoped token ("h-*", --triggers-per-minute 3) sends ``n`` hang snapshots, one per job."""
    from bench.hardening import Localizer

    scoped = "scoped-token-0123456789abcdef"
    (tmp / "job-tokens.json").write_text(json.dumps({scoped: ["h-*"]}))
    loc = Localizer(tree, tmp, extra=["--job-tokens", str(tmp / "job-tokens.json"), "--triggers-per-minute", "3"])
    auth = {"Authorization": f"Bearer {scoped}"}
    try:
        codes: dict[int, int] = {}
        t0 = time.monotonic()
        for i in range(n):
            st, body = loc.request("POST", "/v1/agents/register", {"job": f"h-{i}", "agent_id": "a", "host": "n",
                                   "workers": [{"rank": 0, "local_rank": 0, "world_size": 1, "pid": 1, "tid": 1,
                                                "host": "n"}]}, headers=auth)
            key = json.loads(body).get("agent_key", "") if st == 200 else ""
            snap = {"job": f"h-{i}", "rank": 0, "world_size": 1, "host": "n", "pid": 1, "taken_ns": time.time_ns(),
                    "last_iteration": 5, "idle_s": 30.0, "stack": [], "schema_version": _schema_version()}
            st, _ = loc.request("POST", "/v1/hang-snapshots", snap,
                                headers={**auth, **({"X-Perftracker-Agent-Key": key} if key else {})})
            codes[st] = codes.get(st, 0) + 1
        took = time.monotonic() - t0
        _, body = loc.request("GET", "/v1/sessions")
        sessions = json.loads(body).get("sessions", [])
    finally:
        loc.stop()
    return f"{n} hang snapshots from one token in {took:.1f} s: statuses {codes}; sessions opened {len(sessions)}"


ITEMS = {"46.1 group-size bomb": item_group_bomb, "46.2 npz bomb": item_npz_bomb, "46.3 ledger run dir": item_ledger,
         "46.4 error file": item_error_file, "46.5 metrics connections": item_metrics_connections,
         "46.6 retention tenants": item_retention_tenants, "46.7 snapshot quota": item_snapshot_quota,
         "46.8 declared pid": item_declared_pid}
