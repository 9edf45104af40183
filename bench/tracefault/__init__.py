"""Trace-level fault injection for GPU jobs: re-time a set of per-rank Kineto traces with a
dependency-respecting forward pass, with or without injected faults (see graph.py, build.py,
faults.py; CLI: ``python -m bench.tracefault``)."""

from bench.tracefault.faults import KINDS, GpuFault
from bench.tracefault.mutate import MutationResult, mutate_dir, retime

__all__ = ["KINDS", "GpuFault", "MutationResult", "mutate_dir", "retime"]
