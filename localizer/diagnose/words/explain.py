"""Plain-English sentences for findings and reports. Pure functions over numbers; no analysis."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from perftracker.localizer.diagnose.evidence.host_bound import HOST_KEY, IDLE_KEY, is_host_op

from perftracker.model import LINK_KEY, Box, Category, Triple, Wait, compress_ranks
from perftracker.model.shares import pct as pct  # re-exported: the words import pct from here too

_DATA_LOADING = re.compile(r"(?i)dataloader|_next_data|dataset|collate|fetch|prefetch|pin_memory")
_SLEEP = re.compile(r"(?i)\bsleep\b|nanosleep")
_RESOURCE_NAMES = {
    "sm": "SM", "cpu": "CPU", "pcie": "PCIe", "nic": "network", "nvlink": "NVLink", "hbm": "memory-bandwidth",
    "dram": "memory-bandwidth", "disk": "disk",
}
_MAX_RANK_TEXT = 40
# a Python frame as the summarizer labels it: "/abs/path/to/file.py(123): function"
_FRAME = re.compile(r"^(?P<path>.+?)\((?P<line>\d+)\): (?P<fn>.+)$")
_PATH_ANCHORS = ("site-packages/", "dist-packages/", "/lib/python3")


def frame_text(label: str) -> str:
    """A Python frame label for a sentence: "_engine_run_backward (torch/autograd/graph.py:966)".

    Installed packages are shown from their package root, other files with their parent folder, so
    a sentence stays readable without losing where the function is. Non-frame labels pass through.
    """
    m = _FRAME.match(label)
    if m is None:
        return label
    path = m.group("path")
    for anchor in _PATH_ANCHORS:
        i = path.find(anchor)
        if i >= 0:
            path = path[i + len(anchor):]
            if anchor == "/lib/python3":
                path = path.split("/", 1)[-1]
            break
    else:
        path = "/".join(path.split("/")[-2:])
    return f"{m.group('fn')} ({path}:{m.group('line')})"


@dataclass(frozen=True)
class Consequence:
    """A differential-only effect on the same workers that the finding explains (they wait less there)."""

    label: str
    beta_ratio: float


def describe_ranks(ranks: Sequence[int], n_workers: int) -> str:
    """"rank 3", "ranks 0-3,7", "all ranks", or "300 of 2,560 ranks (3, 17, 25, …)"."""
    n = len(ranks)
    if n == n_workers and n > 1:
        return "all ranks"
    if n == 1:
        return f"rank {ranks[0]}"
    text = compress_ranks(ranks)
    if len(text) <= _MAX_RANK_TEXT:
        return f"ranks {text}"
    head = ", ".join(str(r) for r in sorted(ranks)[:3])
    return f"{n:,} of {n_workers:,} ranks ({head}, …)"


def describe_function(label: str, key: str, category: Category, gpu: bool) -> str:
    if category is Category.COMPUTE:
        return f"compute kernel {label}" if gpu else f"compute op {label}"
    if category is Category.MEMORY:
        return f"memory op {label}"
    if category is Category.COLLECTIVE:
        return f"collective {label}"
    if key == IDLE_KEY:
        return "a stall outside traced ops (no kernel ran and the host recorded nothing)"
    where = " in data loading" if _DATA_LOADING.search(key) else ""
    if gpu and is_host_op(key, label, category):
        return f"host op {label}{where}"
    return f"Python {frame_text(label)}{where}"


def resource_name(resource: str, category: Category, gpu: bool) -> str:
    if resource:
        return _RESOURCE_NAMES.get(resource.lower(), resource)
    if category is Category.COMPUTE:
        return "SM" if gpu else "CPU"
    return "CPU" if category is Category.PYTHON else "resource"


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def _range_text(lo: float, hi: float) -> str:
    if lo <= 0:
        return f"≤ {pct(hi)}"
    if hi >= 1:
        return f"≥ {pct(lo)}"
    return f"{pct(lo)}–{pct(hi)}"


def _cause(category: Category, label: str, key: str, resource: str, beta_up: bool, beta_down: bool,
           mu_down: bool, mu_up: bool, gpu: bool) -> str:
    device = "GPU" if gpu else "processor"
    if category is Category.COMPUTE:
        if mu_down:
            return f"slow or throttled {device}"
        if beta_up:
            return f"more work or a slower {device} on these ranks (load imbalance)"
        return f"unusual {device} behavior on these ranks"
    if category is Category.MEMORY:
        if mu_up and resource.lower() == "pcie":
            return "unusual PCIe traffic, e.g. peer copies falling back from NVLink to PCIe"
        return "slow copies (PCIe link, unpinned host memory)"
    if category is Category.COLLECTIVE:
        if beta_down:
            return "these ranks arrive last at the collective: the others wait for them"
        return "slow interconnect (NIC/NVLink) on these ranks, or waiting on a slower peer"
    if _SLEEP.search(label) or _SLEEP.search(key.rsplit(";", 1)[-1]):
        return "the process sleeps on the critical path"
    if _DATA_LOADING.search(key):
        return "slow input pipeline/storage"
    if key == IDLE_KEY:
        return "the host thread stalls outside the traced ops (a blocking call, I/O, a lock, a sleep)"
    if gpu and is_host_op(key, label, category):
        return "host-side work (op dispatch, annotations) on the critical path while the GPU waits"
    return f"Python work on the critical path while the {device} waits"


def describe_finding(*, label: str, key: str, category: Category, resource: str, kind: str,
                     ranks: Sequence[int], n_workers: int, observed: Triple, median: Triple,
                     expected: Box, tests: Sequence[str], hint: str = "", gpu: bool = False,
                     beta_spread: tuple[float, float] = (0.0, 0.0),
                     consequences: Sequence[Consequence] = (), waits: Sequence[Wait] = (),
                     parts: Sequence[tuple[str, float]] = ()) -> str:
    """One sentence: who, what, how it differs (from the expected range and/or the other ranks), likely cause."""
    who = describe_ranks(ranks, n_workers)
    what = describe_function(label, key, category, gpu)
    res = resource_name(resource, category, gpu)
    others = "the median rank" if kind == "common" else "other ranks"
    rb = _ratio(observed.beta, median.beta)
    rm = _ratio(observed.mu, median.mu)
    beta_up = rb is None or rb >= 1.1
    beta_down = rb is not None and rb <= 0.9
    mu_down = rm is not None and rm <= 0.9
    mu_up = (rm is not None and rm >= 1.1) or (rm is None and observed.mu > 0)
    cause = hint or _cause(category, label, key, resource, beta_up, beta_down, mu_down, mu_up, gpu)

    if kind == "random":
        lo, hi = beta_spread
        return (f"{len(ranks):,} of {n_workers:,} ranks, scattered: {what} holds {pct(lo)}–{pct(hi)} of the "
                f"window, varying from worker to worker — a random per-worker pattern ({cause})")

    clauses: list[str] = []
    if key == HOST_KEY and kind != "random":
        return _host_sentence(who, observed, median, expected, tests, cause, parts, kind)
    if tests == ("waits",):
        return _late_sentence(who, what, category, observed, median, cause, waits, len(ranks), n_workers)
    if "expectation" in tests:
        if observed.beta > expected.hi.beta or observed.beta < expected.lo.beta:
            clauses.append(f"holds {pct(observed.beta)} of the window "
                           f"(expected {_range_text(expected.lo.beta, expected.hi.beta)})")
        if observed.mu > expected.hi.mu or observed.mu < expected.lo.mu:
            mu_range = _range_text(expected.lo.mu, expected.hi.mu)
            if key == LINK_KEY:
                clauses.append(f"retransmitted {pct(observed.mu)} of the host's TCP segments "
                               f"(expected {mu_range}; median rank {pct(median.mu)})")
            else:
                clauses.append(f"runs at {pct(observed.mu)} {res} utilization (expected {mu_range})")
        if observed.sigma > expected.hi.sigma or observed.sigma < expected.lo.sigma:
            clauses.append(f"varies by {pct(observed.sigma)} {res} utilization "
                           f"(expected {_range_text(expected.lo.sigma, expected.hi.sigma)})")
        if not clauses:  # the median of the flagged workers is inside the box; some are outside
            clauses.append(f"holds {pct(observed.beta)} of the window, outside the expected range on these ranks")
    if "differential" in tests and not (kind == "common" and clauses):
        if rb is None or median.beta < 1e-4:
            clauses.append(f"holds {pct(observed.beta)} of the window, where {others} barely run it "
                           f"({pct(median.beta)})")
        elif beta_up:
            clauses.append(f"holds the critical path {rb:.1f}× longer than on {others}")
        elif beta_down:
            clauses.append(f"holds the critical path only {rb:.2g}× as long as on {others}")
        else:
            clauses.append(f"holds the critical path as long as on {others} ({pct(observed.beta)})")
        if rm is not None and mu_down:
            clauses.append(f"at {rm * 100:.0f}% of their {res} utilization")
        elif rm is not None and mu_up:
            clauses.append(f"at {rm:.1f}× their {res} utilization")
        elif rm is None and observed.mu > 0:
            clauses.append(f"at {pct(observed.mu)} {res} utilization where {others} show none")
    body = clauses[0] + "".join((", " if c.startswith("at ") or c.startswith("runs") else "; ") + c
                                for c in clauses[1:])
    text = f"{who}: {what} {body} — {cause}"
    pronoun, obj = ("it", "it") if len(ranks) == 1 else ("they", "them")
    if parts:
        text += "; " + ", ".join(f"{frame_text(label)} {pct(b)}" for label, b in parts)
    for c in consequences:
        text += (f"; {pronoun} {'holds' if pronoun == 'it' else 'hold'} {c.label} only {c.beta_ratio:.2g}× as "
                 f"long as other ranks (the other ranks wait for {obj} there)")
    return text + waits_text(waits, obj, n_workers)


def _host_sentence(who: str, observed: Triple, median: Triple, expected: Box, tests: Sequence[str], cause: str,
                   parts: Sequence[tuple[str, float]], kind: str) -> str:
    """"all ranks: the GPU waits for the host 54% of the window (expected ≤ 10%) — …; top host functions: …"."""
    if "expectation" in tests:
        how = f"{pct(observed.beta)} of the window (expected {_range_text(expected.lo.beta, expected.hi.beta)})"
    else:
        ratio = _ratio(observed.beta, median.beta)
        how = (f"{pct(observed.beta)} of the window" + (f", {ratio:.1f}× as long as on other ranks" if ratio else ""))
    top = ", ".join(f"{frame_text(label)} {pct(b)}" for label, b in parts)
    return f"{who}: the GPU waits for the host {how} — {cause}" + (f"; top host functions: {top}" if top else "")


def also_clause(label: str, key: str, category: Category, observed: Triple, median: Triple, gpu: bool) -> str:
    """"host op aten::copy_ 2.1× as long as on other ranks": a further symptom of the same ranks."""
    what = describe_function(label, key, category, gpu)
    ratio = _ratio(observed.beta, median.beta)
    if ratio is None or median.beta < 1e-4:
        return f"{what} {pct(observed.beta)} of the window, where other ranks barely run it"
    return f"{what} {ratio:.1f}× as long as on other ranks ({pct(observed.beta)} of the window)"


def waits_text(waits: Sequence[Wait], obj: str, n_workers: int) -> str:
    """"; ranks 0-1,3 wait for it 12% of the window in AllReduce" for each collective."""
    return "".join(f"; {describe_ranks(list(w.ranks), n_workers)} {'waits' if len(w.ranks) == 1 else 'wait'} "
                   f"for {obj} {pct(w.share)} of the window in {frame_text(w.function)}" for w in waits)


def _late_sentence(who: str, what: str, category: Category, observed: Triple, median: Triple, cause: str,
                   waits: Sequence[Wait], n_ranks: int, n_workers: int) -> str:
    """A finding made from wait evidence alone: the ranks arrive last, and what they spend more on."""
    obj = "it" if n_ranks == 1 else "them"
    verb = "arrives" if n_ranks == 1 else "arrive"
    coll = frame_text(waits[0].function) if waits else "the collectives"
    if category is Category.COLLECTIVE:  # no function of theirs explains it: the cause is outside
        return (f"{who} {verb} last at {coll}; the cause is not among the profiled functions (it starts "
                f"late, e.g. from work before the window or outside the traced threads)"
                + waits_text(waits, obj, n_workers))
    more = f"{pct(observed.beta)} of the window against {pct(median.beta)} on the ranks that wait for {obj}"
    pronoun = "it" if n_ranks == 1 else "they"
    return f"{who}: {what} holds {more}, and {pronoun} {verb} last at {coll} — {cause}" + waits_text(
        waits, obj, n_workers)


def describe_report(n_findings: int, first_sentence: str, n_workers: int,
                    top: Sequence[tuple[str, float]], only_rank: int | None = None) -> str:
    """The report's one-line summary. ``top``: (label, median β) of the top critical-path functions.
    ``only_rank``: the rank of a one-rank job, which has no peer to be compared with: the summary
    names it and what holds its critical path, and says that nothing could be compared."""
    if n_findings == 0:
        tops = ", ".join(f"{frame_text(label)} {pct(b)}" for label, b in top[:3])
        if only_rank is not None:
            held = f"its critical path is held by {tops}" if tops else "no function held its critical path"
            return (f"rank {only_rank} (the only rank): {held}; no other rank to compare it with, and "
                    f"nothing is outside its expected range")
        where = f" (top of the critical path: {tops})" if tops else ""
        return f"no abnormal function on {n_workers:,} rank{'' if n_workers == 1 else 's'}{where}"
    more = f" (+{n_findings - 1} more)" if n_findings > 1 else ""
    return f"{first_sentence}{more}"
