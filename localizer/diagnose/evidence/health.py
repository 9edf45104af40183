"""Hardware health findings (issue 34): a throttled GPU from its clocks and throttle reasons, a slow
InfiniBand port from ``port_xmit_wait``. Pure functions over the pattern arrays; the wording of
these findings lives here, apart from the general sentences (``explain``).

The summarizer writes the health patterns (agent/summarize/hardware.py); the localizer judges them
like functions (expected range, differential test). Here:

- ``evidence_only``: a throttle-reason pattern is evidence for the clock finding, never a finding.
- A health finding is made only on ranks outside the healthy range (``expected.toml``): its β is
  its category's time, not a signal of its own, so the differential test alone never makes one.
- ``health_excess``: what a health finding costs, as a share of the window: a stated estimate. The
  clock: the compute time the rank would save at its peers' clock (kernels that scale with the
  clock), β × (1 - μ / median μ), but no more than its compute holds over the median rank's
  (β - median β): a GPU whose kernels kept their time at the lower clock is found, and costs
  nothing. The port: the share of the rank's collective time its port was stalled beyond the
  median rank's, β × (μ - median μ).
- ``health_text``: the finding's label (a throttled GPU's facts, ``perftracker.model.hardware.clock_label``)
  and sentence, e.g. "rank 5: GPU at 1.10 of 1.98 GHz (thermal slowdown) …".

NOT VERIFIED ON HARDWARE: the clock and port series are built against NVML's and sysfs's formats.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from perftracker.localizer.diagnose.method.arrays import PatternArrays
from perftracker.localizer.diagnose.words.explain import describe_ranks, pct, waits_text

from perftracker.model import LINK_KEY, Triple, Wait
from perftracker.model.hardware import (
    EXCESS_CLOCK,
    EXCESS_SHARE,
    GPU_CLOCK_KEY,
    P2P_PCIE_KEY,
    REASON_KEY_PREFIX,
    SIGNAL_OF_KEY,
    ClockFacts,
    clock_label,
    max_ghz_of_label,
)

# the signals whose sentence is written here (the host link's: explain.py, with the waits it causes)
WORDED_KEYS = frozenset(k for k in SIGNAL_OF_KEY if k != LINK_KEY)
REASON_SHARE_MIN = 0.25  # a throttle reason is named when it held in at least this share of the samples


def evidence_only(key: str) -> bool:
    return key.startswith(REASON_KEY_PREFIX)


def health_excess(key: str, observed: Triple, median: Triple) -> float | None:
    """The finding's own cost (share of the window) for a health pattern, priced as its signal's row
    says (perftracker/model/hardware.py ``SIGNALS``); None for other keys."""
    spec = SIGNAL_OF_KEY.get(key)
    if spec is None:
        return None
    if spec.excess == EXCESS_CLOCK:
        if median.mu <= 0:
            return 0.0
        by_clock = observed.beta * (1.0 - observed.mu / median.mu)
        # bounded by what the rank's compute measurably holds over its peers': kernels that kept their
        # time at the lower clock (memory- or latency-bound) cost the step nothing (throttled-gpu-r5)
        return max(min(by_clock, observed.beta - median.beta), 0.0)
    if spec.excess == EXCESS_SHARE:
        return max(observed.beta * (observed.mu - median.mu), 0.0)
    return None


def clock_facts(arr: PatternArrays, f: int, idx: np.ndarray) -> ClockFacts:
    """The clock (median over the finding's workers), the GPU's maximum and the reasons that held."""
    max_ghz = max_ghz_of_label(arr.functions[f].label)
    mu = float(np.median(arr.values[f, 1, idx])) if idx.size else 0.0
    reasons: list[tuple[float, str]] = []
    for g, info in enumerate(arr.functions):
        if evidence_only(info.key):
            share = float(np.median(arr.values[g, 1, idx])) if idx.size else 0.0
            if share >= REASON_SHARE_MIN:
                reasons.append((share, info.key[len(REASON_KEY_PREFIX):]))
    return ClockFacts(mu * max_ghz, max_ghz, tuple(r for _, r in sorted(reasons, key=lambda x: -x[0])))


def health_text(key: str, arr: PatternArrays, f: int, idx: np.ndarray, ranks: Sequence[int],
                observed: Triple, median: Triple, expected_mu: tuple[float, float], hint: str,
                waits: Sequence[Wait] = ()) -> tuple[str, str]:
    """(label, sentence) of a health finding (``key`` in ``WORDED_KEYS``), with the waits it causes."""
    after = waits_text(waits, "it" if len(ranks) == 1 else "them", arr.n_workers)
    who = describe_ranks(list(ranks), arr.n_workers)
    if key == GPU_CLOCK_KEY:
        facts = clock_facts(arr, f, idx)
        label = clock_label(facts) if facts.max_clock_ghz > 0 else arr.functions[f].label
        at = (f"{facts.clock_ghz:.2f} of {facts.max_clock_ghz:.2f} GHz" if facts.max_clock_ghz > 0
              else f"{pct(observed.mu)} of its maximum clock")
        why = f" ({', '.join(facts.reasons)})" if facts.reasons else ""
        peers = f"{pct(median.mu)} on the median rank" if median.mu > 0 else "no clock on the other ranks"
        text = (f"{who}: GPU at {at}{why} while compute holds {pct(observed.beta)} of the window "
                f"(expected ≥ {pct(expected_mu[0])} of the maximum; {peers})")
        return label, f"{text} — {hint or SIGNAL_OF_KEY[key].cause}{after}"
    if key == P2P_PCIE_KEY:
        text = (f"{who}: {pct(observed.mu)} of its peer traffic inside the host went over PCIe, not NVLink "
                f"(expected ≤ {pct(expected_mu[1])}, median rank {pct(median.mu)}) while collectives hold "
                f"{pct(observed.beta)} of the window")
        return arr.functions[f].label, f"{text} — {hint or SIGNAL_OF_KEY[key].cause}{after}"
    text = (f"{who}: InfiniBand port stalled {pct(observed.mu)} of its active time (port_xmit_wait; expected "
            f"≤ {pct(expected_mu[1])}, median rank {pct(median.mu)}) while collectives hold "
            f"{pct(observed.beta)} of the window")
    return arr.functions[f].label, f"{text} — {hint or SIGNAL_OF_KEY[key].cause}{after}"
