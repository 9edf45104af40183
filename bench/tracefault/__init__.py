"""Trace-level fault injection for GPU jobs: re-time a set of per-rank Kineto traces with a
dependency-respecting forward pass, with or without injected faults (graph.py, build.py,
faults.py, mutate.py; CLI: ``python -m bench.tracefault``).

Nothing is imported here, so that ``python -m bench.tracefault`` can switch perftracker's
import-time activation off before perftracker loads (this is not a training process)."""
