"""Every install line names the distribution by its own name (issue 35).

PyPI's ``perftracker`` is an unrelated project; ours is ``perftracker-ml`` (the import and the command
stay ``perftracker``). A ``pip install`` line, an extras self-reference (``perftracker[gpu]``) or an
install hint in a message must name ``perftracker-ml`` or install from a path (``-e .``, ``".[gpu]"``).
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DIST = "perftracker-ml"
# `pip install ... perftracker`, `pip install 'perftracker[gpu]'`: the old name as a requirement. The
# name must stand alone (not perftracker-ml, not perftracker/examples/train.py, not a -e path).
OLD_REQUIREMENT = re.compile(r"""(?<![\w./-])["'`]?perftracker(?:\[[\w,\s-]*\])?["'`]?(?![\w./-])""")
INSTALL = re.compile(r"\bpip3?\s+install\b|\binstall\s+`")
EXTRAS_SELF_REFERENCE = re.compile(r"""["']perftracker\[""")
SUFFIXES = {".md", ".py", ".toml", ".yaml", ".yml", ".txt", ".cfg", ".sh", ""}


def _tracked_text_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        pytest.skip("not a git checkout: cannot list the tracked files")
    files = [REPO / name for name in out.decode().split("\0") if name]
    return [p for p in files if p.suffix in SUFFIXES or p.name.endswith("Dockerfile") or "Dockerfile" in p.name]


def old_name_installs(line: str) -> bool:
    """Whether a line installs (or tells the reader to install) the old distribution name."""
    if EXTRAS_SELF_REFERENCE.search(line):
        return True
    for m in INSTALL.finditer(line):
        rest = line[m.end():]
        rest = re.split(r"&&|;|\|\||`", rest)[0]  # only this command's arguments (or this code span's)
        if OLD_REQUIREMENT.search(rest):
            return True
    return False


def test_the_distribution_has_its_own_name() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["name"] == DIST
    for extra, reqs in project["optional-dependencies"].items():
        for req in reqs:
            assert not req.startswith("perftracker["), f"extra {extra!r} names the old distribution: {req}"
    assert project["scripts"] == {"perftracker": "perftracker.cli.main:main"}  # the command keeps its name


def test_no_install_line_names_the_old_distribution() -> None:
    offenders = []
    for path in _tracked_text_files():
        if path == Path(__file__).resolve():
            continue  # this file spells the old lines out
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            if old_name_installs(line):
                offenders.append(f"{path.relative_to(REPO)}:{lineno}: {line.strip()}")
    assert not offenders, "install lines naming PyPI's unrelated 'perftracker':\n" + "\n".join(offenders)


@pytest.mark.parametrize("line", [
    "pip install perftracker",
    "python3 -m pip install 'perftracker[all]'",
    'RUN pip install "perftracker[gpu]" && true',
    "(install `perftracker` in its image)",
    'all = ["perftracker[traces,gpu,k8s]"]',
    "pip install torch==2.13.0 perftracker",
])
def test_the_check_catches_old_install_lines(line: str) -> None:
    assert old_name_installs(line)


@pytest.mark.parametrize("line", [
    "pip install perftracker-ml",
    "python3 -m pip install -e '.[all]'",
    'RUN pip install ".[gpu]" && python -c "import perftracker"',
    "python3 -m pip install torch==2.13.0 -e '.[dev]' && perftracker demo",
    'all = ["perftracker-ml[traces,gpu,k8s]"]',
    "pip install aiohttp) or reinstall perftracker-ml with its default dependencies",
    "install `perftracker-ml` in its image",
    "perftracker run -- perftracker/examples/train.py",
])
def test_the_check_passes_new_install_lines(line: str) -> None:
    assert not old_name_installs(line)
