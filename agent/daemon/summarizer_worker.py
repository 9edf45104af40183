"""`python -m perftracker.agent.daemon.summarizer_worker`: the summarizer as one long-lived low-priority process.

The agent starts it pinned to one core at nice 19 (like ``python -m perftracker.agent.daemon.summarize_one``) and keeps it,
so that each window does not pay for a Python start and the numpy import (seconds on a busy node).
Requests are JSON lines on stdin, ``{"raw": FILE, "samples": FILE or null, "out": FILE}``; each runs
exactly ``python -m perftracker.agent.daemon.summarize_one RAW [--samples FILE] --out FILE`` in this process and answers one
JSON line on stdout, ``{"rc": 0}`` or ``{"rc": 1, "error": "..."}``. End of input ends the process.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys


def main() -> int:
    from perftracker.agent.daemon import summarize_one as summarize

    for line in sys.stdin:
        if not line.strip():
            continue
        err = io.StringIO()
        try:
            req = json.loads(line)
            argv = [str(req["raw"])] + (["--samples", str(req["samples"])] if req.get("samples") else [])
            argv += ["--out", str(req["out"])]
            with contextlib.redirect_stderr(err):
                rc = summarize.main(argv)
        except SystemExit as exc:  # argparse
            rc = int(exc.code or 0) if isinstance(exc.code, int) else 2
        except Exception as exc:  # noqa: BLE001 - reported to the agent, the worker lives on
            rc = 1
            err.write(f"{type(exc).__name__}: {exc}")
        sys.stdout.write(json.dumps({"rc": rc, "error": err.getvalue()[-2000:]}) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
