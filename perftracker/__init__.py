"""perftracker: `import perftracker` in a training script starts always-on slowdown/hang detection.

Placeholder until the runtime lands (issue 2): it must stay light (torch, numpy, psutil, nvtx, stdlib).
"""

from __future__ import annotations

from perftracker.errors import PerftrackerError

__all__ = ["PerftrackerError"]
