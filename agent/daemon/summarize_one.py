"""``python -m perftracker.agent.daemon.summarize_one RAW --samples FILE --out PATTERNS``: summarize one
raw window in a process of its own (one core), the command line around the pure summarizer
(``perftracker.agent.summarize.summarizer``)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from perftracker.agent.summarize.patterns import DEFAULT_MAX_ZERO_RUN
from perftracker.agent.summarize.summarizer import SummarizeOptions, summarize_window

from perftracker.errors import PerftrackerError
from perftracker.model.raw_window import RawWindow, SampleSet


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perftracker.agent.daemon.summarize_one",
                                     description="Summarize one raw window into a PatternSet (one core).")
    parser.add_argument("raw", help="RawWindow file (RawWindow.save) or a Kineto .json/.json.gz trace")
    parser.add_argument("--samples", help="SampleSet file from perftracker.agent.samplers")
    parser.add_argument("--out", required=True, help="PatternSet file: compact bytes, or JSON if it ends in .json")
    parser.add_argument("--max-zero-run", type=int, default=DEFAULT_MAX_ZERO_RUN, help="c of Algorithm 1 (samples)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.raw.endswith((".json", ".json.gz")):
            from perftracker.agent.kineto import read_kineto_trace

            raw = read_kineto_trace(args.raw)
        else:
            raw = RawWindow.load(args.raw)
        samples = SampleSet.load(args.samples) if args.samples else None
        ps = summarize_window(raw, samples, SummarizeOptions(max_zero_run=args.max_zero_run))
        out = Path(args.out)
        tmp = out.with_name(out.name + ".tmp")
        if out.suffix == ".json":
            tmp.write_text(json.dumps(ps.to_dict()))
        else:
            tmp.write_bytes(ps.to_bytes())
        tmp.replace(out)
    except PerftrackerError as exc:
        sys.stderr.write(f"perftracker.agent.daemon.summarize_one: error: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
