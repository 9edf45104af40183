"""Issue 32: a finding's title (at most 120 characters), evidence, next steps by cause kind; the
report's headline; the step picture's lanes; --brief; schema version 2."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
from perftracker.localizer.diagnose.evidence.host_bound import HOST_KEY, IDLE_KEY
from perftracker.localizer.diagnose.localize import localize
from perftracker.localizer.diagnose.verdict.group_findings import MOVING_KEY, STAGE_KEY
from perftracker.localizer.diagnose.words.headline import (
    MAX_TITLE_CHARS,
    cause_clause,
    dress,
    fit,
    longest_step_note,
    report_headline,
    short_label,
    title_of,
)
from perftracker.localizer.diagnose.words.next_steps import CAUSES, cause_kind, next_steps
from perftracker.localizer.render import html
from perftracker.localizer.render.facts import baseline_ms, brief_lines, trigger_text
from perftracker.localizer.render.json import load_schema

from perftracker.model import (
    Box,
    Category,
    Finding,
    Pattern,
    PatternSet,
    Report,
    Triple,
    Wait,
)
from perftracker.model.trigger import Detection

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
OPEN = Box(Triple(0, 0, 0), Triple(1, 1, 1))

# one cause clause per cause kind, as the localizer's sentences say them
CAUSE_TEXT = {
    "stage_imbalance": "pipeline stage 3 computes 2.00× stage 2",
    "moving_straggler": "no single culprit: the slowest rank changes from step to step",
    "slow_processor": "slow or throttled GPU",
    "throttled_gpu": "GPU clocks throttled (thermal slowdown)",
    "cpu_starvation": "CPU starvation: other processes take the rank's cores",
    "load_imbalance": "more work or a slower GPU on these ranks (load imbalance)",
    "pcie_fallback": "peer traffic falls back from NVLink to PCIe",
    "slow_copy": "slow copies (PCIe link, unpinned host memory)",
    "slow_link": "slow interconnect (NIC/NVLink) on these ranks, or waiting on a slower peer",
    "host_bound": "the job is host-bound: CPU-side op dispatch, data loading and Python between kernels leave the GPU idle",
    "input_pipeline": "slow input pipeline/storage",
    "sleep": "the process sleeps on the critical path",
    "host_stall": "the host thread stalls outside the traced ops (a blocking call, I/O, a lock, a sleep)",
    "outside_profile": "the cause is not among the profiled functions (it starts late)",
    "late_arrival": "these ranks arrive last at the collective: the others wait for them",
    "random_pattern": "a random per-worker pattern (Python work on the critical path while the GPU waits)",
    "python_work": "Python work on the critical path while the GPU waits",
    "unusual": "unusual GPU behavior on these ranks",
}
LONG_KERNEL = ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>"
               "(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8::Params, unsigned long)")


def _finding(cause: str, *, key: str = "k", label: str = "aten::bmm", ranks: tuple[int, ...] = (2,),
             kind: str = "specific", tests: tuple[str, ...] = ("differential",), beta: float = 0.15,
             median_beta: float = 0.0, waits: tuple[Wait, ...] = (), category: Category = Category.COMPUTE,
             saves: float = 0.0) -> Finding:
    return Finding(key=key, label=label, category=category, ranks=ranks, kind=kind, tests=tests,
                   observed=Triple(beta, 0.68, 0.1), median=Triple(median_beta, 0.0, 0.0), expected=OPEN,
                   sentence=f"rank 2: something — {cause}; ranks 0-1,3 wait for it 18% of the window in x",
                   impact=0.3, impact_s=0.6, waits=waits, saves_share=saves, saves_s=saves * 2)


def test_every_cause_kind_has_a_row_a_sentence_that_names_it_and_next_steps() -> None:
    assert set(CAUSE_TEXT) == {c.kind for c in CAUSES}
    for kind, text in CAUSE_TEXT.items():
        assert cause_kind(text) == kind, (kind, text)
        assert next_steps(kind) and all(step.strip() for step in next_steps(kind))
    assert cause_kind("something nobody wrote a row for") == "unknown"
    assert next_steps("unknown")  # the generic steps, never nothing
    # near each other: the slow-processor clause is not load imbalance, load imbalance is not a slow GPU
    assert cause_kind("slow or throttled processor") == "slow_processor"
    assert cause_kind("more work or a slower processor on these ranks (load imbalance)") == "load_imbalance"
    assert cause_kind("unusual PCIe traffic, e.g. peer copies falling back from NVLink to PCIe") == "pcie_fallback"
    assert cause_kind("slow copies (PCIe link, unpinned host memory)") == "slow_copy"
    # a CPU quota is "throttling" too: CPU starvation, not a throttled GPU (expected.toml's own hints)
    assert cause_kind("CPU starvation: a CPU quota (cgroup throttling) or other processes on the rank's cores") \
        == "cpu_starvation"
    assert cause_kind("throttled GPU: its SM clock is below its maximum") == "throttled_gpu"


@pytest.mark.parametrize("kind", sorted(CAUSE_TEXT))
def test_titles_fit_for_every_cause_with_long_rank_lists_and_long_names(kind: str) -> None:
    scattered = tuple(range(0, 4096, 3))  # 1,366 ranks, no range compresses them
    waits = (Wait(LONG_KERNEL, tuple(r for r in range(4096) if r % 3), 0.18),)
    key = {"stage_imbalance": STAGE_KEY, "moving_straggler": MOVING_KEY, "host_bound": HOST_KEY,
           "host_stall": IDLE_KEY}.get(kind, LONG_KERNEL)
    for ranks, label, w in (((2,), "aten::bmm", ()), (scattered, LONG_KERNEL, waits),
                            ((5, 9, 17, 33, 65, 129, 257, 513, 1025, 2049), LONG_KERNEL * 3, waits)):
        f = _finding(CAUSE_TEXT[kind], key=key, label=label, ranks=ranks, waits=w, saves=0.21)
        dressed = dress(f, 4096)
        assert len(dressed.title) <= MAX_TITLE_CHARS, dressed.title
        assert dressed.cause == kind
        assert dressed.next_steps == next_steps(kind)
        assert any(line.startswith("test: differential") for line in dressed.evidence)
        pattern = "compute (β summed" if key in (STAGE_KEY, MOVING_KEY) else "β (share of the window"
        assert any(line.startswith(pattern) for line in dressed.evidence)
        assert "::Params" not in dressed.title  # no C++ argument lists
        if w:
            assert any(line.startswith("waits: ") for line in dressed.evidence)


def test_a_short_title_keeps_who_what_cost_waits_and_cause() -> None:
    f = _finding(CAUSE_TEXT["load_imbalance"], waits=(Wait("ddp.reducer::wait", (0, 1, 3), 0.18),))
    title, kind = title_of(f, 4)
    # β alone cannot tell more work from a slower device: the title leaves it open, as the sentence does
    assert title == ("rank 2 runs extra aten::bmm (15% of the window, others 0%); ranks 0-1,3 wait 18% for it — "
                     "more work or a slower GPU")
    assert kind == "load_imbalance"
    saved = dataclasses.replace(f, saves_share=0.2)
    assert title_of(saved, 4)[0].endswith("— more work or a slower GPU; fixing it saves ~20% of the window")
    plain = dataclasses.replace(f, sentence="rank 2: x — a data-dependent load imbalance")
    assert title_of(plain, 4)[0].endswith("— load imbalance")
    # the twin below the 1% floor says nothing of saving
    assert "saves" not in title_of(dataclasses.replace(f, saves_share=0.009), 4)[0]


def test_a_title_at_the_limit_drops_clauses_before_it_cuts() -> None:
    f = _finding(CAUSE_TEXT["load_imbalance"], label="x" * 40, waits=(Wait("w", tuple(range(0, 60, 2)), 0.18),),
                 saves=0.3)
    title, _ = title_of(f, 64)
    # issue 47: the saving is kept (in fewer words) after the waits are dropped, never cut
    assert len(title) <= 120 and title.endswith("— more work or a slower GPU; saves ~30% of the window")
    assert "…" not in title and "wait" not in title
    assert len(title_of(f, 64, limit=60)[0]) <= 60


def test_health_patterns_read_as_measures_not_time_spent() -> None:
    from perftracker.model.hardware import GPU_CLOCK_KEY, IB_WAIT_KEY

    waits = (Wait("AllReduce", (0, 1, 3), 0.32),)
    clock = _finding("throttled GPU: its SM clock is below its maximum", key=GPU_CLOCK_KEY,
                     label="GPU SM clock 1.10 of 1.98 GHz (thermal slowdown)", waits=waits)
    title, kind = title_of(clock, 4)
    assert title == "rank 2: GPU SM clock 1.10 of 1.98 GHz (thermal slowdown); ranks 0-1,3 wait 32% for it — throttled GPU"
    assert kind == "throttled_gpu" and "spends" not in title
    port = dataclasses.replace(_finding("slow or congested InfiniBand link at this port", key=IB_WAIT_KEY,
                                        label=IB_WAIT_KEY, ranks=(1, 6)),
                               observed=Triple(0.6, 0.3, 0.1), median=Triple(0.5, 0.01, 0.0))
    title, kind = title_of(port, 8)
    assert title == "ranks 1,6: InfiniBand port wait (port_xmit_wait) 30% (others 1%) — slow link" and kind == "slow_link"
    evidence = dress(port, 8).evidence
    # the measure the title states is the evidence's first fact; its β (the category's time: 60% on
    # these ranks against the median rank's 50%) is not shown, so nothing contradicts the title
    assert evidence[:2] == ("measure: InfiniBand port wait (port_xmit_wait)",
                            "μ (the measure): 30% on ranks 1,6; median rank 1%")
    assert not any(line.startswith(("β", "function:")) for line in evidence)
    # a function's evidence keeps its β line; an open range says nothing ("expected any" read as jargon)
    plain = dress(_finding("more work or a slower processor on these ranks (load imbalance)"), 4).evidence
    assert plain[0] == "function: compute aten::bmm" and plain[1].startswith("β (share of the window")
    assert "expected" not in plain[1]


def test_a_generic_aten_kernel_is_named_with_the_operation_it_runs() -> None:
    sqrt = ("void at::native::vectorized_elementwise_kernel<4, at::native::sqrt_kernel_cuda(at::TensorIteratorBase&)"
            "::{lambda()#2}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2> >(int, "
            "at::native::sqrt_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}, at::detail::Array<char*, 2>)")
    assert short_label(sqrt) == "vectorized_elementwise_kernel (sqrt)"
    mul = ("void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, "
           "at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 3> >(int, int)")
    assert short_label(mul) == "vectorized_elementwise_kernel (Mul)"  # the wrapper BinaryFunctor is not the op
    mean = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, "
            "float, float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float, "
            "float, float>, unsigned int, float, 4>)")
    assert short_label(mean) == "at::native::reduce_kernel (Mean)"
    # twins: a kernel whose template names no operation, and one without templates, stay as they were
    assert short_label("void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, unsigned int, 2, "
                       "2, -2, true>(at::cuda::detail::TensorInfo<float, unsigned int>, int, long)") == \
        "at::native::indexSelectLargeIndex"
    assert short_label("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_nt") == \
        "ampere_bf16_s16816gemm_bf1…tages_64x3_nt"


def test_fit_and_short_label() -> None:
    assert fit("a" * 120) == "a" * 120
    assert fit("x" * 70 + "; " + "b" * 200) == "x" * 70  # cut at the last clause that fits
    assert fit("x" * 20 + "; " + "b" * 200).endswith("…")  # a clause too short to stand alone: cut with "…"
    cut = fit("c" * 300)
    assert len(cut) == 120 and cut.endswith("…")
    assert short_label("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)") == \
        "ncclKernel_AllReduce_RING_LL_Sum_float"
    # a Python frame keeps its file and line (a bare name like the fault kit's `at` says little), its
    # innermost frame when it is a stack key, and only its name when the place does not fit
    assert short_label("/opt/venv/lib/python3.11/site-packages/torch/nn/module.py(1750): _call_impl") == \
        "_call_impl (module.py:1750)"
    assert short_label("/job/train.py(1): <module>;/t/torch/_tensor.py(566): backward") == "backward (_tensor.py:566)"
    assert short_label("/job/a_rather_long_module_name.py(12): a_rather_long_function_name") == \
        "a_rather_long_function_name"
    assert short_label(LONG_KERNEL) == "cutlass::Kernel2"  # no return type, templates or arguments
    assert short_label("void at::native::vectorized_elementwise_kernel<4, F<float>, A<char*, 1> >(int, F<float>)") == \
        "vectorized_elementwise_kernel"  # past 40 characters: without its namespaces
    assert short_label("Memcpy HtoD (Pageable -> Device)") == "Memcpy HtoD (Pageable -> Device)"  # words, not arguments
    long = short_label("x" * 80)
    assert len(long) == 40 and "…" in long
    grouped = short_label("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(a, b) [EMBEDDING_GROUP]")
    assert grouped.endswith(" [EMBEDDING_GROUP]") and len(grouped) <= 40 and "(" not in grouped
    assert cause_clause("rank 2: x — load imbalance; ranks wait") == "load imbalance"


def test_a_culprit_that_is_not_the_longest_step_says_why_and_its_twin_does_not() -> None:
    f = _finding(CAUSE_TEXT["host_stall"], ranks=(4, 5), waits=(Wait("AllReduce", (0, 1, 2, 3), 0.09),))
    steps = {0: (14.5,), 1: (19.9, 19.9), 4: (18.0,), 5: (17.8,)}
    note = longest_step_note(f, steps)
    assert note.startswith("longest steps: rank 1, 19.9 ms") and "others wait for these ranks" in note
    assert longest_step_note(f, {**steps, 5: (25.0,)}) == ""  # the culprit is the longest: nothing to explain
    assert longest_step_note(dataclasses.replace(f, kind="common"), steps) == ""
    # steps equal to the longest within 1% are the longest: 19.8 ms is 0.5% short of 19.9 ms, 19.6 ms 1.5%
    assert longest_step_note(f, {**steps, 5: (19.8,)}) == ""
    near = longest_step_note(f, {**steps, 5: (19.6,)})
    assert near.startswith("longest steps: rank 1, 19.9 ms (19.6 ms on ranks 4-5)")
    one = longest_step_note(dataclasses.replace(f, ranks=(4,)), steps)
    assert "(18.0 ms on rank 4)" in one


def test_report_headline_counts_the_others_and_fits() -> None:
    a = dress(_finding(CAUSE_TEXT["load_imbalance"], label="y" * 60, waits=(Wait("w", tuple(range(1, 90)), 0.2),)), 128)
    b = dress(_finding(CAUSE_TEXT["host_bound"], key=HOST_KEY, kind="common", ranks=tuple(range(128))), 128)
    head = report_headline([a, b], 128, "")
    assert head.endswith(" (+1 more)") and len(head) <= MAX_TITLE_CHARS
    assert report_headline([], 4, "no abnormal function on 4 ranks") == "no abnormal function on 4 ranks"


def _demo_report() -> Report:
    sets = [PatternSet.from_dict(d) for d in json.loads((FIXTURES / "demo_cpu_slow_rank2.patterns.json").read_text())]
    return localize(sets)


def test_the_demo_fixture_names_rank_2_in_a_short_headline_with_evidence_and_steps() -> None:
    report = _demo_report()
    assert report.findings and report.findings[0].ranks == (2,)
    assert report.headline.startswith("rank 2 ") and len(report.headline) <= MAX_TITLE_CHARS
    for f in report.findings:
        assert 0 < len(f.title) <= MAX_TITLE_CHARS and f.evidence and f.next_steps and f.cause
    d = report.to_dict()
    jsonschema.validate(d, load_schema())
    assert d["schema_version"] == 3 and d["findings"][0]["sentence"]  # the old sentence is kept (issue 47: 3)
    again = Report.from_dict(json.loads(json.dumps(d)))
    assert again.headline == report.headline and again.findings[0].evidence == report.findings[0].evidence
    assert [(x.rank, x.role) for x in again.step_lanes] == [(x.rank, x.role) for x in report.step_lanes]
    roles = [lane.role for lane in report.step_lanes]
    assert roles[0] == "culprit" and report.step_lanes[0].rank == 2 and roles[1] in ("waits", "typical")
    culprit, waiter = report.step_lanes[0], report.step_lanes[1]
    assert dict(waiter.parts)["waiting"] > dict(culprit.parts)["waiting"]  # the others wait for rank 2
    for lane in report.step_lanes:
        assert sum(ms for _, ms in lane.parts) == pytest.approx(lane.step_ms, rel=1e-6)


def test_a_version_1_report_is_read_and_shows_its_summary() -> None:
    d = _demo_report().to_dict()
    d["schema_version"] = 1
    for k in ("headline", "step_lanes"):
        del d[k]
    for f in d["findings"]:
        for k in ("title", "cause", "evidence", "next_steps"):
            del f[k]
    old = Report.from_dict(d)
    assert old.top_line == old.summary and old.findings[0].headline == old.findings[0].sentence
    assert old.to_dict()["schema_version"] == 3  # written as the current version (issue 47)
    d["schema_version"] = 4
    with pytest.raises(Exception, match="unsupported schema_version 4"):
        Report.from_dict(d)


def _pp_sets() -> list[PatternSet]:
    """A 2-stage pipeline of 4 ranks; rank 3 (stage 1) computes more, rank 2 waits for it."""
    out = []
    for r in range(4):
        compute = 0.7 if r == 3 else 0.4
        coll = 0.05 if r == 3 else 0.3
        out.append(PatternSet(job="j", session="s", rank=r, world_size=4, host=f"h{r}", window_start_ns=0,
                              window_end_ns=2_000_000_000, coords={"pp": r // 2, "dp": r % 2},
                              iteration_ms=(100.0,) * 10,
                              patterns=(Pattern("mm", Category.COMPUTE, compute, 0.9, 0.05, "mm"),
                                        Pattern("allreduce", Category.COLLECTIVE, coll, 0.2, 0.05, "allreduce"),
                                        Pattern("a.py:step", Category.PYTHON, 0.1, 0.5, 0.1, "step"))))
    return out


def test_step_lanes_show_one_rank_per_pipeline_stage() -> None:
    report = localize(_pp_sets())
    stages = {lane.role.rsplit("stage ", 1)[-1] for lane in report.step_lanes if "stage" in lane.role}
    assert stages == {"0", "1"}
    for lane in report.step_lanes:
        assert lane.step_ms == pytest.approx(100.0)
        parts = dict(lane.parts)
        assert parts["host"] == pytest.approx(10.0, abs=0.01)


def test_html_has_a_well_formed_step_picture_and_drops_an_empty_scatter() -> None:
    report = _demo_report()
    buf = io.StringIO()
    html.render(report, buf)
    page = buf.getvalue()
    assert page.count(report.headline.replace("&", "&amp;")) == 1  # the headline once
    svgs = re.findall(r"<svg .*?</svg>", page, re.DOTALL)
    step = [s for s in svgs if "one step of each chosen rank" in s]
    assert len(step) == 1
    root = ET.fromstring(step[0])  # well-formed XML
    assert sum(1 for e in root.iter() if e.tag.endswith("rect")) >= 2 * 3
    assert "What to check next" in page and "Evidence" in page
    f = report.findings[0]
    others_zero = dataclasses.replace(f, points=tuple((r, 0.0, 0.0) if r not in f.ranks else (r, b, m)
                                                      for r, b, m in f.points))
    others_run = dataclasses.replace(f, points=tuple((r, 0.1, 0.5) if r not in f.ranks else (r, b, m)
                                                     for r, b, m in f.points))
    assert not html.shows_something(others_zero) and html.shows_something(others_run)
    scatter = "beta against mu for every rank"
    assert scatter not in html._finding_section(others_zero, 4, True, 2)
    assert scatter in html._finding_section(others_run, 4, True, 2)


def test_trigger_reads_detected_on_and_brief_lists_titles() -> None:
    report = _demo_report()
    detection = Detection.from_detail(3, "slowdown", {"iteration": 268, "ratio": 1.49, "baseline_ms": 42.9,
                                                      "recent_ms": 63.9, "test": "cusum"})
    typed = dataclasses.replace(report, trigger=detection, trigger_reason="rank 3: whatever the sentence says")
    assert trigger_text(typed) == "slowdown at iteration 268 (+49% over 42.9 ms), detected on rank 3"
    assert baseline_ms(typed) == 42.9  # from the detection, not from a sentence
    untyped = dataclasses.replace(report, trigger=None, trigger_reason="hang: rank 0 blocked 5 s")
    assert trigger_text(untyped) == "hang: rank 0 blocked 5 s" and baseline_ms(untyped) is None
    lines = brief_lines(report)
    assert lines[0] == report.headline
    assert len(lines) == 1 + len(report.findings)
    assert all(f.title in line for f, line in zip(report.findings, lines[1:], strict=True))


def test_report_brief_cli_prints_only_headline_and_titles(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from perftracker.cli.main import main

    report = _demo_report()
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report.to_dict()))
    assert main(["report", "--file", str(path), "--brief"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == report.headline
    assert len(out) == 1 + len(report.findings) and "β" not in "\n".join(out)


@pytest.mark.parametrize("headline", [
    # the longest headlines the GPU benchmarks printed (120 characters, cut by fit or by clause)
    "rank 2 spends less in Peer traffic over PCIe (not NVLink) (8.8% vs 45%): the others… — slow host-device copies (+2 more)",
    "rank 4 spends 2.8× longer in Optimizer.step#Adagrad.step (2.1% vs 0.72%); rank 1 waits 14% for it — host-bound (+1 more)",
    "ranks 4-5 stall outside traced ops (6% vs 5.6% of the window); ranks 0-3,6-7 wait 9.4% for them — host stall (+2 more)",
])
def test_the_terminal_headline_fits_two_lines_at_80_columns(headline: str) -> None:
    from perftracker.localizer.render import text

    assert len(headline) <= MAX_TITLE_CHARS
    report = dataclasses.replace(_demo_report(), headline=headline)
    buf = io.StringIO()
    text.render(report, buf, color=False, width=80)
    lines = buf.getvalue().splitlines()
    body = lines[1:lines.index(next(x for x in lines[1:] if x.strip("│ ") == ""))]
    assert 1 <= len(body) <= 2, body
    assert all(len(x) <= 80 for x in lines)


def test_the_demo_headline_is_printed_once() -> None:
    from perftracker.localizer.render import text

    report = _demo_report()
    buf = io.StringIO()
    text.render(report, buf, color=False, width=200)
    assert buf.getvalue().count(report.headline) == 1


def test_an_incident_headline_keeps_file_and_line_not_the_whole_path() -> None:
    from perftracker.localizer.diagnose.words.headline import fit_incident

    summary = ("crash: rank 2 (pipeline stage 2 of 4) failed with RuntimeError: boom at iteration 30 "
               "at /very/long/checkout/of/the/users/job/tests/pipeline.py:67 in main; raised in "
               "<lib>/torch/distributed/pipelining/stage.py:900 in forward_one_chunk")
    head = fit_incident(summary)
    assert len(head) <= MAX_TITLE_CHARS and "at pipeline.py:67 in main" in head and "/very/long" not in head, head
    short = "hang: rank 1 stopped at job.py:3 in step"  # its twin: a short one is left as it is
    assert fit_incident(short) == short


def test_a_function_that_says_where_the_time_went_leads_the_next_steps_and_its_twin_does_not() -> None:
    host = next_steps("host_bound")
    opt = next_steps("host_bound", "Optimizer.step#Adagrad.step")
    assert opt[0].startswith("the optimizer step on the host") and opt[1:] == host
    assert next_steps("host_bound", "DistributedDataParallel.forward") == host  # no function row: the cause's steps
    assert next_steps("host_bound", "Python GC")[0].startswith("garbage collection")
    f = dress(_finding("the host", label="Optimizer.step#Adagrad.step", category=Category.PYTHON), 8)
    assert f.next_steps[0].startswith("the optimizer step on the host")


def test_a_costlier_finding_listed_lower_says_why_and_its_twin_does_not() -> None:
    from perftracker.localizer.diagnose.words.headline import order_note
    specific = dataclasses.replace(_finding("host stall"), impact=0.25)
    common = dataclasses.replace(_finding("host-bound", kind="common", ranks=(0, 1, 2, 3)), impact=0.49)
    assert "holds on most ranks" in order_note(common, [specific])
    assert order_note(dataclasses.replace(common, impact=0.2), [specific]) == ""  # cheaper below: in cost order
    assert "others wait for" in order_note(dataclasses.replace(specific, impact=0.3), [specific])
