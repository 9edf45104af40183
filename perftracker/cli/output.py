"""The command line's terminal output: rich consoles for stdout and stderr, one-line messages, and
output files written whole.

Colour only when the stream is a terminal and ``NO_COLOR`` is unset (rich's rules; ``FORCE_COLOR``
forces it); the width is the terminal's (``COLUMNS`` when set, 80 when not a terminal). rich is a
base dependency, imported here lazily; should it be missing (a trimmed image), messages are plain
text. ``import perftracker`` never imports this module.

Safe output (issue 33): text from outside (names, reasons, paths) never controls the terminal.
Every string printed here, and every string a ``console()`` renders, goes through
``perftracker.model.names.safe_text`` (control characters and bidi overrides shown as escapes), and
rich markup is never interpreted (``markup=False``). ``-o`` files are written through a new
temporary file opened with ``O_CREAT | O_EXCL | O_NOFOLLOW`` under a random name, then renamed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from perftracker.errors import PerftrackerError
from perftracker.model.names import safe_text

PROG = "perftracker"
_STYLES = {"error": "bold red", "warning": "yellow", "note": "dim"}
_console_class: Any = None


def _safe_console_class() -> Any:
    """rich's Console, with every string it renders (cells, titles, ``print(str)``) made safe first."""
    global _console_class
    if _console_class is None:
        from rich.console import Console

        class SafeConsole(Console):
            def render_str(self, text: str, **kwargs: Any) -> Any:
                return super().render_str(safe_text(text, newlines=True), **kwargs)

        _console_class = SafeConsole
    return _console_class


def console(stderr: bool = False, file: TextIO | None = None) -> Any | None:
    """A rich Console on stdout (or stderr, or ``file``); None when rich is not installed. No
    markup, and strings are made safe (``safe_text``) before they are rendered."""
    try:
        cls = _safe_console_class()
    except ImportError:
        return None
    return cls(file=file if file is not None else (sys.stderr if stderr else sys.stdout),
               highlight=False, emoji=False, markup=False)


def message(text: str, level: str = "") -> None:
    """One line on stderr: ``perftracker: [level: ]text`` (the level coloured on a terminal)."""
    text = safe_text(" ".join(str(text).split("\n")))
    con = console(stderr=True)
    if con is None:
        sys.stderr.write(f"{PROG}: {level + ': ' if level else ''}{text}\n")
        sys.stderr.flush()
        return
    from rich.text import Text

    line = Text(f"{PROG}: ")
    if level:
        line.append(f"{level}: ", style=_STYLES.get(level, ""))
    line.append(text)
    con.print(line, soft_wrap=True)


def error(text: str) -> None:
    message(text, "error")


def warning(text: str) -> None:
    message(text, "warning")


def print_text(text: str) -> None:
    """Plain command output on stdout (no markup, never re-wrapped)."""
    con = console()
    if con is None:
        sys.stdout.write(safe_text(text, newlines=True) + "\n")
    else:
        con.print(text, soft_wrap=True)


def print_json(data: Any) -> None:
    import json

    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def check_writable(path: str | os.PathLike[str], flag: str = "-o") -> Path:
    """Fail before any work when ``path`` cannot be written: its temporary file is created and
    removed now (what the final write does), so a missing directory, a permission, a read-only or
    special file system is one PerftrackerError line naming the flag and path."""
    out = Path(path)
    if out.is_dir():
        raise PerftrackerError(f"{flag} {out}: is a directory")
    tmp = _tmp_name(out)
    try:
        os.close(os.open(tmp, _TMP_FLAGS, 0o644))
        os.unlink(tmp)
        if out.exists() and not os.access(out, os.W_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as exc:
        raise PerftrackerError(f"{flag} {out}: cannot write ({exc.strerror or exc})") from None
    return out


# a new file, never through a symlink: another user of a writable directory cannot plant the
# temporary file (or a link at its name) and have us write into a file of theirs
_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _tmp_name(out: Path) -> Path:
    return out.with_name(f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


@contextlib.contextmanager
def _atomic(out: Path) -> Iterator[TextIO]:
    tmp = _tmp_name(out)
    fd = os.open(tmp, _TMP_FLAGS, 0o666)  # the usual mode of a new file (less the umask)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            yield fh
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_file(path: str | os.PathLike[str], render: Callable[[TextIO], None], flag: str = "-o") -> Path:
    """Write ``render(fh)``'s output to ``path`` whole (a temporary file renamed): a reader never
    sees half a file, and an I/O failure is one PerftrackerError line naming the flag and path."""
    out = Path(path)
    try:
        with _atomic(out) as fh:
            render(fh)
    except OSError as exc:
        raise PerftrackerError(f"{flag} {out}: cannot write ({exc.strerror or exc})") from None
    return out
