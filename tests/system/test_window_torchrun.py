"""Must-show: on a real 2-worker torchrun job (gloo), one trigger gives one raw-event file per rank
plus procfs samples covering each rank's window, through the worker's own path (no agent)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from perftracker.model.raw_window import EventKind, RawWindow, SampleSet

JOB = textwrap.dedent("""\
    import os, sys, time
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    import perftracker
    from perftracker.config import Config
    from perftracker.runtime.window.local import LocalWindowSink

    out_dir = sys.argv[1]
    dist.init_process_group("gloo")
    rt = perftracker.activate(Config.from_env(autostart_agent=False))
    sink = LocalWindowSink(rt, out_dir, window_s=1.0)
    rt.set_sink(sink)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(200000, 32)), batch_size=16)
    deadline = time.monotonic() + 60
    for i, (x,) in enumerate(data):
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        time.sleep(0.005)
        if i == 5:
            assert perftracker.trigger("manual")
        flag = torch.tensor([1 if sink.results or time.monotonic() > deadline else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # stop together once every rank has its file
        if flag.item():
            break
    res = sink.results[0]
    line = " ".join(map(str, ("RESULT", dist.get_rank(), res.session, res.raw_path, res.samples_path,
                              repr(res.error), i)))
    os.write(1, (line + "\\n").encode())  # one write: the ranks share stdout
    dist.destroy_process_group()
    """)


def test_trigger_gives_one_raw_file_per_rank_with_samples(tmp_path: Path, free_port: int,
                                                          clean_env: dict[str, str]) -> None:
    job = tmp_path / "job.py"
    job.write_text(JOB)
    out_dir = tmp_path / "windows"
    env = {**clean_env, "PERFTRACKER_AUTOSTART_AGENT": "0", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_port", str(free_port), str(job), str(out_dir)],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    results = [line.split() for line in r.stdout.splitlines() if line.startswith("RESULT")]
    assert sorted(int(x[1]) for x in results) == [0, 1], r.stdout
    assert all(x[5] == "''" for x in results), results
    assert len({x[2] for x in results}) == 1  # both ranks: the same session
    raws = sorted(out_dir.glob("*.raw.npz"))
    assert len(raws) == 2 and {p.name.rsplit("-rank", 1)[1] for p in raws} == {"0.raw.npz", "1.raw.npz"}
    assert len({p.name.rsplit("-rank", 1)[0] for p in raws}) == 1
    pids = set()
    for rank, raw_path in enumerate(sorted(raws, key=lambda p: p.name)):
        raw = RawWindow.load(raw_path)
        m = raw.meta
        assert (m.rank, m.world_size) == (rank, 2)
        assert m.window_ns >= 1.0e9 and len(m.iteration_ms) >= 3
        pids.add(m.pid)
        kinds = set(raw.col("kind").tolist())
        assert {EventKind.PYTHON, EventKind.CPU_OP} <= kinds
        names = set(raw.names)
        assert any(n.startswith("c10d::") or "allreduce" in n for n in names), sorted(names)[:50]
        samples = SampleSet.load(raw_path.with_name(raw_path.name.replace(".raw.", ".samples.")))
        cpu = samples.get("cpu")
        assert cpu is not None
        assert cpu.t_ns[0] <= m.window_start_ns and cpu.t_ns[-1] >= m.window_end_ns  # covers the window
        inside = (cpu.t_ns >= m.window_start_ns) & (cpu.t_ns <= m.window_end_ns)
        assert inside.sum() >= 0.5 * m.window_ns / 1e6  # ~1 kHz
        assert float(np.mean(cpu.value[inside])) > 0.0  # the training thread did run
        assert samples.get("nic") is not None
    assert len(pids) == 2
