"""``perftracker analyze`` reads each trace file once (summarize_dir's worker processes): the step
alignment's cut and the gloo groups summarize the window the first pass kept
(perftracker.cli.analyze_rank), and give what a summary read from the file gives. Jobs: the
2-rank step traces of tests/step_traces.py (rank 1 recorded a step more: it is cut) and the real
DP2 x PP2 gloo fixture of tests/unit/test_gloo_groups.py (its calls get their groups)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from pathlib import Path

import pytest
from perftracker.agent import kineto
from perftracker.agent.summarize.step_align import cut_window, plan_cuts, step_marks
from perftracker.agent.summarize.summarizer import summarize_window

from perftracker.cli.analyze import summarize_dir
from perftracker.cli.analyze_rank import summarize_file, summarize_kept
from perftracker.cli.gloo_offline import ENV
from perftracker.model.raw_window import RawWindow
from tests.step_traces import job_docs, write_job

GLOO = Path(__file__).resolve().parents[1] / "fixtures" / "gloo_dp2pp2"
STEPS = [1, 2, 3, 4, 5, 6]


@pytest.fixture
def reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A file with one line per trace read, from any process (the pool's workers are forked)."""
    log = tmp_path / "reads.log"
    log.touch()
    load = kineto.load_trace_json

    def counted(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        with open(log, "a") as fh:
            fh.write(f"{Path(path).name}\n")
        return load(path, *args, **kwargs)

    monkeypatch.setattr(kineto, "load_trace_json", counted)
    return log


def _read(path: Path) -> RawWindow:
    """The window of a trace read afresh, as analyze's first pass reads it."""
    doc = json.loads(path.read_text())
    return kineto.window_from_trace(doc, path, kineto.resolve_rank(doc, path), job=path.parent.name,
                                    session="offline")


def test_a_cut_rank_is_summarized_from_its_first_read(tmp_path: Path, reads: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "1")  # both later passes asked for
    d = write_job(tmp_path / "job", job_docs({0: STEPS, 1: [*STEPS, 7]}, {0: 4000.0, 1: 4000.0},
                                             {1: {7: 30000.0}}, seed=11))
    summ = summarize_dir(d, jobs=2)
    assert summ.aligned == "ranks compared over the steps all recorded (steps 1-6); cut: rank 1 step 7"
    assert sorted(reads.read_text().split()) == ["rank0.json", "rank1.json"]
    # the cut rank's summary is the one of its trace read afresh and cut
    raws = [_read(d / f"rank{r}.json") for r in (0, 1)]
    cut = plan_cuts([step_marks(raw) for raw in raws]).by_rank[1]
    want = summarize_window(cut_window(raws[1], cut), None)
    got = summ.sets[1]
    assert dataclasses.replace(want, world_size=got.world_size).to_bytes() == got.to_bytes()
    # and the uncut rank's, its whole window
    assert summ.sets[0].to_bytes() == dataclasses.replace(summarize_window(raws[0], None),
                                                          world_size=summ.sets[0].world_size).to_bytes()


@pytest.mark.parametrize("on", [True, False])
def test_gloo_groups_come_from_the_first_read(tmp_path: Path, reads: Path, monkeypatch: pytest.MonkeyPatch,
                                              on: bool) -> None:
    monkeypatch.setenv(ENV, "1" if on else "0")
    d = tmp_path / "gloo"
    d.mkdir()
    for r in range(4):
        shutil.copy(GLOO / f"clean_rank{r}.json", d / f"rank{r}.json")
    summ = summarize_dir(d, jobs=2)
    assert sorted(reads.read_text().split()) == [f"rank{r}.json" for r in range(4)]
    # with groups the data-parallel all-reduce of every rank is a collective of its group; without, none
    assert [bool(ps.comm) for ps in summ.sets] == [on] * 4


def test_a_window_not_kept_is_read_again_with_the_same_result(tmp_path: Path, reads: Path) -> None:
    d = write_job(tmp_path / "job", job_docs({0: STEPS, 1: [*STEPS, 7]}, {0: 4000.0, 1: 5000.0}, seed=3))
    trace = str(d / "rank1.json")
    kept = summarize_file(trace, False, "job", keep=str(tmp_path / "1.npz"))
    lost = summarize_file(trace, False, "job", keep=str(tmp_path / "no such dir" / "1.npz"))
    assert kept.kept and not lost.kept and lost.dropped and lost.dropped[0].startswith("window not kept")
    assert kept.data == lost.data
    cut = plan_cuts([kept.marks, summarize_file(str(d / "rank0.json"), False, "job").marks]).by_rank[1]
    n = len(reads.read_text().split())
    from_kept = summarize_kept(kept.kept, trace, False, "job", cut=cut)
    assert len(reads.read_text().split()) == n  # not read again
    assert summarize_kept(lost.kept, trace, False, "job", cut=cut) == from_kept
    assert len(reads.read_text().split()) == n + 1


def test_without_a_scratch_directory_the_cut_rank_is_read_again(tmp_path: Path, reads: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    d = write_job(tmp_path / "job", job_docs({0: STEPS, 1: [*STEPS, 7]}, {0: 4000.0, 1: 4000.0},
                                             {1: {7: 30000.0}}, seed=11))
    kept = summarize_dir(d, jobs=2)

    def no_tmp(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise PermissionError(13, "Permission denied", "/tmp")

    monkeypatch.setattr(tempfile, "TemporaryDirectory", no_tmp)
    (tmp_path / "reads.log").write_text("")
    again = summarize_dir(d, jobs=2)
    assert sorted(reads.read_text().split()) == ["rank0.json", "rank1.json", "rank1.json"]
    assert again.aligned == kept.aligned and [ps.to_bytes() for ps in again.sets] == [ps.to_bytes() for ps in kept.sets]
