"""Critical path on hand-built timelines: exact β per function (docs/design.md section 5)."""

from __future__ import annotations

import numpy as np
import pytest
from perftracker.agent.summarize.critical_path import critical_ns
from perftracker.agent.summarize.summarizer import summarize_window
from perftracker.agent.summarize.timeline import nest, self_segments
from perftracker.agent.summarize.victims import REDUCER_WAIT

from perftracker.model import Category
from perftracker.model.raw_window import EventKind as K
from tests.rawbuild import TRAIN_TID as T
from tests.rawbuild import by_key, raw_window


def test_compute_overlapping_python_cpu_job() -> None:
    raw = raw_window([
        (K.PYTHON, "main", T, 0, 1000),
        (K.PYTHON, "f", T, 100, 600),
        (K.CPU_OP, "aten::mm", T, 200, 400),
    ])
    p = by_key(summarize_window(raw))
    assert p["aten::mm"].beta == pytest.approx(0.2)
    assert p["aten::mm"].category is Category.COMPUTE
    assert p["main;f"].beta == pytest.approx(0.3)  # self time: 500 - 200 under the op
    assert p["main"].beta == pytest.approx(0.5)
    assert p["main;f"].category is Category.PYTHON
    assert sum(x.beta for x in p.values()) == pytest.approx(1.0)


def test_compute_kernel_overlapping_python_gpu_job() -> None:
    raw = raw_window([
        (K.PYTHON, "main", T, 0, 1000),
        (K.PYTHON, "f", T, 100, 600),
        (K.CPU_OP, "aten::mm", T, 150, 250),  # host-side launch: self time of f on a GPU job
        (K.KERNEL, "volta_sgemm", 7, 300, 700, 0),
    ])
    p = by_key(summarize_window(raw))
    assert "aten::mm" not in p
    assert p["volta_sgemm"].beta == pytest.approx(0.4)
    assert p["main;f"].beta == pytest.approx(0.2)  # [100, 300): the kernel takes the rest
    assert p["main"].beta == pytest.approx(0.4)  # [0, 100) + [700, 1000)


def test_collective_partly_hidden_under_compute() -> None:
    raw = raw_window([
        (K.KERNEL, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 20, 200, 600, 0),
        (K.KERNEL, "gemm", 7, 100, 400, 0),
    ])
    p = by_key(summarize_window(raw))
    assert p["ncclDevKernel_AllReduce_Sum_f32_RING_LL"].category is Category.COLLECTIVE
    assert p["ncclDevKernel_AllReduce_Sum_f32_RING_LL"].beta == pytest.approx(0.2)  # only [400, 600) exposed
    assert p["gemm"].beta == pytest.approx(0.3)


def test_cpu_collective_hidden_under_compute_on_another_thread() -> None:
    raw = raw_window([
        (K.CPU_OP, "c10d::allreduce_", T, 0, 500),
        (K.CPU_OP, "aten::addmm", 7, 100, 300),
    ])
    p = by_key(summarize_window(raw))
    assert p["c10d::allreduce_"].beta == pytest.approx(0.3)
    assert p["aten::addmm"].beta == pytest.approx(0.2)


def test_nested_python_self_time_and_memory_priority() -> None:
    raw = raw_window([
        (K.PYTHON, "a", T, 0, 900),
        (K.PYTHON, "b", T, 100, 800),
        (K.PYTHON, "c", T, 200, 300),
        (K.PYTHON, "c", T, 400, 500),
        (K.CPU_OP, "aten::copy_", T, 600, 700),
    ])
    p = by_key(summarize_window(raw))
    assert p["a"].beta == pytest.approx(0.2)  # [0,100) + [800,900)
    assert p["a;b"].beta == pytest.approx(0.4)  # 700 - 2*100 - 100 under the copy
    assert p["a;b;c"].beta == pytest.approx(0.2)
    assert p["a;b;c"].executions == 2
    assert p["aten::copy_"].category is Category.MEMORY
    assert p["aten::copy_"].beta == pytest.approx(0.1)


def test_non_training_thread_python_is_excluded() -> None:
    raw = raw_window([
        (K.PYTHON, "train", T, 0, 500),
        (K.PYTHON, "threading.py(1): _bootstrap", 999, 0, 1000),
        (K.PYTHON, "worker_loop", 999, 0, 1000),
    ])
    p = by_key(summarize_window(raw))
    assert set(p) == {"train"}
    assert p["train"].beta == pytest.approx(0.5)


def test_concurrent_same_level_share_the_moment() -> None:
    raw = raw_window([(K.KERNEL, "k1", 7, 0, 400, 0), (K.KERNEL, "k2", 8, 200, 600, 0)])
    p = by_key(summarize_window(raw))
    assert p["k1"].beta == pytest.approx(0.3)
    assert p["k2"].beta == pytest.approx(0.3)


def test_gc_is_its_own_function() -> None:
    raw = raw_window([(K.PYTHON, "step", T, 0, 1000), (K.GC, "Python GC", T, 300, 450)])
    p = by_key(summarize_window(raw))
    assert p["Python GC"].beta == pytest.approx(0.15)
    assert p["step"].beta == pytest.approx(0.85)


def test_window_clips_events() -> None:
    raw = raw_window([(K.CPU_OP, "aten::mm", T, -500, 250)], window=(0, 1000))
    assert by_key(summarize_window(raw))["aten::mm"].beta == pytest.approx(0.25)


def test_reducer_wait_inside_run_backward_is_collective() -> None:
    rb = "<built-in method run_backward of torch._C._EngineBase object at 0x7f00>"
    raw = raw_window([
        (K.PYTHON, "step", T, 0, 1000),
        (K.PYTHON, rb, T, 100, 900),
        (K.CPU_OP, "aten::mm", T, 150, 250),
        (K.CPU_OP, "c10d::allreduce_", T, 250, 300),
        (K.CPU_OP, "aten::mm", T, 300, 350),  # last gradient, after the launch
        (K.CPU_OP, "torch.distributed.ddp.reducer::copy_bucket_to_grad", T, 800, 850),
    ])
    p = by_key(summarize_window(raw))
    wait = p[REDUCER_WAIT]
    assert wait.category is Category.COLLECTIVE
    assert wait.beta == pytest.approx(0.45)  # [300, 800) minus the op [300, 350)
    engine = p["step;<built-in method run_backward of torch._C._EngineBase object>"]
    assert engine.beta == pytest.approx(0.1)  # [100,150) + [850,900)
    assert p["aten::mm"].beta == pytest.approx(0.15)


def test_no_collective_no_reattribution() -> None:
    raw = raw_window([
        (K.PYTHON, "<built-in method run_backward of X>", T, 0, 1000),
        (K.CPU_OP, "aten::mm", T, 100, 200),
    ])
    p = by_key(summarize_window(raw))
    assert REDUCER_WAIT not in p
    assert p["<built-in method run_backward of X>"].beta == pytest.approx(0.9)


def test_sweep_is_vectorized_and_exact_at_scale() -> None:
    rng = np.random.default_rng(0)
    n = 200_000
    s = np.sort(rng.integers(0, 10**9, n))
    e = s + rng.integers(1, 5000, n)
    lv = rng.integers(0, 4, n)
    crit = critical_ns(s, e, lv, 0, 10**9 + 10000)
    # independent check on a dense grid for a small slice of time
    lo, hi = 10**6, 10**6 + 20000
    grid = np.arange(lo, hi)
    sel = np.flatnonzero((s < hi) & (e > lo))
    act = (s[sel, None] <= grid) & (grid < e[sel, None])
    best = np.where(act, lv[sel, None], 9).min(axis=0)
    share = np.where(act & (lv[sel, None] == best), 1.0, 0.0)
    share /= np.maximum(share.sum(axis=0), 1)
    inside = sel[(s[sel] >= lo) & (e[sel] <= hi)]
    got = crit[inside]
    want = share[np.isin(sel, inside)].sum(axis=1)
    np.testing.assert_allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("child_end_ns, outer", [(5_000_740, 0), (5_000_741, 0), (5_000_742, 1), (5_002_000, 1)])
def test_frames_that_start_together_nest_in_writing_order_within_a_microsecond(child_end_ns: int, outer: int) -> None:
    """``<module>`` (written first) and ``main`` clipped to one start by a step cut, ``main`` read
    to end 1-2 ns after ``<module>`` (a decimal µs read as a float): ``<module>`` stays outermost.
    Ending 3 ns or more later, the longer one is outermost, as before."""
    start = np.array([100, 100], dtype=np.int64)
    end = np.array([5_000_739, child_end_ns], dtype=np.int64)
    n = nest(np.zeros(2, dtype=np.int64), start, end)
    assert n.parent.tolist() == ([-1, 0] if outer == 0 else [1, -1])


def test_nest_and_self_segments() -> None:
    start = np.array([0, 10, 20, 50, 0], dtype=np.int64)
    end = np.array([100, 40, 30, 60, 5], dtype=np.int64)
    group = np.array([1, 1, 1, 1, 2])
    n = nest(group, start, end)
    assert n.parent.tolist() == [-1, 0, 1, 0, -1]
    assert n.depth.tolist() == [0, 1, 2, 1, 0]
    seg = self_segments(start, end, n.parent)
    per = np.bincount(seg.owner, weights=seg.end_ns - seg.start_ns, minlength=5)
    assert per.tolist() == [60, 20, 10, 10, 5]


def test_reducer_wait_with_sampled_stacks_and_nested_engine_frames() -> None:
    wrapper = "torch/autograd/graph.py(829): _engine_run_backward"
    raw = raw_window([
        (K.PYTHON, "step", T, 0, 1000),
        (K.PYTHON, wrapper, T, 100, 950),
        (K.PYTHON, "<built-in method run_backward of torch._C._EngineBase object at 0x1>", T, 110, 900),
        (K.CPU_OP, "c10d::allreduce_", T, 200, 250),
    ])
    p = by_key(summarize_window(raw))
    assert p[REDUCER_WAIT].executions == 1
    assert p[REDUCER_WAIT].beta == pytest.approx(0.65)  # [250, 900): to the end of the innermost call
    # a stack sampler sees only the Python wrapper: the rule still applies
    sampled = raw_window([
        (K.PYTHON, "step", T, 0, 1000),
        (K.PYTHON, wrapper, T, 100, 950),
        (K.CPU_OP, "c10d::allreduce_", T, 200, 250),
    ])
    assert by_key(summarize_window(sampled))[REDUCER_WAIT].beta == pytest.approx(0.7)


COPY = "torch.distributed.ddp.reducer::copy_bucket_to_grad"


def test_reducer_wait_spans_every_bucket_of_the_finalize() -> None:
    # finalize_backward waits for bucket 1, copies it back, then waits for bucket 2 and copies it:
    # the wait goes on between the two copy-backs (measured on the 4-rank fault bench: 2 buckets)
    wrapper = "torch/autograd/graph.py(966): _engine_run_backward"
    raw = raw_window([
        (K.PYTHON, "step", T, 0, 1000),
        (K.PYTHON, wrapper, T, 100, 900),
        (K.CPU_OP, "c10d::allreduce_", T, 150, 200),  # bucket 1
        (K.CPU_OP, "c10d::allreduce_", T, 250, 300),  # bucket 2 (last launch)
        (K.CPU_OP, COPY, T, 500, 520),  # bucket 1 back
        (K.CPU_OP, "aten::copy_", T, 502, 518),
        (K.CPU_OP, COPY, T, 700, 750),  # bucket 2 back, after a second wait
        (K.CPU_OP, "aten::copy_", T, 701, 749),
    ])
    p = by_key(summarize_window(raw))
    assert p[REDUCER_WAIT].beta == pytest.approx(0.38)  # [300, 750) minus the copies (20 + 50)
    assert p["step;" + wrapper].beta == pytest.approx(0.05 + 0.05 + 0.15)  # [100,150)+[200,250)+[750,900)
    assert p["aten::copy_"].category is Category.MEMORY


def test_reducer_wait_when_the_sampled_engine_frame_ends_before_the_last_copy() -> None:
    # a stack sampler places the engine frame's end at a sample edge: here the second bucket's
    # copy-back (and the optimizer op after it) lie past it; the wait must still cover the frame
    wrapper = "torch/autograd/graph.py(966): _engine_run_backward"
    raw = raw_window([
        (K.PYTHON, "step", T, 0, 1000),
        (K.PYTHON, wrapper, T, 100, 800),
        (K.PYTHON, "sgd.py(105): step", T, 800, 1000),
        (K.CPU_OP, "c10d::allreduce_", T, 150, 200),
        (K.CPU_OP, "c10d::allreduce_", T, 250, 300),
        (K.CPU_OP, COPY, T, 500, 520),
        (K.CPU_OP, COPY, T, 810, 830),
        (K.CPU_OP, "aten::add_", T, 850, 900),  # the optimizer: not part of the finalize
    ])
    p = by_key(summarize_window(raw))
    assert p[REDUCER_WAIT].beta == pytest.approx(0.48)  # [300, 800) minus the first copy
    assert p["step;" + wrapper].beta == pytest.approx(0.1)  # only [100,150)+[200,250)


def test_reducer_wait_splits_into_steady_part_and_late_peers() -> None:
    # 10 iterations: the wait after the last launch is 100 ns in 8 of them (the communication, or a
    # peer late every time) and 300 / 500 ns when some peer was late this once (host contention)
    from perftracker.agent.summarize.victims import LATE_PEERS_WAIT

    wrapper = "torch/autograd/graph.py(966): _engine_run_backward"
    waits = [100, 100, 300, 100, 100, 100, 500, 100, 100, 100]
    events, t = [(K.PYTHON, "step", T, 0, 10_000)], 0
    for w in waits:
        events += [(K.PYTHON, wrapper, T, t + 10, t + 70 + w),
                   (K.CPU_OP, "c10d::allreduce_", T, t + 20, t + 60)]
        t += 1000
    p = by_key(summarize_window(raw_window(events, window=(0, 10_000))))
    steady, late = p[REDUCER_WAIT], p[LATE_PEERS_WAIT]
    assert steady.executions == 10 and steady.critical_ns == 10 * 110  # launch end + 10 ... engine end
    assert late.executions == 2 and late.critical_ns == 200 + 400
    assert steady.category is late.category is Category.COLLECTIVE
    # switched off: one function, as before
    from perftracker.agent.summarize.summarizer import SummarizeOptions

    off = by_key(summarize_window(raw_window(events, window=(0, 10_000)), None,
                                  SummarizeOptions(split_late_peers=False)))
    assert LATE_PEERS_WAIT not in off and off[REDUCER_WAIT].critical_ns == sum(waits) + 10 * 10


def test_late_peers_wait_is_never_unexpected_on_cpu() -> None:
    from perftracker.agent.summarize.victims import LATE_PEERS_WAIT
    from perftracker.localizer.diagnose.method.expect import OPEN_BOX, load_expectations

    exp = load_expectations(None, "cpu")
    assert exp.lookup(LATE_PEERS_WAIT, LATE_PEERS_WAIT, Category.COLLECTIVE)[0] == OPEN_BOX
    assert exp.lookup(REDUCER_WAIT, REDUCER_WAIT, Category.COLLECTIVE)[0].hi.beta == 0.5


def test_gpu_trace_without_stacks_backward_host_work_is_on_the_autograd_thread() -> None:
    # CUDA backward: the training thread only shows its annotation while the autograd engine's
    # device thread (tid 200) runs the ops that launch the kernels; the GPU idles in between
    eng = 200
    raw = raw_window([
        (K.ANNOTATION, "## backward ##", T, 0, 1000),
        (K.CPU_OP, "autograd::engine::evaluate_function: MmBackward0", eng, 100, 400),
        (K.CPU_OP, "aten::mm", eng, 150, 350),
        (K.CPU_OP, "autograd::engine::evaluate_function: AddBackward0", eng, 500, 800),
        (K.KERNEL, "gemm", 7, 300, 600, 0),
    ], window=(0, 1000))
    p = by_key(summarize_window(raw))
    assert p["gemm"].beta == pytest.approx(0.3)
    # the annotation keeps only the engine's gaps: [0,100) + [400,500) minus the kernel + [800,1000)
    assert p["## backward ##"].beta == pytest.approx(0.1 + 0.0 + 0.2)
    assert p["## backward ##;autograd::engine::evaluate_function: AddBackward0"].beta == pytest.approx(0.2)
    assert p["## backward ##"].category is Category.PYTHON  # host frames of a trace without stacks
    # a thread that runs no autograd engine op stays out (e.g. a data-loader pin thread)
    other = raw_window([
        (K.ANNOTATION, "## backward ##", T, 0, 1000),
        (K.CPU_OP, "aten::copy_", 300, 100, 400),
        (K.KERNEL, "gemm", 7, 300, 600, 0),
    ], window=(0, 1000))
    assert by_key(summarize_window(other))["## backward ##"].beta == pytest.approx(0.7)


def test_gc_pause_is_a_leaf_that_outranks_the_frames_it_interrupts() -> None:
    # measured on the gc-stall bench: the stack sampler cannot run during a 470 ms collection, so
    # the sampled frames of the stack that triggered it start 1 ms after the pause does; nested
    # under the pause they had taken it all as Python self time of perftracker's gc callback
    raw = raw_window([
        (K.PYTHON, "main", T, 0, 1000),
        (K.GC, "Python GC", T, 200, 700),
        (K.PYTHON, "_gc_stall", T, 210, 720),
        (K.PYTHON, "_callback", T, 210, 720),
    ], window=(0, 1000))
    p = by_key(summarize_window(raw))
    assert p["Python GC"].beta == pytest.approx(0.5)
    assert p["main;_gc_stall;_callback"].beta == pytest.approx(0.02)  # [700, 720)
    assert p["main"].beta == pytest.approx(0.48)
    assert sum(x.beta for x in p.values()) == pytest.approx(1.0)
