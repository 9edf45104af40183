"""The localizer store a store-reading command opens: ``--store PATH``, else ``<data-dir>/localizer.sqlite``."""

from __future__ import annotations

import argparse
from pathlib import Path

from perftracker.cli.options import DEFAULT_DATA_DIR, add_data_dir
from perftracker.errors import ConfigError


def add_store_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", default=None, metavar="PATH",
                   help="the localizer's sqlite store (default <data-dir>/localizer.sqlite)")
    add_data_dir(p, "where the embedded localizer keeps its store")


def store_path(args: argparse.Namespace) -> Path:
    path = Path(args.store) if args.store else Path(args.runs_dir or DEFAULT_DATA_DIR) / "localizer.sqlite"
    if not path.is_file():
        raise ConfigError(f"no localizer store at {path}: pass --store PATH (the localizer's --store) or --data-dir")
    if not args.store:  # the store of another user's (planted) data dir is not read
        from perftracker.localizer.service.embedded import check_runs_dir

        check_runs_dir(path.parent)
    return path
