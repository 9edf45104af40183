"""A multi-node torchrun job as a user runs it, on emulated nodes (issue 42): tests/system/test_multinode.py
and bench/multinode.py.

Each node is a network namespace on a bridge (bench/faultkit/hosts.py) with its own UTS namespace
(host name ``node<i>``), its own temp dir (so its own perftracker run dir and node agent) and its own
working directory (so its own ``./perftracker-runs/``). One ``torchrun --nnodes N --node_rank i``
per node runs perftracker/examples/train.py, which does ``import perftracker`` and nothing else:
no agent, no localizer and no URL is started or passed by the test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from bench.faultkit.hosts import EmulatedHosts, Host
from bench.faultkit.job import _free_port

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "perftracker" / "examples" / "train.py"


class Node:
    def __init__(self, job: MultiNodeJob, host: Host, root: Path) -> None:
        self.job, self.host, self.root = job, host, root
        self.index = host.index
        self.name = f"node{host.index}"
        self.tmp = root / "tmp"
        self.work = root / "work"
        self.tmp.mkdir(parents=True)
        self.work.mkdir(parents=True)
        self.log = root / "train.log"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PERFTRACKER_")}
        env.update(self.job.extra_env)
        env.update(TMPDIR=str(self.tmp), GLOO_SOCKET_IFNAME="eth0", PYTHONUNBUFFERED="1")
        return env

    def wrap(self, argv: list[str]) -> list[str]:
        """argv run on this node: its network namespace, its host name."""
        return self.host.wrap(["unshare", "--uts", "sh", "-c", f'hostname {self.name} && exec "$@"', "sh", *argv])

    def run(self, argv: list[str], timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        """A command on this node, in its working directory (e.g. ``perftracker report latest``)."""
        return subprocess.run(self.wrap(argv), cwd=self.work, env=self.env(), capture_output=True, text=True,
                              timeout=timeout_s)

    @property
    def run_dir(self) -> Path:
        return self.tmp / f"perftracker-{os.getuid()}"

    def agent_pid(self) -> int | None:
        try:
            return int(json.loads((self.run_dir / "agent.json").read_text())["pid"])
        except (OSError, ValueError, KeyError):
            return None


class MultiNodeJob:
    """``nodes`` x ``per_node`` workers of train.py; ``script_args`` go to every rank."""

    def __init__(self, root: Path, nodes: int, per_node: int, script_args: list[str],
                 extra_env: dict[str, str] | None = None) -> None:
        self.root = root
        self.n, self.per_node = nodes, per_node
        self.script_args = script_args
        self.extra_env = extra_env or {}
        self.progress = root / "progress"
        self.progress.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        self.job = f"train-{self.port}"  # perftracker's default job id: script name and rendezvous port
        self._hosts = EmulatedHosts(nodes)
        self.nodes: list[Node] = []
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> MultiNodeJob:
        self._hosts.__enter__()
        try:
            self.nodes = [Node(self, h, self.root / f"node{h.index}") for h in self._hosts.hosts]
            master = self.nodes[0].host.addr
            for node in self.nodes:
                cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(self.n), "--node_rank",
                       str(node.index), "--nproc_per_node", str(self.per_node), "--master_addr", master,
                       "--master_port", str(self.port), str(TRAIN), "--quiet", "--progress-dir",
                       str(self.progress), *self.script_args]
                with open(node.log, "wb") as out:
                    self.procs.append(subprocess.Popen(node.wrap(cmd), cwd=node.work, env=node.env(), stdout=out,
                                                       stderr=subprocess.STDOUT, start_new_session=True))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 20
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for node in self.nodes:  # the autostarted agents (their own sessions): end them too
            pid = node.agent_pid()
            try:
                agent = psutil.Process(pid) if pid is not None else None
                for p in [agent, *agent.children(recursive=True)] if agent is not None else []:
                    p.kill()
            except psutil.Error:
                pass
        self._hosts.__exit__()

    def iteration(self, rank: int) -> int:
        try:
            return int((self.progress / f"rank{rank}.iter").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return -1

    def wait_iterations(self, n: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        world = self.n * self.per_node
        while time.monotonic() < deadline:
            if all(self.iteration(r) >= n for r in range(world)):
                return
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.5)
        raise AssertionError(f"not every rank reached iteration {n}: "
                             f"{[self.iteration(r) for r in range(world)]}\n{self.logs()}")

    def wait_linked(self, timeout_s: float = 60.0) -> None:
        """Until every other node's agent knows the job's localizer (its ``jobs/<job>.json``)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all((n.work / "perftracker-runs" / "jobs" / f"{self.job}.json").exists() for n in self.nodes[1:]):
                return
            time.sleep(0.5)
        raise AssertionError(f"the other nodes did not learn the job's localizer in {timeout_s:.0f} s\n{self.logs()}")

    def logs(self) -> str:
        out = []
        for node in self.nodes:
            text = node.log.read_text(errors="replace") if node.log.exists() else ""
            agent = node.run_dir / "agent.log"
            atext = agent.read_text(errors="replace") if agent.exists() else ""
            out.append(f"--- {node.name} train.log (tail)\n{text[-3000:]}\n--- {node.name} agent.log (tail)\n"
                       f"{atext[-3000:]}")
        return "\n".join(out)

    def report_json(self, node: int, session: str = "latest") -> dict[str, Any]:
        res = self.nodes[node].run(["perftracker", "report", session, "--format", "json"])
        assert res.returncode == 0, f"report on node{node}: {res.stderr}\n{self.logs()}"
        return dict(json.loads(res.stdout))
