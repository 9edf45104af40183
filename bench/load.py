"""Load benchmark: a real localizer process and N simulated node agents in one session.

Every agent registers its node's ``--ranks-per-agent`` workers, long-polls for triggers,
"profiles" for the window when the trigger arrives, and uploads its ranks' patterns (about what
the summarizer emits for a small DDP model: python stacks sharing a frame table, kernels, a
collective, a memcpy; one slow rank) in ONE request, in the columnar wire form
(``perftracker.wire.patterns``; ``--format json``: one JSON request per rank, the old path). We
count acknowledged ranks, then read the localizer's store directly (sqlite, after it stored the
report) to check that every acknowledged rank's patterns are there.

The load generator is kept cheap so that it does not starve the localizer on a small machine: the
bodies are built before the trigger from a few templates with per-node jittered numbers, and at
upload time only the session id is patched in (no serialization while the localizer ingests).

With ``--sessions N`` there are N jobs of ``--agents`` agents each, triggered together. The
localizer's resident set size is sampled every 0.2 s (and its kernel peak, VmHWM, read at the end).

Progress goes to stderr; the last stdout line is ``{"agents", "ranks_per_agent", "workers",
"sessions", "format", "uploaded", "stored", "lost", "ingest_s", "localize_s", "end_to_end_s",
"p99_upload_ms", "peak_rss_mb", "start_rss_mb"}``: ``uploaded``/``stored``/``lost`` count ranks;
``ingest_s`` is first to last acknowledgement (client clock); ``localize_s`` the commit of the
last pattern to the stored report and ``end_to_end_s`` the window's end (session opened + window)
to the stored report, both on the localizer's clock (the slowest session). Targets (issue 21, a
2-core machine, ``--agents 12500 --ranks-per-agent 8``): lost = 0, end_to_end_s <= 60,
localize_s <= 10, p99_upload_ms <= 30000, peak_rss_mb <= 4096.

    python bench/load.py [--agents 2000] [--ranks-per-agent 1] [--sessions 1] [--window-s 2]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
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
import zlib
from pathlib import Path

import aiohttp
import numpy as np
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from perftracker.model import Category, Pattern, PatternSet  # noqa: E402
from perftracker.wire import patterns as pattern_wire  # noqa: E402
from perftracker.wire.patterns import COLUMNS_CONTENT_TYPE, HEADER  # noqa: E402

TOKEN = "bench-load-token"
PLACEHOLDER = b"@@SESSION@@"


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
    """One node agent: ``ranks`` workers, one registration, one long poll, one upload."""

    def __init__(self, idx: int, job: str, ranks: list[int], world: int) -> None:
        self.idx = idx
        self.job = job
        self.ranks = ranks
        self.world = world
        self.agent_id = f"agent-{idx:05d}"
        self.upload_ms: float | None = None
        self.acked_at = 0.0
        self.acked: set[int] = set()
        self.error = ""
        self.key = ""  # the agent key the localizer issued at registration (perftracker.localizer.service.ownership)

    async def run(self, http: aiohttp.ClientSession, url: str, registered: asyncio.Event, counter: list[int],
                  window_s: float, bodies: list[tuple[bytes, str]], n_agents: int, seed: int) -> None:
        h = {"Authorization": f"Bearer {TOKEN}"}
        host = f"node{self.idx}"
        body = {"job": self.job, "agent_id": self.agent_id, "host": host,
                "workers": [{"rank": r, "local_rank": i, "world_size": self.world, "pid": 10_000 + i,
                             "tid": 10_000 + i, "host": host} for i, r in enumerate(self.ranks)]}
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
            if counter[0] == n_agents:
                registered.set()
            session = ""
            while not session:  # long poll
                async with http.get(f"{url}/v1/jobs/{self.job}/triggers", params={"timeout_s": "60"}, headers=h) as r:
                    if r.status == 200:
                        session = (await r.json())["session"]
            rng = random.Random(seed + self.idx)
            await asyncio.sleep(window_s + rng.uniform(0, 1.0))  # the window, then summarizing skew
            t0 = time.perf_counter()
            for data, ctype in bodies:
                data = patch_session(data, ctype, session)
                for attempt in range(10):
                    try:
                        async with http.post(f"{url}/v1/sessions/{session}/patterns", data=data,
                                             headers={**h, "Content-Type": ctype,
                                                      "X-Perftracker-Agent-Key": self.key}) as r:
                            if r.status == 200:
                                ack = await r.json()
                                if ack.get("stored"):
                                    self.acked.update(ack.get("ranks", [ack.get("rank")]))
                                    self.error = ""
                                    break
                            self.error = f"upload {r.status} {await r.text()}"
                            if r.status < 500:
                                return
                    except aiohttp.ClientError as exc:
                        self.error = f"upload {exc}"
                    await asyncio.sleep(0.1 * 2**attempt)
                else:
                    return
            self.upload_ms = (time.perf_counter() - t0) * 1000
            self.acked_at = time.time()
        except Exception as exc:  # noqa: BLE001 - counted as not uploaded
            self.error = f"{type(exc).__name__}: {exc}"


def patch_session(data: bytes, ctype: str, session: str) -> bytes:
    """The pre-built body with the session id in place of its placeholder (the columnar header
    records the meta's length, so it is rewritten too)."""
    if ctype != COLUMNS_CONTENT_TYPE:
        return data.replace(PLACEHOLDER, session.encode())
    magic, version, flags, table_len, meta_len, rows = HEADER.unpack_from(data)
    mid = HEADER.size + table_len
    meta = data[mid:mid + meta_len].replace(PLACEHOLDER, session.encode())
    return (HEADER.pack(magic, version, flags, table_len, len(meta), rows) + data[HEADER.size:mid] + meta
            + data[mid + meta_len:])


def node_bodies(job: str, agents: list[Agent], world: int, slow_rank: int, seed: int, fmt: str,
                sizes: list[int]) -> dict[int, list[tuple[bytes, str]]]:
    """Each agent's upload bodies, built before the trigger: from a few template nodes, with each
    node's numbers jittered (numpy on the template arrays), its ranks and hosts in the meta."""
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    rpa = len(agents[0].ranks)
    out: dict[int, list[tuple[bytes, str]]] = {}
    if fmt == "json":
        for a in agents:
            out[a.idx] = [(json.dumps(realistic_patterns(job, PLACEHOLDER.decode(), r, world, slow_rank, rng).to_dict(),
                                      separators=(",", ":")).encode(), "application/json") for r in a.ranks]
            sizes.extend(len(b) for b, _ in out[a.idx])
        return out
    templates = []
    for k in range(4):
        sets = [realistic_patterns(job, PLACEHOLDER.decode(), k * rpa + i, world, -1, rng) for i in range(rpa)]
        templates.append(pattern_wire.batch_from_sets(sets))
    tables: dict[int, bytes] = {}
    for a in agents:
        slow = slow_rank in a.ranks
        if slow:  # the slow rank's node: its own numbers
            sets = [realistic_patterns(job, PLACEHOLDER.decode(), r, world, slow_rank, rng) for r in a.ranks]
            batch = pattern_wire.batch_from_sets(sets)
            values = batch.values
        else:
            batch = templates[a.idx % len(templates)]
            values = np.clip(batch.values * (1 + 0.03 * nrng.standard_normal(batch.values.shape)), 0.0, 1.0)
        workers = tuple(dataclasses.replace(w, rank=r, host=f"node{a.idx}", local_rank=i, pid=10_000 + i)
                        for i, (w, r) in enumerate(zip(batch.workers, a.ranks, strict=True)))
        node = dataclasses.replace(batch, job=a.job, workers=workers, values=values)
        table = tables.get(id(batch))
        if table is None:
            table = tables[id(batch)] = json.dumps(pattern_wire.table_dict(node), separators=(",", ":")).encode()
        meta = json.dumps(pattern_wire.meta_dict(node), separators=(",", ":")).encode()
        # the array section compressed as the agent sends it (it does not hold the session id)
        body = pattern_wire.frame(table, meta, node.rows, zlib.compress(pattern_wire.array_bytes(node), 1),
                                  compressed=True)
        out[a.idx] = [(body, COLUMNS_CONTENT_TYPE)]
        sizes.append(len(body))
    return out


async def drive(url: str, n_agents: int, rpa: int, window_s: float, seed: int, n_jobs: int, fmt: str,
                sizes: list[int]) -> tuple[list[Agent], list[str]]:
    """``n_jobs`` jobs of ``n_agents`` agents of ``rpa`` ranks each, triggered together."""
    jobs = ["bench-load"] if n_jobs == 1 else [f"bench-load-{j}" for j in range(n_jobs)]
    world = n_agents * rpa
    slow_rank = world // 3
    agents = [Agent(i, job, list(range(i * rpa, (i + 1) * rpa)), world) for job in jobs for i in range(n_agents)]
    t0 = time.monotonic()
    bodies: dict[tuple[str, int], list[tuple[bytes, str]]] = {}
    for job in jobs:
        mine = [a for a in agents if a.job == job]
        for idx, b in node_bodies(job, mine, world, slow_rank, seed, fmt, sizes).items():
            bodies[(job, idx)] = b
    log(f"{len(agents)} node bodies ({fmt}, {rpa} rank(s) each, {sum(sizes) / max(1, len(sizes)) / 1024:.1f} KiB "
        f"per request) built in {time.monotonic() - t0:.1f} s")
    registered = {job: asyncio.Event() for job in jobs}
    counters = {job: [0] for job in jobs}
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as http:
        t0 = time.monotonic()
        tasks = [asyncio.create_task(a.run(http, url, registered[a.job], counters[a.job], window_s,
                                           bodies[(a.job, a.idx)], n_agents, seed)) for a in agents]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in registered.values())), 900)
        log(f"{len(agents)} agents ({n_jobs} job(s), {world} ranks each) registered in {time.monotonic() - t0:.1f} s; "
            f"all long-polling")
        await asyncio.sleep(1.0)  # let every long poll reach the server
        h = {"Authorization": f"Bearer {TOKEN}"}

        async def trigger(job: str) -> str:
            async with http.post(f"{url}/v1/jobs/{job}/triggers", json={"reason": "bench", "window_s": window_s},
                                 headers=h) as r:
                return str((await r.json())["session"])

        t_trig = time.monotonic()
        sessions = list(await asyncio.gather(*(trigger(job) for job in jobs)))  # all sessions open together
        log(f"{len(sessions)} session(s) opened in {time.monotonic() - t_trig:.2f} s: {sessions}")
        await asyncio.gather(*tasks)
        done = sum(len(a.acked) for a in agents)
        log(f"{done}/{len(agents) * rpa} ranks acknowledged; waiting for the report(s)")
        end = time.monotonic() + 600
        pending = set(sessions)
        while pending and time.monotonic() < end:
            for session in sorted(pending):
                try:
                    async with http.get(f"{url}/v1/sessions/{session}", headers=h) as r:
                        st = await r.json()
                except aiohttp.ClientError as exc:  # e.g. an idle pooled connection the server just closed
                    log(f"polling session {session}: {type(exc).__name__}: {exc}; again")
                    continue
                if st["state"] in ("done", "failed"):
                    if st["state"] == "failed":
                        log(f"session {session} failed: {st['error']}")
                    pending.discard(session)
            await asyncio.sleep(1.0)  # light polling: a 100,000-rank session answer is ~1 MB of JSON
    return agents, sessions


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
    ap.add_argument("--agents", type=int, default=2000, help="node agents (uploads) per session")
    ap.add_argument("--ranks-per-agent", type=int, default=1, help="workers per node agent (8: a GPU node)")
    ap.add_argument("--format", choices=("columns", "json"), default="columns",
                    help="columns: one columnar upload per node (the agent's); json: one JSON upload per rank")
    ap.add_argument("--sessions", type=int, default=1, help="concurrent sessions (one job each)")
    ap.add_argument("--window-s", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rpa = args.ranks_per_agent
    n_all = args.agents * args.sessions
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 4 * n_all + 1024))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    with tempfile.TemporaryDirectory(prefix="perftracker-load-") as d:
        tmp = Path(d)
        proc, url, store = start_localizer(tmp)
        log(f"localizer at {url}, store {store}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        ps_proc = psutil.Process(proc.pid)
        rss0 = ps_proc.memory_info().rss
        rss = RssSampler(proc.pid)
        sizes: list[int] = []
        try:
            agents, sessions = asyncio.run(drive(url, args.agents, rpa, args.window_s, args.seed, args.sessions,
                                                 args.format, sizes))
            cpu = ps_proc.cpu_times()
            peak_rss = max(rss.peak, rss.hwm_bytes())
            log(f"localizer process CPU: {cpu.user + cpu.system:.1f} s in all "
                f"(machine load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
            log(f"localizer RSS: {rss0 / 2**20:.0f} MB at start, peak {peak_rss / 2**20:.0f} MB "
                f"({rss.samples} samples every 0.2 s and VmHWM); uploads {len(sizes)} x "
                f"{sum(sizes) / max(1, len(sizes)) / 1024:.1f} KiB = {sum(sizes) / 2**20:.0f} MB")
        finally:
            rss.stop()
            proc.terminate()
            proc.wait(30)
        acked = {(a.job, r) for a in agents for r in a.acked}
        db = sqlite3.connect(store)
        stored: set[tuple[str, int]] = set()
        localize, e2e = [], []
        for session in sessions:
            job, opened_ns, window_s, closed_ns = db.execute(
                "SELECT job, opened_ns, window_s, closed_ns FROM sessions WHERE session=?", (session,)).fetchone()
            stored |= {(job, r[0]) for r in db.execute("SELECT rank FROM patterns WHERE session=?", (session,))}
            report = db.execute("SELECT status, body FROM reports WHERE session=?", (session,)).fetchone()
            # server-side times, one clock: when the last pattern was committed, when the session closed
            last_ns = db.execute("SELECT MAX(received_ns) FROM patterns WHERE session=?", (session,)).fetchone()[0]
            ok = report is not None and last_ns
            localize.append((closed_ns - last_ns) / 1e9 if ok else float("nan"))
            e2e.append((closed_ns - opened_ns) / 1e9 - window_s if ok else float("nan"))
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
        acks = [a.acked_at for a in agents if a.upload_ms is not None]
        ingest_s = max(acks) - min(acks) if acks else float("nan")
        localize_s = max(localize) if localize else float("nan")
        end_to_end_s = max(e2e) if e2e else float("nan")
        log(f"report(s) stored {localize_s:.2f} s (the slowest) after the last pattern was committed and "
            f"{end_to_end_s:.2f} s after the window ended (server clock); acknowledgements over {ingest_s:.2f} s")
        for line in (tmp / "localizer.log").read_text().splitlines():
            if "localizing took" in line or "localized " in line:
                log(f"localizer: {line}")
        log(f"upload latency ms: p50 {lat[len(lat) // 2]:.1f}, p99 {p99:.1f}, max {lat[-1]:.1f}" if lat else "no uploads")
    print(json.dumps({"agents": args.agents, "ranks_per_agent": rpa, "workers": args.agents * rpa,
                      "sessions": args.sessions, "format": args.format, "uploaded": len(acked),
                      "stored": len(stored & acked), "lost": len(acked - stored), "ingest_s": round(ingest_s, 3),
                      "localize_s": round(localize_s, 3), "end_to_end_s": round(end_to_end_s, 3),
                      "p99_upload_ms": round(p99, 1), "peak_rss_mb": round(peak_rss / 2**20, 1),
                      "start_rss_mb": round(rss0 / 2**20, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
