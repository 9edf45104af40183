"""Type-check perftracker with mypy, under its installed names: ``python tools/typecheck.py [MYPY ARGS]``.

pyproject's [tool.setuptools.package-dir] installs the repository's agent/ and localizer/ folders
as ``perftracker.agent`` and ``perftracker.localizer``; mypy has no such mapping and cannot follow
the editable install's import hook. So this builds the installed layout in a temporary directory,
out of symlinks (perftracker/<each entry> -> the repository's, perftracker/agent -> agent/,
perftracker/localizer -> localizer/), runs ``mypy -p perftracker`` there with the repository's
pyproject.toml ([tool.mypy]: strict on the pure packages, mypy's defaults elsewhere), and prints
mypy's report with the repository's own paths. The exit status is mypy's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from layout import package_dirs  # tools/layout.py: the mapping, from pyproject.toml

REPO = Path(__file__).resolve().parents[1]


def build_tree(dest: Path) -> dict[str, str]:
    """Lay out the installed packages under ``dest``; returns {tree prefix: repository prefix}."""
    package_dir = package_dirs(REPO)
    top = {name for name in package_dir if "." not in name}
    prefixes: dict[str, str] = {}
    for name in sorted(top):  # a top-level package: a real directory of links to its entries
        root = dest / name
        root.mkdir()
        for entry in (REPO / package_dir[name]).iterdir():
            if entry.name != "__pycache__":
                (root / entry.name).symlink_to(entry)
        prefixes[f"{name}/"] = f"{package_dir[name]}/"
    for name in sorted(set(package_dir) - top):  # a mapped subpackage: one link to its folder
        link = dest.joinpath(*name.split("."))
        if link.is_symlink() or link.exists():
            raise SystemExit(f"typecheck: {name} is mapped to {package_dir[name]}/ but "
                             f"{package_dir[name.partition('.')[0]]}/ holds an entry of that name")
        link.symlink_to(REPO / package_dir[name])
        prefixes[f"{name.replace('.', '/')}/"] = f"{package_dir[name]}/"
    return prefixes


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="perftracker-typecheck-") as tmp:
        prefixes = build_tree(Path(tmp))
        cmd = [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
               "--cache-dir", str(REPO / ".mypy_cache"), "-p", "perftracker", *argv]
        env = {k: v for k, v in os.environ.items() if k != "MYPYPATH"}
        proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
    # longest prefix first: perftracker/agent/x.py -> agent/x.py, perftracker/x.py -> perftracker/x.py
    pattern = re.compile(r"^(" + "|".join(re.escape(p) for p in sorted(prefixes, key=len, reverse=True)) + ")",
                         re.MULTILINE)
    sys.stdout.write(pattern.sub(lambda m: prefixes[m.group(1)], proc.stdout))
    sys.stderr.write(proc.stderr)
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
