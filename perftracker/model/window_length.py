"""How long a profile window lasts: one default and one range check (issue 48), for every place
that takes a window length (the worker's PERFTRACKER_WINDOW_S, the agent's TRIGGER message, the
localizer's trigger request and its --window-s). No imports, no I/O."""

from __future__ import annotations

import math

DEFAULT_WINDOW_S = 20.0  # docs/design.md: "a short window (20 s by default)"
MIN_WINDOW_S = 0.1
MAX_WINDOW_S = 600.0


def window_s_error(value: object) -> str:
    """"" for a usable window length in seconds, else what is wrong with it (for the caller's error)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return f"expected a finite number of seconds, got {value!r:.40}"
    if not MIN_WINDOW_S <= value <= MAX_WINDOW_S:
        return f"{value:g} s is outside [{MIN_WINDOW_S:g}, {MAX_WINDOW_S:g}] seconds"
    return ""
