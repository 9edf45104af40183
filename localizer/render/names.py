"""Display names every renderer shows the same way: a frame without its directories, the μ and σ
rows' names. (Out of ``render/__init__`` so that the renderers do not import the package that
registers them: ``render.REGISTRY`` imports each renderer when it renders.)"""

from __future__ import annotations

import re

from perftracker.model import LINK_KEY, Finding

_DIRS = re.compile(r"(?:[^\s;:()<>]*/)+(?=[^/\s;()]+\(\d+\))")


def short_frame(text: str) -> str:
    """Display form of a frame or stack: directories dropped from "path/file.py(123): fn" frames."""
    return _DIRS.sub("", text)


def mu_names(f: Finding) -> tuple[str, str]:
    """(μ row label, σ row label) of a finding: utilization, or the link pattern's retransmitted share."""
    if f.key == LINK_KEY:
        return "\u03bc retransmitted share", "\u03c3 (unused)"
    return "\u03bc utilization", "\u03c3 utilization std"
