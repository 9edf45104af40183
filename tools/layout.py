"""Where each installed package lives, read from the one place that states it: pyproject.toml.

pyproject's ``[tool.setuptools.package-dir]`` maps the repository's top folders to the installed
namespace (``agent/`` is ``perftracker.agent``, ``localizer/`` is ``perftracker.localizer``). The
packages are every folder below a mapped folder that holds an ``__init__.py`` (under a chain of such
folders), named by that mapping. setup.py installs exactly these; ``tools/typecheck.py`` and
``tests/unit/test_layers.py`` read the same mapping. Standard library only: setup.py imports this.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def package_dirs(root: Path = REPO) -> dict[str, str]:
    """The mapping {installed package name: repository folder} of ``root``'s pyproject.toml."""
    data = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    mapping: dict[str, str] = data["tool"]["setuptools"]["package-dir"]
    return dict(mapping)


def find_packages(root: Path, mapping: dict[str, str]) -> dict[str, Path]:
    """{package name: folder} of every package under the mapped folders of ``root``.

    A folder mapped on its own (``perftracker.agent`` -> ``agent/``) is found under its own name,
    never under another mapping's; a folder below a plain one (no ``__init__.py``) is not a package.
    """
    root = root.resolve()
    folders = {(root / folder).resolve() for folder in mapping.values()}
    found: dict[str, Path] = {}
    for name, folder in mapping.items():
        base = (root / folder).resolve()
        others = [f for f in folders if f != base and base in f.parents]
        for init in sorted(base.rglob("__init__.py")):
            d = init.parent
            rel = d.relative_to(base).parts
            if any(d == o or o in d.parents for o in others) or any(
                    not (base.joinpath(*rel[:i]) / "__init__.py").exists() for i in range(len(rel))):
                continue
            found[".".join((name, *rel))] = d
    return found


def packages(root: Path = REPO) -> list[str]:
    """The installed package names, sorted: what setup.py passes to setuptools."""
    return sorted(find_packages(root, package_dirs(root)))
