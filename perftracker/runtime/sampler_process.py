"""The worker side of a sampler process it runs itself (``python -m perftracker.agent.samplers``).

Used when there is no node agent: the window spawns the sampler when it is armed, waits for its
``ready`` line before opening (so samples cover the whole window), and moves its bounds over
stdin (``start NS`` / ``end NS``) as it learns them at iteration boundaries. Closing stdin stops it.
Only the subprocess command line ties this module to ``agent``; nothing is imported from there.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from perftracker.role import SAMPLER, child_env

log = logging.getLogger(__name__)



class SamplerProcess:
    def __init__(self, proc: subprocess.Popen[str], out: Path) -> None:
        self.proc = proc
        self.out = out
        self.ready = False
        self._lock = threading.Lock()
        threading.Thread(target=self._read, name="perftracker-sampler-reader", daemon=True).start()

    @classmethod
    def spawn(cls, pid: int, tid: int, window_s: float, out: Path, extra_args: Sequence[str] = (),
              cpus: Sequence[int] = ()) -> SamplerProcess:
        now = time.monotonic_ns()
        # Generous provisional end: the real one comes over stdin when the window stops.
        provisional_end = now + int((2 * window_s + 120) * 1e9)
        env = child_env(SAMPLER)
        cmd = [sys.executable, "-m", "perftracker.agent.samplers", "--pid", str(pid), "--tid", str(tid),
               "--start-ns", str(now), "--end-ns", str(provisional_end), "--out", str(out),
               "--control-stdin", *extra_args]
        log_path = out.with_name(out.name + ".log")
        with open(log_path, "w") as log_fh:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_fh,
                                    text=True, env=env, close_fds=True)
        if cpus:  # off the training process's CPUs (WindowOptions.helper_cpus)
            try:
                os.sched_setaffinity(proc.pid, set(cpus))
            except OSError as exc:
                log.debug("perftracker: sampler affinity %s not set: %s", cpus, exc)
        return cls(proc, out)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip() == "ready":
                self.ready = True

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, line: str) -> None:
        with self._lock:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(line + "\n")
                self.proc.stdin.flush()
            except (OSError, ValueError) as exc:
                log.warning("perftracker: sampler process gone (%s)", exc)

    def finish(self, timeout_s: float = 30.0) -> Path | None:
        """Wait for the sampler to pass the window's end and write its file."""
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("perftracker: sampler process did not finish in %.0f s; stopping it", timeout_s)
            self.close()
            return None
        if self.proc.returncode != 0 or not self.out.exists():
            log.warning("perftracker: sampler process exited %s; see %s.log", self.proc.returncode, self.out)
            return None
        return self.out

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop it now (closing stdin), and reap it (killed after ``timeout_s``)."""
        with self._lock:
            try:
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
