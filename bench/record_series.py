"""Record a training job's per-rank iteration end times for bench/onset_bound.py.

Runs any command with a ``sitecustomize`` that registers one global ``Optimizer.step`` post hook in
every Python process of the job: each optimizer step appends ``"<step> <monotonic ns>"`` to
``OUT_DIR/rank<R>.times`` (R from ``RANK``, else ``LOCAL_RANK``, else 0; read at the first step,
after the launcher or Lightning has set it). The same format ``perftracker/examples/train.py --progress-dir``
writes. perftracker is disabled in the job (``PERFTRACKER_DISABLE=1``): the series is the job's own.

Usage: python bench/record_series.py OUT_DIR -- python -m torch.distributed.run ... script.py ...
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

SITECUSTOMIZE = '''
import os
_dir = os.environ.get("PT_RECORD_DIR")
if _dir:
    import time
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook
    except Exception:  # not a torch process
        register_optimizer_step_post_hook = None
    if register_optimizer_step_post_hook is not None:
        _state = {"f": None, "n": 0}

        def _record(optimizer, args, kwargs):
            if _state["f"] is None:
                rank = os.environ.get("RANK") or os.environ.get("LOCAL_RANK") or "0"
                _state["f"] = open(os.path.join(_dir, "rank%s.times" % rank), "a", buffering=1)
            _state["f"].write("%d %d\\n" % (_state["n"], time.monotonic_ns()))
            _state["n"] += 1

        register_optimizer_step_post_hook(_record)
'''


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") != 1:
        sys.stderr.write(__doc__ or "")
        return 2
    out = Path(argv[0]).resolve()
    cmd = argv[2:]
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("rank*.times"):
        old.unlink()
    with tempfile.TemporaryDirectory(prefix="pt-record-") as tmp:
        Path(tmp, "sitecustomize.py").write_text(SITECUSTOMIZE)
        env = dict(os.environ, PT_RECORD_DIR=str(out), PERFTRACKER_DISABLE="1", OMP_NUM_THREADS="1",
                   HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join([tmp, os.environ.get("PYTHONPATH", "")]))
        rc = subprocess.run(cmd, env=env).returncode
    files = sorted(out.glob("rank*.times"))
    sys.stderr.write(f"rc {rc}; {', '.join(f'{f.name}: {sum(1 for _ in f.open())} steps' for f in files)}\n")
    return rc


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
