"""The worker's identity (perftracker/runtime/identity.py) in a real 2-rank gloo job: a guess at import,
settled from the process group (job id agreed through the default store) (without a process group:
tests/unit/test_job_identity.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

SPAWN = textwrap.dedent("""\
    import json, os, sys
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from perftracker.runtime.identity import provisional_identity, settle_identity

    def worker(rank, port):
        # each rank's own guess differs (rank 1 even has another configured job id): the process
        # group and rank 0's published job id decide
        job_id = "" if rank == 0 else "not-this-one"
        guess = provisional_identity(job_id, {})
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        ident = settle_identity(guess, job_id, iteration=0, environ={"MASTER_PORT": str(port)})
        os.write(1, (json.dumps(ident.to_dict()) + "\\n").encode())
        dist.barrier()
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(worker, args=(int(sys.argv[1]),), nprocs=2)
    """)


def test_ranks_of_a_spawned_job_agree_on_rank_0s_job_id_and_count_local_ranks(tmp_path: Path,
                                                                               free_port: int) -> None:
    script = tmp_path / "train v2.py"  # a script name the localizer would not accept as it is
    script.write_text(SPAWN)
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    r = subprocess.run([sys.executable, str(script), str(free_port)], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    idents = sorted((json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")),
                    key=lambda d: d["rank"])
    assert [(d["rank"], d["world_size"], d["local_rank"]) for d in idents] == [(0, 2, 0), (1, 2, 1)], idents
    assert {d["job"] for d in idents} == {f"train_v2-{free_port}"}, idents  # rank 0's, sanitized
    assert all(d["settled"] and d["source"] == "process group" for d in idents)

