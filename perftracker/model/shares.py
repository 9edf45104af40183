"""How a share (of the window) is written, once for the whole report: the words and every renderer
round a share the same way (issue 47: a chip and the evidence never say 10% and 9.8%)."""

from __future__ import annotations


def pct(x: float) -> str:
    """0.12 -> "12%", 0.025 -> "2.5%", 0.0004 -> "0.04%"."""
    v = 100.0 * x
    if v >= 10 or v == 0:
        return f"{v:.0f}%"
    if v >= 1:
        return f"{v:.1f}".rstrip("0").rstrip(".") + "%"
    return f"{v:.2g}%"
