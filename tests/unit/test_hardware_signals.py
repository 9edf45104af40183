"""The hardware-signal table (perftracker/model/hardware.py ``SIGNALS``, issue 48): every row is
complete, and every layer has its part of every row: the sampler writes its series, the summarizer
derives its pattern, the localizer prices it as the row says and has words for it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from perftracker.localizer.diagnose.evidence.health import WORDED_KEYS, health_excess

from perftracker.model import LINK_KEY, Category, Triple
from perftracker.model import hardware as hw
from perftracker.model.hardware import (
    EXCESS_CLOCK,
    EXCESS_FUNCTION,
    EXCESS_SHARE,
    EXCESSES,
    HEALTH_KEYS,
    LINK_KEYS,
    SIGNALS,
    SignalSpec,
)

REPO = Path(__file__).resolve().parents[2]


def _names_of(value: str) -> set[str]:
    """How code may name a series: its quoted value, or a model constant that holds it."""
    from perftracker.model import raw_window

    names = {f'"{value}"'}
    for mod in (hw, raw_window):
        names |= {k for k, v in vars(mod).items() if k.isupper() and v == value}
    return names


def _source(folder: str, prefix: str) -> str:
    """The source of folder/prefix.py and of its helper modules folder/prefix_*.py."""
    paths = [REPO / folder / f"{prefix}.py", *sorted((REPO / folder).glob(f"{prefix}_*.py"))]
    return "\n".join(p.read_text() for p in paths if p.is_file())


@pytest.mark.parametrize("spec", SIGNALS, ids=lambda s: s.name)
def test_every_row_is_complete(spec: SignalSpec) -> None:
    assert spec.name and spec.series and all(spec.series) and spec.sampler and spec.pattern_key and spec.cause
    assert Category(spec.category) in (Category.COMPUTE, Category.COLLECTIVE)
    assert spec.excess in EXCESSES
    assert not spec.link or spec.category == Category.COLLECTIVE.value  # a link's β is its collective time


def test_names_and_keys_are_unique_and_the_key_sets_come_from_the_table() -> None:
    assert len({s.name for s in SIGNALS}) == len({s.pattern_key for s in SIGNALS}) == len(SIGNALS)
    assert LINK_KEYS == {s.pattern_key for s in SIGNALS if s.link}
    assert {s.pattern_key for s in SIGNALS} <= HEALTH_KEYS


@pytest.mark.parametrize("spec", SIGNALS, ids=lambda s: s.name)
def test_the_sampler_writes_every_series(spec: SignalSpec) -> None:
    assert importlib.util.find_spec(f"perftracker.agent.samplers.{spec.sampler}") is not None, spec.sampler
    src = _source("agent/samplers", spec.sampler)
    for series in spec.series:
        assert any(n in src for n in _names_of(series)), (spec.sampler, series)


@pytest.mark.parametrize("spec", SIGNALS, ids=lambda s: s.name)
def test_the_summarizer_derives_its_pattern(spec: SignalSpec) -> None:
    src = _source("agent/summarize", "hardware") + _source("agent/summarize", "summarizer")
    names = {k for k, v in vars(hw).items() if k.isupper() and v == spec.pattern_key}
    if spec.pattern_key == LINK_KEY:
        names.add("LINK_KEY")  # perftracker.model.patterns' name for it
    assert any(f"Pattern(key={n}" in src for n in names), spec.pattern_key


@pytest.mark.parametrize("spec", SIGNALS, ids=lambda s: s.name)
def test_the_localizer_prices_it_as_the_row_says(spec: SignalSpec) -> None:
    median = Triple(0.30, 0.90, 0.0)
    same = health_excess(spec.pattern_key, median, median)
    if spec.excess == EXCESS_FUNCTION:
        assert same is None  # priced like any function by the findings
        return
    assert same == 0.0  # a rank like its peers costs nothing
    worse_mu = 0.45 if spec.excess == EXCESS_CLOCK else 0.99  # a lower clock; a higher stalled share
    worse = health_excess(spec.pattern_key, Triple(0.40, worse_mu, 0.0), median)
    assert worse is not None and worse > 0.0
    if spec.excess == EXCESS_SHARE:
        assert worse == pytest.approx(0.40 * (0.99 - 0.90))


@pytest.mark.parametrize("spec", SIGNALS, ids=lambda s: s.name)
def test_the_localizer_has_words_for_it(spec: SignalSpec) -> None:
    if spec.pattern_key == LINK_KEY:  # the host link's sentence is explain.py's, with the waits it causes
        assert "LINK_KEY" in _source("localizer/diagnose/words", "explain")
    else:
        assert spec.pattern_key in WORDED_KEYS
