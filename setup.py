"""Packages found from pyproject.toml's [tool.setuptools.package-dir] (tools/layout.py); all other
metadata is in pyproject.toml."""

import sys
from pathlib import Path

from setuptools import setup

sys.path.insert(0, str(Path(__file__).resolve().parent / "tools"))
from layout import packages  # noqa: E402

setup(packages=packages(Path(__file__).resolve().parent))
