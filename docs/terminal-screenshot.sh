#!/usr/bin/env bash
# A terminal screenshot (SVG) of a perftracker command at a given width: the command runs with
# FORCE_COLOR=1 and COLUMNS=<width> (what an <width>-column colour terminal gives it), its output
# (stdout, then stderr) is recorded by rich and exported as SVG.
#   docs/terminal-screenshot.sh OUT.svg WIDTH perftracker analyze /path/to/traces
set -euo pipefail
out=$1 width=$2
shift 2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
FORCE_COLOR=1 COLUMNS=$width "$@" >"$tmp/stdout" 2>"$tmp/stderr" || true
python - "$out" "$width" "$tmp" "$*" <<'PY'
import sys
from pathlib import Path

from rich.console import Console
from rich.text import Text

out, width, tmp, title = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
console = Console(record=True, width=width, force_terminal=True, file=open("/dev/null", "w"))
console.print(Text("$ " + title, style="bold"), soft_wrap=True)
for name in ("stderr", "stdout"):
    text = (tmp / name).read_text()
    if text:
        console.print(Text.from_ansi(text), end="", soft_wrap=True)
console.save_svg(out, title=title)
print(f"wrote {out}")
PY
