"""Labels that identify: one label per call path within a report (issue 47).

A Python function's label is its innermost frame, so two call paths of one function (``forward``
called from ``## forward ##`` and from ``forward`` itself) share it. Where labels collide, each
gets its callers, innermost first, until the labels differ: "DistributedDataParallel.forward from
## forward ##" and "DistributedDataParallel.forward from DistributedDataParallel.forward".
"""

from __future__ import annotations

from collections.abc import Sequence

JOIN = " from "
_MAX_DEPTH = 8


def frame_name(frame: str) -> str:
    """A frame's function: "path/file.py(12): fn" -> "fn"; any other frame as it is."""
    head, sep, fn = frame.partition("): ")
    return fn.strip() if sep and "(" in head else frame.strip()


def distinct_labels(keys: Sequence[str], labels: Sequence[str]) -> list[str]:
    """``labels``, each that another key shares extended with its callers (from ``keys``: frames
    joined by ";", outermost first) until no two keys share a label; a label no other key shares
    is kept as it is."""
    out = list(labels)
    by_label: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        by_label.setdefault(label, []).append(i)
    for members in by_label.values():
        if len({keys[i] for i in members}) < 2:
            continue
        callers = {i: [frame_name(f) for f in reversed(keys[i].split(";")[:-1])] for i in members}
        for depth in range(1, _MAX_DEPTH + 1):
            names = {i: JOIN.join([labels[i], *callers[i][:depth]]) for i in members}
            if len(set(names.values())) == len({keys[i] for i in members}) or \
                    all(depth >= len(c) for c in callers.values()):
                break
        for i in members:
            out[i] = names[i]
    return out
