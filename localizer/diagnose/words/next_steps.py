"""Cause kinds: a short name for a finding's headline and what to check next, keyed by cause.

A finding's likely cause is the clause after the dash of its sentence (``explain._cause``, a rule's
``hint`` in expected.toml, the group findings' sentences). ``cause_kind`` reads the kind from that
clause and the function: the first row of ``CAUSES`` whose pattern matches. A new cause plugs in
as one row: its kind, the words the headline ends with, its pattern, and its next steps. Pure data
and string matching; no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Cause:
    """One cause kind: ``phrase`` ends a finding's headline; ``steps`` are what to check next."""

    kind: str
    phrase: str
    pattern: re.Pattern[str]  # matched against the finding's cause clause and its function key
    steps: tuple[str, ...]


def _c(kind: str, phrase: str, pattern: str, *steps: str) -> Cause:
    return Cause(kind, phrase, re.compile(pattern, re.IGNORECASE), steps)


# first match wins: specific causes before the general ones
CAUSES: tuple[Cause, ...] = (
    _c("stage_imbalance", "pipeline stage imbalance", r"^pipeline stage|pipeline stage imbalance",
       "compare the layers assigned to each pipeline stage (the partition), incl. embedding and loss on the last",
       "rebalance the stages' layers, or use interleaved / virtual pipeline stages",
       "check the heavy stage's hosts for slower GPUs (clocks, `nvidia-smi -q -d PERFORMANCE`)"),
    _c("moving_straggler", "no single culprit", r"no single culprit|moving imbalance",
       "compare the ranks' batch shapes or sequence lengths step by step (variable-length inputs)",
       "bucket or pack samples by length so that ranks get equal work",
       "look for jitter shared by all hosts: OS noise, garbage collection, checkpointing"),
    _c("slow_processor", "slow or throttled processor", r"^slow or throttled",
       "clocks and thermal throttling: `nvidia-smi -q -d PERFORMANCE` (GPU), `turbostat` or `cpupower frequency-info`",
       "other processes on the device: `nvidia-smi`, `top`",
       "compare the host's hardware and driver with a healthy rank's"),
    _c("throttled_gpu", "throttled GPU", r"throttled gpu|gpu (sm )?clock|throttle reason",
       "GPU clocks and throttle reasons: `nvidia-smi -q -d PERFORMANCE,CLOCK` on the rank's host",
       "temperatures and power: `nvidia-smi -q -d TEMPERATURE,POWER`; the host's cooling",
       "compare with a healthy host (`nvidia-smi --query-gpu=clocks.sm,clocks.max.sm --format=csv`)"),
    _c("cpu_starvation", "CPU starvation", r"starv|runnable, no core|cpu contention|other processes",
       "the cgroup's CPU throttling: `cat /sys/fs/cgroup/cpu.stat` (nr_throttled, throttled_usec)",
       "other processes on the rank's cores: `top -H`, `ps -eLo psr,pcpu,comm | sort -k2 -nr | head`",
       "the job's CPU request/limit and its dataloader worker count against the host's cores"),
    _c("load_imbalance", "load imbalance", r"more work or a (?P<device>slower \w+)|load imbalance|more work",
       "compare the ranks' batch shapes or sequence lengths (the sampler, padding, packing)",
       "check that every rank runs the same model code path (data-dependent branches, MoE routing)",
       "if the inputs are equal: the rank's clocks and throttling (`nvidia-smi -q -d PERFORMANCE` on a GPU, "
       "`cpupower frequency-info` on a CPU)"),
    _c("pcie_fallback", "NVLink falls back to PCIe", r"fall(s|ing)? back from nvlink",
       "the GPUs' links: `nvidia-smi topo -m` (NV# between the GPUs, not PHB/SYS), `nvidia-smi nvlink -s`",
       "peer-to-peer settings: `NCCL_P2P_DISABLE`, `NCCL_P2P_LEVEL`; ACS/IOMMU on the host (`lspci -vvv | grep ACS`)",
       "NCCL's chosen transport: `NCCL_DEBUG=INFO` (P2P/CUMEM vs SHM)"),
    _c("slow_copy", "slow host-device copies", r"copies|pcie|unpinned",
       "pinned memory: `DataLoader(pin_memory=True)` and `.to(device, non_blocking=True)`",
       "the PCIe link: `nvidia-smi -q | grep -A2 'Link Width'` (generation and width) on the rank's host",
       "peer copies falling back from NVLink: `nvidia-smi topo -m`"),
    _c("slow_link", "slow link", r"interconnect|\bnics?\b|nvlink|retransmi|\blinks?\b|network(?! utilization)",
       "the NIC's error counters: `ethtool -S <nic>` (drops, CRC errors), `ibstat`, `perfquery`",
       "NCCL's transport: `NCCL_DEBUG=INFO` (IB vs sockets, the chosen interface)",
       "the host's link speed and cabling against a healthy rank's (`ibstat` rate, `ethtool <nic>`)"),
    _c("host_bound", "host-bound", r"host-bound|gpu waits for the host|host-side work",
       "the dataloader workers and pinned memory (`num_workers`, `pin_memory=True`)",
       "fewer, larger kernels: CUDA graphs (`torch.cuda.graphs`), `torch.compile`",
       "Python between kernels: `perftracker export-trace` and look at the host thread between launches"),
    _c("input_pipeline", "slow input pipeline", r"input pipeline|data loading|dataloader|storage",
       "the DataLoader: more `num_workers`, `persistent_workers=True`, `prefetch_factor`",
       "the storage the rank reads from: its throughput and latency (`iostat -x 1`)",
       "per-sample preprocessing cost: move it offline or onto the GPU"),
    _c("sleep", "a sleep on the critical path", r"sleeps",
       "the sleeping call: `perftracker export-trace` for the rank, or its stack (`py-spy dump --pid`)",
       "retry loops, polling and rate limiters in the training loop"),
    _c("outside_profile", "cause outside the profile", r"not among the profiled|starts late",
       "the rank's host: other processes or CPU contention on its cores (`top -H`, the cgroup's `cpu.stat`)",
       "work before the step or outside the traced threads on that rank (logging, evaluation, saving)",
       "a longer window or `perftracker export-trace --rank R` to see what the rank does before the collective"),
    _c("host_stall", "host stall", r"stalls outside the traced ops",
       "the rank's host thread: blocking calls, I/O, locks, logging or checkpoint writes (`py-spy dump --pid`)",
       "work before the step on that rank only (rank-0-only logging, evaluation, saving)",
       "other threads or processes on the rank's cores (`top -H`)"),
    _c("late_arrival", "arrives last at the collective", r"arrive[s]? last",
       "what the rank does before the collective that the others do not (`perftracker export-trace --rank R`)",
       "its inputs and its host (clocks, other processes)"),
    _c("random_pattern", "random per-worker pattern", r"random per-worker|varying from worker",
       "garbage collection: `gc.freeze()` after setup, or `gc.disable()` with periodic `gc.collect()`",
       "OS noise on the hosts: other processes, interrupts, frequency scaling"),
    _c("python_work", "Python work on the critical path", r"python work",
       "the Python frames in the evidence: profile them (`py-spy record --pid`)",
       "move per-step Python work (logging, metrics, `.item()` syncs) off the critical path"),
    _c("unusual", "unusual behavior", r"unusual",
       "compare the rank's host with a healthy one: hardware, driver, clocks, other processes"),
)

UNKNOWN = Cause("unknown", "", re.compile(r"(?!)"),
                ("compare the flagged ranks' hosts and inputs with the others'",
                 "export the rank's window (`perftracker export-trace --rank R`) and look at the function"))

_BY_KIND = {c.kind: c for c in CAUSES}


def cause_kind(cause_text: str, key: str = "") -> str:
    """The kind of a finding's likely cause, from its cause clause (and function key); "unknown"."""
    for c in CAUSES:
        if c.pattern.search(cause_text) or (key and c.pattern.search(key) and c.kind in _KEY_KINDS):
            return c.kind
    return UNKNOWN.kind


# kinds that a function key alone names (a stage or moving finding's key; data loading frames)
_KEY_KINDS = frozenset({"stage_imbalance", "moving_straggler"})


def cause_phrase(kind: str, cause_text: str) -> str:
    """The words a headline ends with: the kind's phrase, or what its clause leaves open ("more work
    or a slower GPU": β alone cannot tell the two apart)."""
    c = cause_of(kind)
    m = c.pattern.search(cause_text)
    if m is not None and m.groupdict().get("device"):
        return f"more work or a {m.group('device')}"
    return c.phrase


def cause_of(kind: str) -> Cause:
    return _BY_KIND.get(kind, UNKNOWN)


# what to check first for a function whose name says where the time went, before its cause's steps
# (a host-bound optimizer step is not a dataloader question); first match wins
FUNCTION_STEPS: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p, re.IGNORECASE), step) for p, step in (
    (r"optimizer\.step|\bAdam|\bSGD\b|Adagrad|zero_grad",
     "the optimizer step on the host: a fused or foreach optimizer (`fused=True`, `foreach=True`), "
     "fewer parameter tensors"),
    (r"python gc|garbage collect|\bgc\b",
     "garbage collection: `gc.freeze()` after setup, fewer short-lived Python objects per step"),
    (r"\bsleep\b|time\.sleep",
     "who calls sleep in the training loop (`py-spy dump --pid <pid>` on the rank)"),
))


def next_steps(kind: str, label: str = "") -> tuple[str, ...]:
    """What to check next for a cause kind (the unknown cause's generic steps for an unknown kind),
    led by a step for the function itself where its name says where the time went."""
    steps = cause_of(kind).steps
    first = next((step for pattern, step in FUNCTION_STEPS if label and pattern.search(label)), None)
    return steps if first is None or first in steps else (first, *steps)
