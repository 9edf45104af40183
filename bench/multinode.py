"""Trigger-to-report time of a job across nodes against the same job on one node (issue 42).

The same 4-worker job (perftracker/examples/train.py, one rank slowed) runs as 2 emulated nodes x 2
workers (each node its own network namespace, host name, temp and working dir: bench/faultkit/nodes.py;
the job finds its one localizer through its rendezvous store) and as 1 node x 4 workers, alternating.
Each run waits until the job runs (and, across nodes, until the other node knows the job's localizer),
then times ``perftracker trigger --job JOB --window-s W`` from the second node (from the only node
on one node): the command returns once the report is stored. Its wall time minus the window is the
trigger-to-report time. Root and network namespaces are needed.

    python bench/multinode.py --runs 3

Last stdout line: {"runs_per_side", "window_s", "one_node_s", "two_nodes_s", "delta_s", "one_node_runs_s",
"two_nodes_runs_s", "every_rank_reported", "slow_rank_named"}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.faultkit.hosts import cleanup_stale, namespaces_available  # noqa: E402
from bench.faultkit.nodes import MultiNodeJob  # noqa: E402

SLOW = ["--iters", "100000", "--seed", "3", "--fault", "compute:where=forward,frac=1.0", "--fault-ranks", "3",
        "--fault-start-iter", "0"]


def one_run(root: Path, nodes: int, window_s: float) -> tuple[float, bool, bool]:
    """(trigger-to-report s minus the window, every rank reported, rank 3 named)."""
    env = {"PERFTRACKER_WINDOW_S": str(window_s), "PERFTRACKER_SLOWDOWN_THRESHOLD": "5"}
    with MultiNodeJob(root, nodes=nodes, per_node=4 // nodes, script_args=SLOW, extra_env=env) as job:
        job.wait_iterations(40, timeout_s=180)
        if nodes > 1:
            job.wait_linked()
        t0 = time.monotonic()
        res = job.nodes[-1].run(["perftracker", "trigger", "--job", job.job, "--window-s", str(window_s),
                                 "--timeout-s", "200"], timeout_s=240)
        wall_s = time.monotonic() - t0
        if res.returncode != 0:
            raise SystemExit(f"trigger failed: {res.stderr}\n{job.logs()}")
        rep = job.report_json(node=len(job.nodes) - 1)
        every = sorted(rep["ranks_reported"]) == [0, 1, 2, 3]
        named = bool(rep["findings"]) and 3 in rep["findings"][0]["ranks"] and len(rep["findings"][0]["ranks"]) < 4
    return wall_s - window_s, every, named


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3, help="runs per side, alternating (default %(default)s)")
    p.add_argument("--window-s", type=float, default=4.0, help="profile window (default %(default)s)")
    args = p.parse_args(argv)
    ok, why = namespaces_available()
    if not ok:
        raise SystemExit(f"bench/multinode.py needs network namespaces: {why}")
    cleanup_stale()
    one: list[float] = []
    two: list[float] = []
    every, named = True, True
    with tempfile.TemporaryDirectory(prefix="perftracker-multinode-") as tmp:
        for i in range(args.runs):
            for nodes, out in ((2, two), (1, one)) if i % 2 == 0 else ((1, one), (2, two)):
                s, e, n = one_run(Path(tmp) / f"run{i}-{nodes}", nodes, args.window_s)
                out.append(round(s, 2))
                every, named = every and e, named and n
                sys.stderr.write(f"run {i + 1}/{args.runs}, {nodes} node(s): {s:.2f} s trigger to report "
                                 f"(minus the window); every rank {e}, rank 3 named {n}\n")
    result = {"runs_per_side": args.runs, "window_s": args.window_s,
              "one_node_s": round(statistics.median(one), 2), "two_nodes_s": round(statistics.median(two), 2),
              "delta_s": round(statistics.median(two) - statistics.median(one), 2),
              "one_node_runs_s": one, "two_nodes_runs_s": two,
              "every_rank_reported": every, "slow_rank_named": named}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
