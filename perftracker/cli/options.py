"""Options that several commands share, one word per concept (issue 35).

- ``--data-dir DIR``: where the embedded localizer keeps its store, reports and token
  (``./perftracker-runs`` by default); ``--runs-dir`` is its old, hidden spelling.
- ``--run-dir DIR``: the node agent's socket, log and raw windows (``$PERFTRACKER_RUN_DIR``).
- ``SESSION``: a session id such as ``20261128-020900-c5e6ca`` (what the localizer makes), or ``latest``.
"""

from __future__ import annotations

import argparse

DEFAULT_DATA_DIR = "perftracker-runs"
EXAMPLE_SESSION = "20261128-020900-c5e6ca"  # the shape of a real id: UTC date-time and 6 hex digits
RUN_DIR_DEFAULT_TEXT = "$PERFTRACKER_RUN_DIR, else /tmp/perftracker-<uid>"


def add_data_dir(p: argparse.ArgumentParser | argparse._ArgumentGroup, what: str,
                 default: str | None = DEFAULT_DATA_DIR) -> None:
    """``--data-dir`` (dest ``runs_dir``) and its deprecated spelling ``--runs-dir``, hidden, for one release."""
    shown = default if default is not None else "none"
    p.add_argument("--data-dir", dest="runs_dir", metavar="DIR", default=default,
                   help=f"{what} (default {shown})")
    p.add_argument("--runs-dir", dest="runs_dir", metavar="DIR", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


class _Deprecated(argparse.Action):
    """A hidden old spelling of an option: it works as the new one, with a one-line warning."""

    def __init__(self, option_strings: list[str], dest: str, new: str = "", flag: bool = False,
                 **kwargs: object) -> None:
        self.new, self.flag = new, flag
        super().__init__(option_strings, dest, nargs=0 if flag else None, **kwargs)  # type: ignore[arg-type]

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        from perftracker.cli import output

        output.warning(f"{option_string} is deprecated; use {self.new}")
        setattr(namespace, self.dest, True if self.flag else values)


def add_alias(p: argparse.ArgumentParser | argparse._ArgumentGroup, old: str, new: str, dest: str,
              flag: bool = False, type: object = None) -> None:
    """``old``, a hidden deprecated spelling of ``new`` (same ``dest``), kept for one release (issue 47:
    one name per concept across commands)."""
    kwargs: dict[str, object] = {"default": argparse.SUPPRESS, "help": argparse.SUPPRESS}
    if type is not None:
        kwargs["type"] = type
    p.add_argument(old, dest=dest, action=_Deprecated, new=new, flag=flag, **kwargs)  # type: ignore[arg-type]
