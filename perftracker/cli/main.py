"""The `perftracker` command line. One module per command under perftracker/cli/ (memray style).

Each command module defines ``HELP: str``, ``add_arguments(parser)`` and ``run(args) -> int``.
Modules are imported lazily, so `perftracker --help` stays fast and a command's heavy imports
(agent, localizer, aiohttp, rich) load only when that command runs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from perftracker import __version__
from perftracker.cli import output
from perftracker.cli.exits import EXIT_FAILURE, EXIT_USAGE
from perftracker.errors import PerftrackerError, UsageError

# command name -> module under perftracker.cli, in the order --help lists them
COMMANDS: dict[str, str] = {
    "demo": "demo",
    "run": "run",
    "analyze": "analyze",
    "report": "report",
    "trigger": "trigger",
    "sessions": "sessions",
    "hosts": "hosts",
    "baseline": "baseline",
    "status": "status",
    "export-trace": "export_trace",
    "agent": "agent",
    "localizer": "localizer",
}

_SUMMARIES: dict[str, str] = {
    "demo": "run perftracker/examples/train.py on 4 CPU workers with a slow rank and print the diagnosis",
    "run": "run a training command with a local agent and embedded localizer",
    "analyze": "summarize and localize per-rank Kineto trace files offline",
    "report": "show a stored report as text, JSON or HTML",
    "trigger": "ask every worker of a job to profile a window now",
    "sessions": "list profiling sessions",
    "hosts": "list the hosts that reports keep naming as the culprit",
    "baseline": "list the jobs' healthy baselines, or retake one",
    "status": "show the jobs' state on this node: newest sessions, held triggers, window costs, budget left",
    "export-trace": "write one rank's window as a Perfetto/Chrome trace with the critical path",
    "agent": "run the node agent (sidecar)",
    "localizer": "run the localizer service",
}

EPILOG = """\
start with `perftracker demo`: a slow rank found end to end on 4 CPU workers, in about a minute.

examples:
  perftracker demo
  perftracker run --nproc-per-node 4 -- train.py     # your own job, with a local agent
  perftracker report latest --format html -o report.html
  perftracker analyze traces/                        # PyTorch profiler traces you already have

exit codes: 0 done, 1 a failure, 2 a usage error, 124 a wait that timed out.

`perftracker COMMAND --help` for each command's options and examples; docs: docs/getting-started.md"""

log = logging.getLogger("perftracker")


def _load(name: str) -> ModuleType:
    return importlib.import_module(f"perftracker.cli.{COMMANDS[name]}")


def add_verbose(parser: argparse.ArgumentParser, dest: str) -> None:
    parser.add_argument("-v", "--verbose", dest=dest, action="count", default=0,
                        help="more log output (-vv for debug); anywhere on the command line")


def build_parser(argv: Sequence[str], load_all: bool = False) -> argparse.ArgumentParser:
    """The command line; only the command in ``argv`` is loaded, unless ``load_all`` (the generated
    reference, tools/cli_reference.py)."""
    parser = argparse.ArgumentParser(
        prog="perftracker",
        description=(
            "perftracker: on-demand differential profiling for PyTorch training. "
            "Add `import perftracker` to a training script; when it slows down or hangs, every "
            "worker profiles a short window and the localizer names the abnormal functions and ranks."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_verbose(parser, "verbose")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # Only the command actually being run is imported; the rest get a summary line.
    wanted = next((a for a in argv if a in COMMANDS), None)
    for name in COMMANDS:
        if name == wanted or load_all:
            try:
                mod = _load(name)
            except ImportError as exc:
                raise PerftrackerError(f"command {name!r} is not available: {exc}") from None
            p = sub.add_parser(name, help=getattr(mod, "HELP", _SUMMARIES[name]), description=getattr(mod, "DESCRIPTION", None),
                               formatter_class=argparse.RawDescriptionHelpFormatter)
            mod.add_arguments(p)
            add_verbose(p, "verbose_sub")  # -v after the command too; counts add up
            p.set_defaults(_run=mod.run)
        else:
            sub.add_parser(name, help=_SUMMARIES[name], add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser(argv)
        args = parser.parse_args(argv)
        args.verbose += getattr(args, "verbose_sub", 0)
        level = logging.WARNING - 10 * min(args.verbose, 2) + (0 if args.verbose else 10)
        logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
        log.debug("perftracker %s (python %s): %s", __version__, sys.version.split()[0], " ".join(argv))
        if not getattr(args, "_run", None):
            parser.print_help()
            return 2
        return int(args._run(args) or 0)
    except UsageError as exc:  # two options that do not go together: argparse's code and line
        output.error(str(exc))
        return EXIT_USAGE
    except PerftrackerError as exc:
        output.error(str(exc))
        return EXIT_FAILURE
    except OSError as exc:  # an I/O failure no command turned into a PerftrackerError: still one line
        if isinstance(exc, BrokenPipeError):  # `perftracker ... | head`
            with contextlib.suppress(OSError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
        where = f"{exc.filename}: " if exc.filename else ""
        output.error(f"{where}{exc.strerror or exc}")
        if logging.getLogger().isEnabledFor(logging.DEBUG):
            log.exception("I/O error")
        return 1
    except KeyboardInterrupt:
        output.message("interrupted")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
