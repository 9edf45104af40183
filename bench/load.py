"""Load benchmark: a real localizer process and N simulated agents in one session.

Every agent registers its worker, long-polls for triggers, "profiles" for the window when the
trigger arrives, and uploads a realistic PatternSet (python stacks sharing a frame table, kernels,
a collective, a memcpy; one slow rank). We count acknowledged uploads, then read the localizer's
store directly (sqlite, after it stored the report) to check that every acknowledged pattern is
there.

With ``--sessions N`` there are N jobs of ``--agents`` agents each, triggered together: N
concurrent sessions (``--sessions 10 --agents 1000``: 10 sessions of 1,000 uploads each). The
localizer's resident set size is sampled every 0.2 s (and its kernel peak, VmHWM, read at the end).

Progress goes to stderr; the last stdout line is ``{"agents", "sessions", "uploaded", "stored",
"lost", "p99_upload_ms", "localize_s", "peak_rss_mb", "start_rss_mb"}`` where ``localize_s`` is
the time from the commit of the last pattern to the stored report (the slowest session; both on the
localizer's clock). Targets: lost = 0, localize_s <= 5.

    python bench/load.py [--agents 2000] [--sessions 1] [--window-s 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

os.environ.setdefault("PERFTRACKER_DISABLE", "1")  # this process is not a training process
from perftracker.model import Category, Pattern, PatternSet  # noqa: E402

TOKEN = "bench-load-token"
PLACEHOLDER = b"@@SESSION@@"
JOB_PLACEHOLDER = b"@@JOB@@"


def log(msg: str) -> None:
    sys.stderr.write(f"[load {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


def realistic_patterns(job: str, session: str, rank: int, world: int, slow_rank: int, rng: random.Random) -> PatternSet:
    """About what the summarizer emits for a small DDP model: ~100 functions, the same on every
    rank (the code is the same), with per-rank values; compute on ``slow_rank`` takes 2.2x longer."""
    pats: list[Pattern] = []
    root = ["train.py:210 in <module>", "train.py:180 in main", "train.py:120 in train_epoch"]
    for i in range(60):
        shape = random.Random(i)  # the call structure is the program's, not the rank's
        depth = shape.randint(3, 12)
        stack = root + [f"model/layers.py:{20 + 7 * j + i} in block{j}_{i % 9}" for j in range(depth)]
        pats.append(Pattern(";".join(stack), Category.PYTHON, rng.uniform(0, 0.006), rng.uniform(0.7, 1.0),
                            rng.uniform(0, 0.08), label=stack[-1], executions=rng.randint(10, 3000),
                            critical_ns=rng.randint(10**5, 10**8), resource="cpu"))
    for i in range(40):
        base = random.Random(1000 + i).uniform(0.005, 0.03)
        beta = base * rng.uniform(0.95, 1.05) * (2.2 if rank == slow_rank and i < 10 else 1.0)
        name = f"aten::{['addmm', 'mm', 'conv2d', 'relu', 'softmax', 'layer_norm', 'gelu', 'bmm'][i % 8]}_{i}"
        pats.append(Pattern(name, Category.COMPUTE, beta, rng.uniform(0.88, 0.92), rng.uniform(0.02, 0.03),
                            label=name, executions=rng.randint(100, 8000), critical_ns=rng.randint(10**6, 10**9),
                            resource="cpu"))
    for name, cat, res in (("gloo:all_reduce", Category.COLLECTIVE, "nic"), ("gloo:broadcast", Category.COLLECTIVE, "nic"),
                           ("aten::copy_", Category.MEMORY, "pcie")):
        pats.append(Pattern(name, cat, rng.uniform(0.02, 0.06), rng.uniform(0.2, 0.4), rng.uniform(0.01, 0.05),
                            label=name, executions=rng.randint(100, 500), critical_ns=rng.randint(10**8, 10**9),
                            resource=res))
    start = time.time_ns()
    return PatternSet(job=job, session=session, rank=rank, world_size=world, host=f"node{rank // 8}",
                      window_start_ns=start, window_end_ns=start + 20 * 10**9, patterns=tuple(pats),
                      local_rank=rank % 8, pid=10_000 + rank,
                      iteration_ms=tuple(rng.uniform(95, 105) * (1.6 if rank == slow_rank else 1) for _ in range(8)))


def start_localizer(tmp: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    store = tmp / "store.sqlite"
    ready = tmp / "ready.json"
    env = dict(os.environ, PERFTRACKER_TOKEN=TOKEN, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "perftracker", "-v", "localizer", "--port", "0", "--store", str(store),
                             "--ready-file", str(ready), "--collect-grace-s", "120"],
                            env=env, stdout=subprocess.DEVNULL, stderr=open(tmp / "localizer.log", "wb"))  # noqa: SIM115
    end = time.monotonic() + 60
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > end:
            raise SystemExit(f"localizer did not start: {(tmp / 'localizer.log').read_text()[-2000:]}")
        time.sleep(0.05)
    return proc, json.loads(ready.read_text())["url"], store


class Agent:
    def __init__(self, idx: int, job: str, world: int) -> None:
        self.idx = idx
        self.job = job
        self.world = world
        self.agent_id = f"agent-{idx:05d}"
        self.upload_ms: float | None = None
        self.acked_at = 0.0
        self.error = ""
        self.key = ""  # the agent key the localizer issued at registration (localizer.ownership)

    async def run(self, http: aiohttp.ClientSession, url: str, registered: asyncio.Event, counter: list[int],
                  window_s: float, body_template: bytes, seed: int) -> None:
        h = {"Authorization": f"Bearer {TOKEN}"}
        rank = self.idx
        body = {"job": self.job, "agent_id": self.agent_id, "host": f"node{rank // 8}",
                "workers": [{"rank": rank, "local_rank": rank % 8, "world_size": self.world, "pid": 10_000 + rank,
                             "tid": 10_000 + rank, "host": f"node{rank // 8}"}]}
        try:
            for attempt in range(20):
                try:
                    async with http.post(url + "/v1/agents/register", json=body, headers=h) as r:
                        if r.status == 200:
                            self.key = (await r.json()).get("agent_key", "")
                            break
                        self.error = f"register {r.status}"
                except aiohttp.ClientError as exc:
                    self.error = f"register {exc}"
                await asyncio.sleep(0.05 * 2**min(attempt, 5))
            counter[0] += 1
            if counter[0] == self.world:
                registered.set()
            session = ""
            while not session:  # long poll
                async with http.get(f"{url}/v1/jobs/{self.job}/triggers", params={"timeout_s": "60"}, headers=h) as r:
                    if r.status == 200:
                        session = (await r.json())["session"]
            rng = random.Random(seed + rank)
            await asyncio.sleep(window_s + rng.uniform(0, 1.0))  # the window, then summarizing skew
            # the PatternSet was serialized before the trigger (JSON, session as a placeholder) so that
            # the client's own CPU does not count in the upload latency
            data = body_template.replace(PLACEHOLDER, session.encode())
            t0 = time.perf_counter()
            for attempt in range(10):
                try:
                    async with http.post(f"{url}/v1/sessions/{session}/patterns", data=data,
                                         headers={**h, "Content-Type": "application/json",
                                                  "X-Perftracker-Agent-Key": self.key}) as r:
                        if r.status == 200 and (await r.json()).get("stored"):
                            self.upload_ms = (time.perf_counter() - t0) * 1000
                            self.acked_at = time.time()
                            self.error = ""
                            return
                        self.error = f"upload {r.status} {await r.text()}"
                        if r.status < 500:
                            return
                except aiohttp.ClientError as exc:
                    self.error = f"upload {exc}"
                await asyncio.sleep(0.1 * 2**attempt)
        except Exception as exc:  # noqa: BLE001 - counted as not uploaded
            self.error = f"{type(exc).__name__}: {exc}"


async def drive(url: str, n_agents: int, window_s: float, seed: int, n_jobs: int = 1,
                json_sizes: list[int] | None = None) -> tuple[list[Agent], list[str], float]:
    """``n_jobs`` jobs of ``n_agents`` agents each, triggered together: that many concurrent sessions."""
    jobs = ["bench-load"] if n_jobs == 1 else [f"bench-load-{j}" for j in range(n_jobs)]
    slow_rank = n_agents // 3
    agents = [Agent(i, job, n_agents) for job in jobs for i in range(n_agents)]
    rng = random.Random(seed)
    t0 = time.monotonic()
    # one set of bodies per rank, shared by the jobs (the job name is a placeholder too)
    templates = [json.dumps(realistic_patterns(JOB_PLACEHOLDER.decode(), PLACEHOLDER.decode(), i, n_agents, slow_rank,
                                               rng).to_dict(), separators=(",", ":")).encode() for i in range(n_agents)]
    if json_sizes is not None:
        json_sizes.extend(len(t) for t in templates)
    log(f"{n_agents} PatternSets of {sum(map(len, templates)) / n_agents / 1024:.1f} KiB JSON "
        f"({len(realistic_patterns(jobs[0], 'x', 0, n_agents, slow_rank, rng).to_bytes()) / 1024:.1f} KiB zlib) "
        f"built in {time.monotonic() - t0:.1f} s")
    registered = {job: asyncio.Event() for job in jobs}
    counters = {job: [0] for job in jobs}
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as http:
        t0 = time.monotonic()
        tasks = [asyncio.create_task(a.run(http, url, registered[a.job], counters[a.job], window_s,
                                           templates[a.idx].replace(JOB_PLACEHOLDER, a.job.encode()), seed))
                 for a in agents]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in registered.values())), 600)
        log(f"{len(agents)} agents ({n_jobs} job(s)) registered in {time.monotonic() - t0:.1f} s; all long-polling")
        await asyncio.sleep(1.0)  # let every long poll reach the server
        h = {"Authorization": f"Bearer {TOKEN}"}
        async def trigger(job: str) -> str:
            async with http.post(f"{url}/v1/jobs/{job}/triggers", json={"reason": "bench", "window_s": window_s},
                                 headers=h) as r:
                return str((await r.json())["session"])

        t_trig = time.monotonic()
        sessions = list(await asyncio.gather(*(trigger(job) for job in jobs)))  # all sessions open together
        log(f"{len(sessions)} session(s) opened in {time.monotonic() - t_trig:.2f} s")
        log(f"trigger: session(s) {sessions}")
        await asyncio.gather(*tasks)
        done = [a for a in agents if a.upload_ms is not None]
        log(f"{len(done)}/{len(agents)} uploads acknowledged; waiting for the report(s)")
        end = time.monotonic() + 600
        closed_ns = 0
        pending = set(sessions)
        while pending and time.monotonic() < end:
            for session in sorted(pending):
                async with http.get(f"{url}/v1/sessions/{session}", headers=h) as r:
                    st = await r.json()
                if st["state"] in ("done", "failed"):
                    if st["state"] == "failed":
                        log(f"session {session} failed: {st['error']}")
                    closed_ns = max(closed_ns, st["closed_ns"])
                    pending.discard(session)
            await asyncio.sleep(0.25)  # light polling: do not steal CPU from the localization
    return agents, sessions, closed_ns / 1e9


class RssSampler:
    """The localizer's resident set size, sampled every 0.2 s on a thread; also its kernel peak."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.pid = pid
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
                self.samples += 1
            except psutil.Error:
                return

    def hwm_bytes(self) -> int:
        """VmHWM: the kernel's peak RSS of the process (catches spikes between samples)."""
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=2000, help="agents (uploads) per session")
    ap.add_argument("--sessions", type=int, default=1, help="concurrent sessions (one job each)")
    ap.add_argument("--window-s", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    n_all = args.agents * args.sessions
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 4 * n_all + 1024))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    with tempfile.TemporaryDirectory(prefix="perftracker-load-") as d:
        tmp = Path(d)
        proc, url, store = start_localizer(tmp)
        log(f"localizer at {url}, store {store}")
        ps_proc = psutil.Process(proc.pid)
        rss0 = ps_proc.memory_info().rss
        rss = RssSampler(proc.pid)
        sizes: list[int] = []
        try:
            agents, sessions, closed_s = asyncio.run(drive(url, args.agents, args.window_s, args.seed, args.sessions,
                                                           sizes))
            cpu = ps_proc.cpu_times()
            peak_rss = max(rss.peak, rss.hwm_bytes())
            log(f"localizer process CPU: {cpu.user + cpu.system:.1f} s in all "
                f"(machine load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
            log(f"localizer RSS: {rss0 / 2**20:.0f} MB at start, peak {peak_rss / 2**20:.0f} MB "
                f"({rss.samples} samples every 0.2 s and VmHWM); uploads held {n_all} x "
                f"{sum(sizes) / max(1, len(sizes)) / 1024:.1f} KiB JSON = {n_all * sum(sizes) / max(1, len(sizes)) / 2**20:.0f} MB")
        finally:
            rss.stop()
            proc.terminate()
            proc.wait(30)
        acked = {(a.job, a.idx) for a in agents if a.upload_ms is not None}
        db = sqlite3.connect(store)
        stored: set[tuple[str, int]] = set()
        localize = []
        for session in sessions:
            job = db.execute("SELECT job FROM sessions WHERE session=?", (session,)).fetchone()[0]
            stored |= {(job, r[0]) for r in db.execute("SELECT rank FROM patterns WHERE session=?", (session,))}
            report = db.execute("SELECT status, body FROM reports WHERE session=?", (session,)).fetchone()
            # server-side times, one clock: when the last pattern was committed, when the session closed
            last_ns = db.execute("SELECT MAX(received_ns) FROM patterns WHERE session=?", (session,)).fetchone()[0]
            closed_ns = db.execute("SELECT closed_ns FROM sessions WHERE session=?", (session,)).fetchone()[0]
            localize.append((closed_ns - last_ns) / 1e9 if report is not None and last_ns else float("nan"))
            if report is not None:
                body = json.loads(report[1])
                log(f"session {session}: report {report[0]}: {len(body['findings'])} finding(s); {body['summary'][:160]}")
            else:
                log(f"session {session}: no report stored; {(tmp / 'localizer.log').read_text()[-1500:]}")
        db.close()
        errors = [a.error for a in agents if a.error][:5]
        if errors:
            log(f"errors (first 5): {errors}")
        lat = sorted(a.upload_ms for a in agents if a.upload_ms is not None)
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan")
        last_ack = max((a.acked_at for a in agents if a.upload_ms is not None), default=0.0)
        localize_s = max(localize) if localize else float("nan")
        log(f"report(s) stored {localize_s:.2f} s (the slowest) after the last pattern was committed (server clock); "
            f"{closed_s - last_ack:.2f} s after the last acknowledgement reached an agent")
        for line in (tmp / "localizer.log").read_text().splitlines():
            if "localizing took" in line:
                log(f"localizer: {line}")
        log(f"upload latency ms: p50 {lat[len(lat) // 2]:.1f}, p99 {p99:.1f}, max {lat[-1]:.1f}" if lat else "no uploads")
    print(json.dumps({"agents": args.agents, "sessions": args.sessions, "uploaded": len(acked),
                      "stored": len(stored & acked), "lost": len(acked - stored), "p99_upload_ms": round(p99, 1),
                      "localize_s": round(localize_s, 3), "peak_rss_mb": round(peak_rss / 2**20, 1),
                      "start_rss_mb": round(rss0 / 2**20, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
