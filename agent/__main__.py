"""`python -m perftracker.agent ...`: the node agent, the same as `perftracker agent ...`.

The embedded localizer needs the `perftracker agent` entry point (the agent package never imports
``localizer``); this one accepts the same flags.
"""

from __future__ import annotations

import sys

from perftracker.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main(["agent", *sys.argv[1:]]))
