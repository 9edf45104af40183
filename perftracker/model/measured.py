"""What a report measured, and null for what it did not (issue 47).

Offline traces carry no utilization samples: every μ and σ of their report is 0.0 only because
nothing was measured. ``samples_measured`` says whether a report's μ and σ were measured;
``unmeasured_to_null`` writes those that were not as JSON null in a report's dict (the findings'
observed and median triples, their scatter points' μ, the top functions' medians; the expected
ranges are configured, not measured, and stay); ``null_to_zero`` reads such a dict back (a
Report holds floats: 0.0, with ``samples_measured`` false again). Pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from typing import Any

_MEASURED = ("mu", "sigma")


def samples_measured(kind: str, triples: Iterable[tuple[float, float]]) -> bool:
    """Whether a report of this ``kind`` with these (μ, σ) pairs measured utilization: every report
    but one of offline traces does; an offline one only where some μ or σ is not 0."""
    if kind != "offline":
        return True
    return any(mu > 0 or sigma > 0 for mu, sigma in triples)


def _null(triple: Any) -> None:
    if isinstance(triple, MutableMapping):
        for k in _MEASURED:
            if k in triple:
                triple[k] = None


def unmeasured_to_null(d: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """``d`` (a Report's dict, changed in place) with its unmeasured μ and σ as None."""
    for f in d.get("findings", []):
        _null(f.get("observed"))
        _null(f.get("median"))
        f["points"] = [[p[0], p[1], None] for p in f.get("points", [])]
    for t in d.get("top_functions", []):
        _null(t.get("median"))
    return d


def null_to_zero(d: Any) -> Any:
    """A Report dict as read, its null μ and σ 0.0 again (a copy where any was null; else ``d``)."""
    if not isinstance(d, MutableMapping):
        return d
    findings = d.get("findings")
    tops = d.get("top_functions")
    if not isinstance(findings, list) or not isinstance(tops, list):
        return d
    out = dict(d)
    out["findings"] = [_finding_zero(f) for f in findings]
    out["top_functions"] = [_with_zero(t, ("median",)) for t in tops]
    return out


def _finding_zero(f: Any) -> Any:
    if not isinstance(f, MutableMapping):
        return f
    g = _with_zero(f, ("observed", "median"))
    points = g.get("points")
    if isinstance(points, list):
        g["points"] = [[*p[:2], 0.0] if isinstance(p, list) and len(p) == 3 and p[2] is None else p for p in points]
    return g


def _with_zero(d: Any, keys: tuple[str, ...]) -> Any:
    if not isinstance(d, MutableMapping):
        return d
    out = dict(d)
    for key in keys:
        t = out.get(key)
        if isinstance(t, MutableMapping) and any(t.get(k, 0.0) is None for k in _MEASURED):
            out[key] = {k: (0.0 if k in _MEASURED and v is None else v) for k, v in t.items()}
    return out
