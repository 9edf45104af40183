"""The documentation: the README fits on a page, the docs site builds strictly, and nothing in the
repository points at a file outside it."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README_MAX_LINES = 200

# Paths that exist only on the development machines, never in a clone of the repository.
OUTSIDE_REFERENCES = re.compile(r"\.\./shared\b|\bshared/DESIGN\.md|/work/shared\b|\bDESIGN\.md")
# Tests and benchmarks may read the dlrm reference traces where CI lays them out, beside the checkout
# (docs/development.md); that is input data, not a document the reader is sent to.
DATA_READERS = ("tests/", "bench/")
DATA_PATH = re.compile(r"\.\./shared/data/")
IMAGES = (".svg", ".png")
# Markdown links and images: [text](target) / ![alt](target).
MARKDOWN_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        pytest.skip("not a git checkout: cannot list the tracked files")
    return [REPO / name for name in out.decode().split("\0") if name]


def test_readme_fits_on_a_page() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"


def test_readme_test_command_is_what_ci_runs() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    commands = re.findall(r"(?:python3? -m )?pytest[^`\n]*", readme)
    assert commands, "the README gives no test command"
    ci_lines = [line.strip() for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert commands[0].strip() in ci_lines, f"README's test command {commands[0]!r} is not a line of .ci/run"


def test_readme_links_resolve_inside_the_repository() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    targets = [t for t in MARKDOWN_LINK.findall(text) if "://" not in t and not t.startswith("#")]
    assert targets, "the README links no docs page"
    for target in targets:
        path = (REPO / target.split("#")[0]).resolve()
        assert path.is_relative_to(REPO), f"README links outside the repository: {target}"
        assert path.exists(), f"README links a missing file: {target}"


def test_no_tracked_file_refers_to_a_path_outside_the_repository() -> None:
    offenders = []
    for path in _tracked_files():
        if path == Path(__file__).resolve():
            continue  # this file spells the patterns out
        if path.suffix in IMAGES:
            continue  # a picture of a terminal or a report names no file for the reader to open
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary, or deleted in the work tree
        rel = str(path.relative_to(REPO))
        for lineno, line in enumerate(text.splitlines(), 1):
            if rel.startswith(DATA_READERS):
                line = DATA_PATH.sub("", line)
            if OUTSIDE_REFERENCES.search(line):
                offenders.append(f"{rel}:{lineno}: {line.strip()}")
    assert not offenders, "references to files outside the repository:\n" + "\n".join(offenders)


def test_outside_reference_pattern_catches_the_old_links() -> None:
    # The check above must be able to fail: the README's former design link and the data path.
    assert OUTSIDE_REFERENCES.search("design: `../shared/DESIGN.md`.")
    assert OUTSIDE_REFERENCES.search("see /work/shared/data/dlrm_kineto")
    assert not OUTSIDE_REFERENCES.search("see docs/design.md section 5; the shared PID namespace")
    assert OUTSIDE_REFERENCES.search("Waits are consequences (DESIGN.md section 6)")
    assert not OUTSIDE_REFERENCES.search(DATA_PATH.sub("", 'traces = "../shared/data/dlrm_kineto"'))
    assert OUTSIDE_REFERENCES.search(DATA_PATH.sub("", "design: ../shared/DESIGN.md"))


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs-material is not installed (it is in the dev extra: pip install -e '.[dev]')")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "WARNING" not in output, output
    assert (tmp_path / "site" / "index.html").is_file()
    # every page of docs/ is in the nav and was built (strict mode also fails on an omitted page)
    pages = sorted(p.stem for p in (REPO / "docs").glob("*.md"))
    missing = [p for p in pages if not (tmp_path / "site" / ("" if p == "index" else p) / "index.html").is_file()]
    assert not missing, f"docs pages not built: {missing}"
