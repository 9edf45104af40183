"""One worker's pattern set of a hand-built DP × PP GPU job (2 pipeline stages, rank r = 2·d + s:
stage s of data-parallel replica d), as the wait-graph tests build them: a GEMM, the pipeline's
send/recv in its ``pp{d}`` group and the data-parallel all-reduce in its ``dp{s}`` group, each β given."""

from __future__ import annotations

from perftracker.model import Category, Pattern, PatternSet, ProcessGroup


def dp_pp_set(r: int, n: int, gemm: float, sendrecv: float, allreduce: float) -> PatternSet:
    d, s = divmod(r, 2)
    groups = (ProcessGroup(f"pp{d}", "PIPELINE_MODEL_PARALLEL_GROUP", (2 * d, 2 * d + 1), True),
              ProcessGroup(f"dp{s}", "DATA_PARALLEL_GROUP", tuple(range(s, n, 2))))
    pats = (Pattern("gemm", Category.COMPUTE, gemm, 0.0, 0.0, "gemm"),
            Pattern("nccl:send_recv", Category.COLLECTIVE, sendrecv, 0.0, 0.0, "nccl:send_recv"),
            Pattern("nccl:all_reduce", Category.COLLECTIVE, allreduce, 0.0, 0.0, "nccl:all_reduce"))
    return PatternSet("j", "s", r, n, f"h{r}", 0, 10**9, pats, source="kineto", gpu=True, groups=groups,
                      comm={"nccl:send_recv": (f"pp{d}",), "nccl:all_reduce": (f"dp{s}",)})
