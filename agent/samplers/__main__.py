"""The sampler process: ``python -m perftracker.agent.samplers --pid P --tid T --start-ns S --end-ns E --out FILE``.

Writes a ``SampleSet`` file. With ``--control-stdin`` it prints ``ready`` once it is sampling and
reads lines from stdin: ``start NS`` / ``end NS`` move the window bounds, ``stop`` or end of input
stops at once, ``pystacks {"path", "period_us", "layout"}`` (JSON) also samples the training thread's Python
stack from outside (agent/samplers/pystacks.py) into PATH. The worker uses this because it learns its window's real bounds only at iteration
boundaries. It also stops when the target process exits.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time

import psutil
from perftracker.agent.samplers import (
    GPU_AUTO,
    GPU_OFF,
    SamplerOptions,
    WindowBounds,
    build_samplers,
    run_samplers,
)
from perftracker.agent.samplers.procfs import CPU_SOURCES, ProcfsOptions
from perftracker.agent.samplers.pystacks import PyStackThread

from perftracker.remote_stacks import StackLayout

log = logging.getLogger("perftracker.agent.samplers")


def _gpu_index(text: str) -> int:
    if text == "auto":
        return GPU_AUTO
    if text == "off":
        return GPU_OFF
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto, off or an NVML index, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"an NVML index is >= 0, got {value}")
    return value


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m perftracker.agent.samplers", description=__doc__.splitlines()[0])
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--tid", type=int, required=True, help="OS thread id of the training thread")
    p.add_argument("--start-ns", type=int, required=True, help="CLOCK_MONOTONIC ns")
    p.add_argument("--end-ns", type=int, required=True, help="CLOCK_MONOTONIC ns")
    p.add_argument("--out", required=True)
    p.add_argument("--samplers", default="procfs,gpu,rdma",
                   help="comma list: procfs, gpu, nsys, nvml, rdma, tcp_info (opt-in: the process's own TCP connections)")
    p.add_argument("--gpu-index", type=_gpu_index, default=GPU_AUTO, metavar="auto|off|N",
                   help="the GPU to sample: auto (default) = the one the process uses (NVML's process lists, "
                        "else its CUDA_VISIBLE_DEVICES and LOCAL_RANK), off, or an NVML index")
    p.add_argument("--gpu-uuid", default="", help="the GPU the process says it uses (NVML's 'GPU-...' form); "
                   "it overrides the auto pick")
    p.add_argument("--period-us", type=int, default=1000)
    p.add_argument("--nic-peak-gbps", type=float, default=10.0)
    p.add_argument("--disk-peak-mbps", type=float, default=1000.0)
    p.add_argument("--gpu-lock-dir", default="/tmp")
    p.add_argument("--cpu-source", choices=CPU_SOURCES, default="auto",
                   help="training-thread CPU: auto = perf task-clock where permitted, else schedstat")
    p.add_argument("--control-stdin", action="store_true")
    p.add_argument("--no-realtime", action="store_true",
                   help="do not ask for SCHED_RR priority (it keeps 1 kHz sampling on a busy node)")
    return p.parse_args(argv)


def raise_priority() -> str:
    """SCHED_RR at the lowest real-time priority, else nice -10, else nothing. Returns what held.

    The sampler sleeps ~95 % of each 1 ms tick, so real-time priority costs the node almost nothing
    but keeps its ticks on time when the training job saturates the CPUs.
    """
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(os.sched_get_priority_min(os.SCHED_RR)))
        return "SCHED_RR"
    except (OSError, AttributeError):
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, 0, -10)
        return "nice -10"
    except OSError:
        return "normal"


def _control(bounds: WindowBounds, pid: int, pystacks: list[PyStackThread]) -> None:
    for line in sys.stdin:
        parts = line.split(maxsplit=1)
        try:
            if parts[:1] == ["pystacks"] and not pystacks:
                req = json.loads(parts[1])
                pystacks.append(PyStackThread(pid, str(req["path"]), int(req["period_us"]),
                                              StackLayout.from_json(json.dumps(req["layout"])), bounds))
            elif parts[:1] == ["start"]:
                bounds.set_start(int(parts[1]))
            elif parts[:1] == ["end"]:
                bounds.set_end(int(parts[1]))
            elif parts[:1] == ["stop"]:
                break
        except (IndexError, ValueError, TypeError, KeyError):
            log.warning("bad control line %r ignored", line[:200])
    else:
        log.info("control input closed")
    bounds.stop()


def _watch_pid(pid: int, bounds: WindowBounds) -> None:
    """Stop the window when the sampled process ends (a zombie has ended; a reused pid is another process)."""
    try:
        proc = psutil.Process(pid)
    except psutil.Error:
        proc = None
    while not bounds.done(time.monotonic_ns()):
        try:
            ended = proc is None or not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            ended = True
        if ended:
            log.info("process %d exited", pid)
            bounds.stop()
            return
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s: %(message)s")
    a = _parse(argv)
    opts = SamplerOptions(
        samplers=tuple(s.strip() for s in a.samplers.split(",") if s.strip()),
        procfs=ProcfsOptions(period_us=a.period_us, nic_peak_bps=a.nic_peak_gbps * 1e9, disk_peak_bps=a.disk_peak_mbps * 1e6,
                             cpu_source=a.cpu_source),
        gpu_index=a.gpu_index,
        gpu_uuid=a.gpu_uuid,
        gpu_lock_dir=a.gpu_lock_dir,
    )
    bounds = WindowBounds(a.start_ns, a.end_ns)
    if not a.no_realtime:
        log.info("scheduling: %s", raise_priority())
    samplers = build_samplers(a.pid, a.tid, opts)
    if not samplers:
        log.error("no sampler can run (pid %d, tid %d)", a.pid, a.tid)
        return 2
    threading.Thread(target=_watch_pid, args=(a.pid, bounds), daemon=True).start()
    pystacks: list[PyStackThread] = []  # started by a "pystacks" control line
    if a.control_stdin:
        threading.Thread(target=_control, args=(bounds, a.pid, pystacks), daemon=True).start()
        sys.stdout.write("ready\n")
        sys.stdout.flush()
    samples = run_samplers(samplers, bounds)
    for thread in pystacks[:1]:  # written first: the samples file's presence means both are
        thread.save()
    samples.save(a.out)
    log.info("wrote %s (%s)", a.out, ", ".join(f"{k}:{len(v.t_ns)}" for k, v in samples.series.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
