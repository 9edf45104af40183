"""Helpers for the localizer service tests: realistic PatternSets and a localizer subprocess."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from perftracker.model import Category, Pattern, PatternSet

REPO = Path(__file__).resolve().parents[1]
TOKEN = "test-token-0123456789"


def make_pattern_set(job: str, session: str, rank: int, world_size: int, *, n_python: int = 12,
                     n_kernels: int = 20, seed: int = 0, slow: bool = False) -> PatternSet:
    """A realistic worker PatternSet: python stacks with a shared frame table, compute kernels,
    collectives and memory copies, with small per-rank noise (a slow rank has longer compute)."""
    rng = random.Random(seed * 100_003 + rank)
    pats = []
    base = ["train.py:120 in main", "train.py:88 in train_step"]
    for i in range(n_python):
        stack = ";".join(base + [f"model.py:{40 + i} in layer{i}", f"torch/nn/modules/module.py:1736 in _call_impl{i}"])
        pats.append(Pattern(stack, Category.PYTHON, rng.uniform(0, 0.008), rng.uniform(0.8, 1.0), rng.uniform(0, 0.05),
                            label=stack.rsplit(";", 1)[-1], executions=rng.randint(10, 500), critical_ns=rng.randint(10**5, 10**8), resource="cpu"))
    for i in range(n_kernels):
        beta = rng.uniform(0.01, 0.05) * (2.0 if slow else 1.0)
        pats.append(Pattern(f"aten::kernel_{i}", Category.COMPUTE, min(beta, 1.0), rng.uniform(0.85, 0.95),
                            rng.uniform(0.01, 0.05), label=f"aten::kernel_{i}", executions=rng.randint(100, 5000),
                            critical_ns=rng.randint(10**6, 10**9), resource="cpu"))
    pats.append(Pattern("gloo:all_reduce", Category.COLLECTIVE, rng.uniform(0.05, 0.1), 0.3, 0.05, label="gloo:all_reduce", executions=200,
                        critical_ns=10**9, resource="nic"))
    pats.append(Pattern("aten::copy_", Category.MEMORY, rng.uniform(0.01, 0.02), 0.5, 0.02, label="aten::copy_", executions=300,
                        critical_ns=10**8, resource="pcie"))
    start = 1_000_000_000_000
    return PatternSet(job=job, session=session, rank=rank, world_size=world_size, host=f"node{rank // 8}",
                      window_start_ns=start, window_end_ns=start + 20 * 10**9, patterns=tuple(pats),
                      local_rank=rank % 8, pid=1000 + rank, iteration_ms=tuple(rng.uniform(90, 110) for _ in range(5)))


def workers(ranks: range | list[int], world_size: int) -> list[dict[str, object]]:
    return [{"rank": r, "local_rank": r % 8, "world_size": world_size, "pid": 1000 + r, "tid": 1000 + r,
             "host": f"node{r // 8}"} for r in ranks]


class LocalizerProcess:
    """`perftracker localizer` in a subprocess on a free port, with a ready file."""

    def __init__(self, tmp: Path, store: Path, port: int = 0, token: str = TOKEN, extra: list[str] | None = None,
                 max_body_bytes: int | None = None, nofile: int | None = None) -> None:
        self.tmp, self.store, self.port, self.token = tmp, store, port, token
        self.nofile = nofile  # RLIMIT_NOFILE (soft and hard) of the localizer process
        self.extra = list(extra or [])
        if max_body_bytes is not None:
            self.extra += ["--max-body-bytes", str(max_body_bytes)]
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, timeout_s: float = 20.0) -> str:
        ready = self.tmp / f"ready-{time.monotonic_ns()}.json"
        env = dict(os.environ, PERFTRACKER_TOKEN=self.token, PYTHONPATH=str(REPO), PERFTRACKER_DISABLE="1")
        self.log = open(self.tmp / "localizer.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "perftracker", "localizer", "--port", str(self.port), "--store", str(self.store),
             "--ready-file", str(ready), *self.extra], env=env, stdout=self.log, stderr=self.log,
            preexec_fn=self._limit if self.nofile else None)
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if ready.exists():
                self.url = json.loads(ready.read_text())["url"]
                self.port = int(self.url.rsplit(":", 1)[1])
                return self.url
            if self.proc.poll() is not None:
                raise RuntimeError(f"localizer exited with {self.proc.returncode}: "
                                   f"{(self.tmp / 'localizer.log').read_text()[-2000:]}")
            time.sleep(0.05)
        raise RuntimeError("localizer did not become ready")

    def _limit(self) -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class ServiceThread:
    """The real LocalizerService on its own event-loop thread, listening on a free port (in-process,
    so a test can look at its guard, cache and store)."""

    def __init__(self, store_path: Path, options: object | None = None, token: str = TOKEN, host: str = "127.0.0.1",
                 k8s_client: object | None = None) -> None:
        import asyncio
        import threading

        from perftracker.localizer.service.http_service import LocalizerService
        from perftracker.localizer.store.sqlite_store import Store

        self.store = Store(store_path)
        self.service = LocalizerService(self.store, token, options, k8s_client=k8s_client)  # type: ignore[arg-type]
        self.host = host
        self.url = ""
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    async def _serve(self) -> None:
        import asyncio

        self.port = await self.service.start(self.host, 0)
        scheme = "https" if self.service.options.tls_cert else "http"
        self.url = f"{scheme}://{self.host}:{self.port}"
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await self.service.stop()
            self.store.close()

    def __enter__(self) -> ServiceThread:
        self._thread.start()
        assert self._ready.wait(20), "service did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(20)
