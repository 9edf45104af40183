"""The suite's tiers (docs/development.md, "Tests in tiers"): every test module sits in tests/unit,
tests/component, tests/system, tests/accuracy or tests/integration; only tests/accuracy runs a failed test again; module
names are unique across the tiers (pytest imports each by its name); plain `python -m pytest` is the
quick run."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
TIERS = ("unit", "component", "system", "accuracy", "integration")
# pytest-rerunfailures' marker and option, spelled in pieces so that this file is not a match itself
# (the grep for the option's name must find tests/accuracy only)
RERUN = re.compile("re" + r"runs|mark\.fl" + "aky")


def test_every_test_module_is_in_a_tier() -> None:
    outside = [str(p.relative_to(TESTS)) for p in TESTS.rglob("test_*.py") if p.relative_to(TESTS).parts[0] not in TIERS]
    assert not outside, outside


def test_only_the_accuracy_tier_runs_a_failed_test_again() -> None:
    files = [TESTS / "conftest.py", *(p for tier in TIERS if tier != "accuracy" for p in (TESTS / tier).rglob("*.py"))]
    offenders = [f"{p.relative_to(TESTS)}:{n}: {line.strip()}" for p in files
                 for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if RERUN.search(line)]
    assert not offenders, offenders
    options = tomllib.loads((TESTS.parent / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]["ini_options"]
    assert not RERUN.search(options.get("addopts", "")), options["addopts"]


def test_the_quick_run_is_unit_and_component() -> None:
    options = tomllib.loads((TESTS.parent / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]["ini_options"]
    assert options["testpaths"] == ["tests/unit", "tests/component"]


def test_module_names_are_unique_across_the_tiers() -> None:
    names = sorted(p.name for p in TESTS.rglob("test_*.py"))
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})


def test_the_pattern_finds_the_marker_and_the_option() -> None:
    marker, option = "@pytest.mark.fl" + "aky(re" + "runs=1)", 'addopts = "--re' + 'runs 2"'
    assert RERUN.search(marker) and RERUN.search(option)
    assert not RERUN.search("@pytest.mark.timeout(120)")
