"""What fixing the report's causes would save (issue 28; localizer/diagnose/verdict/savings.py): several
culprits together, a slow InfiniBand port whose peers share its every instance, and how the
sentences and the renderers say it.

The jobs are test_step_record's DP2 x PP2 model (four ranks timed together by their dependencies:
per step each computes 100 µs by default, sends to its pipeline partner, 5 µs, and all-reduces with
its data-parallel peer, 20 µs after the later arrives), summarized by the real summarizer.
"""

from __future__ import annotations

import dataclasses
import io
import json

import jsonschema
import numpy as np
import pytest
from perftracker.localizer.diagnose.localize import localize_arrays
from perftracker.localizer.diagnose.method.arrays import FunctionInfo
from perftracker.localizer.diagnose.verdict.savings import link_scale, said, together
from perftracker.localizer.render import html as html_render
from perftracker.localizer.render import json as json_render
from perftracker.localizer.render import text as text_render

from perftracker.model import Category, Report
from perftracker.model.hardware import IB_WAIT_KEY
from tests.unit.test_step_record import _job_arrays

PERIOD_US = 325.0  # 300 µs of compute + 5 + 20


@pytest.mark.parametrize("late3, alone0", [(300.0, 0.0), (200.0, 100.0 / PERIOD_US)])
def test_culprits_that_hold_each_other_up_save_together_what_neither_saves_alone(late3: float, alone0: float) -> None:
    """Rank 0 (stage 0) computes 300 µs, rank 3 (stage 1) ``late3``: every all-reduce waits for the
    later of them, so fixing one saves only down to the other; fixing both brings the step from 325
    to 125 µs."""
    report = localize_arrays(_job_arrays({0: 300.0, 3: late3}))
    by_rank = {f.ranks: f for f in report.findings}
    assert set(by_rank) >= {(0,), (3,)}
    assert by_rank[(0,)].saves_share == pytest.approx(alone0, abs=0.02)
    assert by_rank[(3,)].saves_share == pytest.approx(0.0, abs=0.02)
    joint = report.saves_together
    assert joint is not None and joint.ranks == (0, 3) and joint.basis.startswith("replayed over ")
    assert joint.saves_share == pytest.approx(200.0 / PERIOD_US, abs=0.02)


def test_one_culprit_has_no_joint_saving() -> None:
    report = localize_arrays(_job_arrays({0: 300.0}))
    assert [f.ranks for f in report.findings if f.kind != "common"] == [(0,)]
    assert report.saves_together is None
    assert together(_job_arrays({0: 300.0}), report.findings) is None


def _with_port_stall(arr, stall: dict[int, float]):  # type: ignore[no-untyped-def]
    """``arr`` with each rank's InfiniBand port pattern: β its collective share, μ its stall share."""
    row = np.zeros((1, 3, arr.ranks.size))
    row[0, 0, :] = 0.3
    row[0, 1, :] = [stall.get(int(r), 0.004) for r in arr.ranks]
    info = FunctionInfo(key=IB_WAIT_KEY, label=IB_WAIT_KEY, category=Category.COLLECTIVE, resource="ib_xmit_wait")
    return dataclasses.replace(arr, functions=(*arr.functions, info), values=np.concatenate([arr.values, row]))


@pytest.mark.parametrize("stall, scale", [(0.98, 0.02 / 0.996), (0.5, 0.5 / 0.996), (0.01, 0.99 / 0.996),
                                          (0.004, None), (0.001, None)])
def test_a_stalled_port_takes_the_share_of_its_transfers_a_port_stalled_like_its_peers_would(
        stall: float, scale: float | None) -> None:
    """Peers stall 0.4% of their active time: a port stalled ``stall`` would send the same bytes in
    (1 - stall) / (1 - 0.004) of its time; one stalled no more than its peers has nothing to give."""
    arr = _with_port_stall(_job_arrays({}), {0: stall})
    report = localize_arrays(_job_arrays({0: 300.0}))
    port = dataclasses.replace(report.findings[0], key=IB_WAIT_KEY, category=Category.COLLECTIVE, ranks=(0,))
    got = link_scale(arr, port, 0)
    assert (got is None) if scale is None else got == pytest.approx(scale, abs=1e-6)
    assert link_scale(arr, dataclasses.replace(port, key="ncclDevKernel_AllReduce_Sum_f32"), 0) is None


def test_the_sentence_says_the_saving_once_and_only_from_one_percent() -> None:
    arr = _job_arrays({0: 300.0})
    report = localize_arrays(arr)
    f = report.findings[0]
    assert f.sentence.count("fixing it would save") == 1 and report.summary.startswith(f.sentence)
    bare = dataclasses.replace(f, sentence="rank 0 computes longer", saves_basis="replayed over 5 steps")
    assert said(arr, [dataclasses.replace(bare, saves_share=0.011)])[0].sentence.endswith(
        "; fixing it would save about 1.1% of the window")
    assert said(arr, [dataclasses.replace(bare, saves_share=0.009)])[0].sentence == "rank 0 computes longer"


def test_the_joint_saving_travels_validates_and_is_shown() -> None:
    report = localize_arrays(_job_arrays({0: 300.0, 3: 300.0}))
    assert report.saves_together is not None
    buf = io.StringIO()
    json_render.render(report, buf)
    doc = json.loads(buf.getvalue())
    errors = list(jsonschema.Draft202012Validator(json_render.load_schema()).iter_errors(doc))
    assert not errors, errors[0]
    assert Report.from_dict(doc).saves_together == report.saves_together
    shown = f"ranks 0,3 together: about {round(100 * report.saves_together.saves_share)}% of the window"
    text = io.StringIO()
    text_render.render(report, text, width=200)
    assert shown in text.getvalue()
    page = io.StringIO()
    html_render.render(report, page)
    assert shown in page.getvalue()
