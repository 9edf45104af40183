"""Hardware health: the series names the GPU and RDMA samplers write, and the health patterns the
summarizer derives from them (issue 34). Pure data and text, no I/O.

Series (``SampleSet`` keys, every value in [0, 1]):

- ``sm_clock``: the SM clock over its maximum (NVML ``nvmlDeviceGetClockInfo`` /
  ``nvmlDeviceGetMaxClockInfo``, ``NVML_CLOCK_SM``); the series' ``source`` carries the maximum as
  ``"nvml max_mhz=1980"`` (``clock_source`` / ``max_mhz_of``).
- ``throttle_thermal``, ``throttle_power``, ``throttle_sw``: 1 while NVML's clock-throttle reasons
  (``nvmlDeviceGetCurrentClocksThrottleReasons``) hold a reason of that class, else 0.
- ``power``: power draw over the enforced power limit.
- ``ib_xmit_wait``: the share of the interval the rank's InfiniBand port had data and could not send
  (``port_xmit_wait`` ticks × tick length / interval); ``ib_link_errors``: 1 when ``symbol_error``,
  ``link_downed``, ``link_error_recovery`` or ``port_rcv_errors`` grew in the interval.

Health patterns (one per worker, judged like any function, ``LINK_KEY`` is the first of the kind):

- ``GPU_CLOCK_KEY`` (compute): β the worker's compute share of the critical path, μ/σ the SM clock
  over its maximum while compute kernels hold it; its label names the maximum, the same on every
  rank of one GPU model: "GPU SM clock (max 1.98 GHz)" (``max_label`` / ``max_ghz_of_label``).
- ``reason_key(text)`` (compute), one per throttle reason class: μ the share of those samples in
  which the reason held. Evidence for the clock finding, never a finding of its own.
- ``IB_WAIT_KEY`` (collective): β the worker's collective share, μ/σ the port's xmit-wait share.
- ``P2P_PCIE_KEY`` (collective): β the worker's collectives inside its host, μ the share of their
  link traffic that went over PCIe rather than NVLink (a PCIe fallback: NVLink down, P2P disabled).

A throttled-GPU finding's label carries its facts: "GPU SM clock 1.10 of 1.98 GHz (thermal
slowdown)" (``clock_label``; ``parse_clock_label`` reads them back as ``ClockFacts``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SM_CLOCK = "sm_clock"
THROTTLE_THERMAL = "throttle_thermal"
THROTTLE_POWER = "throttle_power"
THROTTLE_SW = "throttle_sw"
THROTTLE_SERIES = (THROTTLE_THERMAL, THROTTLE_POWER, THROTTLE_SW)
POWER = "power"
IB_XMIT_WAIT = "ib_xmit_wait"
IB_LINK_ERRORS = "ib_link_errors"
NVLINK = "nvlink"  # NVLink throughput over its peak (NVML), and
PCIE = "pcie"  # PCIe throughput over its peak: the P2P pattern compares the two

GPU_CLOCK_KEY = "GPU SM clock (share of its maximum)"
REASON_KEY_PREFIX = "GPU throttle reason: "
IB_WAIT_KEY = "InfiniBand port wait (port_xmit_wait)"
P2P_PCIE_KEY = "Peer traffic over PCIe (not NVLink)"

# what each throttle series means in a sentence
THROTTLE_TEXT = {THROTTLE_THERMAL: "thermal slowdown", THROTTLE_POWER: "power cap", THROTTLE_SW: "software slowdown"}


def reason_key(text: str) -> str:
    """The pattern key of one throttle reason class ("thermal slowdown" -> "GPU throttle reason: thermal slowdown")."""
    return REASON_KEY_PREFIX + text


def max_label(max_ghz: float) -> str:
    """The clock pattern's label: "GPU SM clock (max 1.98 GHz)"; the key when the maximum is unknown."""
    return f"GPU SM clock (max {max_ghz:.2f} GHz)" if max_ghz > 0 else GPU_CLOCK_KEY


def max_ghz_of_label(label: str) -> float:
    """The maximum ``max_label`` wrote; 0.0 for any other label."""
    m = re.match(r"^GPU SM clock \(max ([0-9.]+) GHz\)$", label)
    return float(m.group(1)) if m else 0.0


def clock_source(sampler: str, max_mhz: float) -> str:
    """The ``source`` of an ``sm_clock`` series: the sampler and the GPU's maximum SM clock."""
    return f"{sampler} max_mhz={max_mhz:g}"


def max_mhz_of(source: str) -> float:
    """The maximum SM clock a ``sm_clock`` series' source names; 0.0 when it names none."""
    m = re.search(r"max_mhz=([0-9.]+)", source)
    return float(m.group(1)) if m else 0.0


@dataclass(frozen=True)
class ClockFacts:
    """What a throttled-GPU finding shows: the clock while compute ran, its maximum, the reasons."""

    clock_ghz: float
    max_clock_ghz: float
    reasons: tuple[str, ...] = ()  # THROTTLE_TEXT values, most frequent first

    def to_dict(self) -> dict[str, object]:
        return {"clock_ghz": round(self.clock_ghz, 3), "max_clock_ghz": round(self.max_clock_ghz, 3),
                "throttle_reasons": list(self.reasons)}


def clock_label(facts: ClockFacts | None) -> str:
    """"GPU SM clock 1.10 of 1.98 GHz (thermal slowdown)"; the key when the maximum is unknown."""
    if facts is None or facts.max_clock_ghz <= 0:
        return GPU_CLOCK_KEY
    why = f" ({', '.join(facts.reasons)})" if facts.reasons else ""
    return f"GPU SM clock {facts.clock_ghz:.2f} of {facts.max_clock_ghz:.2f} GHz{why}"


_CLOCK_LABEL = re.compile(r"^GPU SM clock (?P<c>[0-9.]+) of (?P<m>[0-9.]+) GHz(?: \((?P<r>[^)]*)\))?$")


def parse_clock_label(label: str) -> ClockFacts | None:
    """The facts ``clock_label`` wrote; None for any other label."""
    m = _CLOCK_LABEL.match(label)
    if m is None:
        return None
    reasons = tuple(r.strip() for r in (m.group("r") or "").split(",") if r.strip())
    return ClockFacts(float(m.group("c")), float(m.group("m")), reasons)


def _link_key() -> str:
    from perftracker.model.patterns import LINK_KEY

    return LINK_KEY


def _tcp_retrans() -> str:
    from perftracker.model.raw_window import TCP_RETRANS

    return TCP_RETRANS


# ------------------------------------------------------------------------------------------------
# The hardware signals, one row each (issue 48): every layer keys its part of a signal by its row.
# A new signal is a new row here, then one part per layer, each found by this row: the sampler
# that writes ``series`` (agent/samplers/``sampler``), the summarizer's health pattern of key
# ``pattern_key`` (agent/summarize/), its price in the localizer (``excess``:
# localizer/diagnose/evidence/health.py ``health_excess``) and its words (``cause``, and the
# evidence's sentence: health.py ``health_text``, or explain.py for the host link).
# tests/unit/test_hardware_signals.py checks that every row is complete and every layer has its part.
# ------------------------------------------------------------------------------------------------
EXCESS_CLOCK = "clock"  # β × (1 − μ / median μ), at most β − median β: compute lost to a lower clock
EXCESS_SHARE = "share"  # β × (μ − median μ): the rank's collective time stalled beyond its peers'
EXCESS_FUNCTION = "function"  # priced like any function (the finding's general impact)
EXCESSES = (EXCESS_CLOCK, EXCESS_SHARE, EXCESS_FUNCTION)


@dataclass(frozen=True)
class SignalSpec:
    """One hardware signal, from the sampler to the report's words."""

    name: str  # short id
    series: tuple[str, ...]  # the SampleSet series its sampler writes (every value in [0, 1])
    sampler: str  # the module under agent/samplers/ that writes them
    pattern_key: str  # the health pattern the summarizer derives from them
    category: str  # the pattern's category (perftracker.model.Category value)
    link: bool  # a link's health: β is the rank's collective time, it takes the collectives' waits
    excess: str  # how a finding of it is priced (EXCESSES)
    cause: str  # the finding's cause in words, when the rule gives no hint


SIGNALS: tuple[SignalSpec, ...] = (
    SignalSpec("gpu_clock", (SM_CLOCK, *THROTTLE_SERIES), "nvml", GPU_CLOCK_KEY, "compute", False, EXCESS_CLOCK,
               "throttled GPU: its SM clock is below its maximum"),
    SignalSpec("ib_wait", (IB_XMIT_WAIT, IB_LINK_ERRORS), "rdma", IB_WAIT_KEY, "collective", True, EXCESS_SHARE,
               "slow or congested InfiniBand link at this port"),
    SignalSpec("p2p_pcie", (NVLINK, PCIE), "nvml", P2P_PCIE_KEY, "collective", True, EXCESS_SHARE,
               "peer traffic falls back from NVLink to PCIe"),
    SignalSpec("host_link", (_tcp_retrans(),), "tcp", _link_key(), "collective", True, EXCESS_FUNCTION,
               "slow link: TCP retransmits segments"),
)
SIGNAL_OF_KEY = {s.pattern_key: s for s in SIGNALS}

# health patterns of a link: β is the rank's collective time, not a function of its own; a bad link
# slows every collective through it (the localizer gives it the waits of the collectives)
LINK_KEYS = frozenset(s.pattern_key for s in SIGNALS if s.link)
# every health pattern: judged like a function, never a wait, never a cause of lateness by itself
HEALTH_KEYS = frozenset(SIGNAL_OF_KEY)

# the throttle-reason evidence patterns are health patterns too
HEALTH_KEYS = HEALTH_KEYS | {reason_key(t) for t in THROTTLE_TEXT.values()}


def is_health(key: str) -> bool:
    """A hardware health pattern (its β is its category's time, not a function's): left out of every
    sum over a rank's functions (its compute, its own work, its step lanes)."""
    return key in HEALTH_KEYS or key.startswith(REASON_KEY_PREFIX)
