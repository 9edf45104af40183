"""Raw window data: the columnar hand-over between the profile window (or a Kineto trace reader),
the hardware samplers and the summarizer.

A ``RawWindow`` is a table of events, one row per event, as numpy columns, plus interned name and
stack tables and the window's identity. It is the summarizer's only event input, whatever produced
it (the online window or ``perftracker.agent.kineto`` reading a trace file).

A ``SampleSet`` holds timestamped utilization samples per resource, normalized to [0, 1].

All times are integer nanoseconds on one time base. Online, that base is CLOCK_MONOTONIC
(``time.monotonic_ns``), which is also what procfs samplers read. Offline (Kineto files) it is the
trace's own clock, and there are no samples.

Files: ``save``/``load`` use ``numpy.savez`` (no pickle: ``allow_pickle=False`` on load) with a
JSON metadata entry that carries ``schema_version``.
"""

from __future__ import annotations

import json
import os
import secrets
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

import numpy as np

from perftracker.errors import SchemaError, TraceError
from perftracker.model import SCHEMA_VERSION, check_schema_version
from perftracker.model.npz_bounds import check_npz


class EventKind(IntEnum):
    """What an event row is. Values are stored on disk: never renumber, only append."""

    CPU_OP = 0  # an aten/c10d/user op on a CPU thread (Kineto "cpu_op")
    PYTHON = 1  # a Python function execution (Kineto "python_function", or built from stack samples)
    KERNEL = 2  # a GPU kernel (compute or NCCL)
    MEMCPY = 3  # gpu_memcpy
    MEMSET = 4  # gpu_memset
    RUNTIME = 5  # cuda_runtime / cuda_driver
    ANNOTATION = 6  # user_annotation, gpu_user_annotation, ProfilerStep#N
    GC = 7  # "Python GC" events (record_python_gc_info)
    OTHER = 8


COLUMNS: dict[str, np.dtype[Any]] = {
    "kind": np.dtype(np.uint8),
    "name_id": np.dtype(np.int32),
    "tid": np.dtype(np.int64),  # OS thread id for CPU events; stream id for GPU events
    "device": np.dtype(np.int16),  # -1 for CPU events, GPU index for GPU events
    "start_ns": np.dtype(np.int64),
    "end_ns": np.dtype(np.int64),
    "stack_id": np.dtype(np.int32),  # index into stacks, -1 if none
    "parent": np.dtype(np.int32),  # row index of the enclosing event on the same thread, -1 if none
}


# WindowMeta.comm's fields: the event's name, start and end (ns, the window's clock), its process
# group's name, the collective's name ("allreduce", "send", ...), its sequence number in the group
# (-1: none), and the global source and destination ranks of a point-to-point transfer (-1: none)
COMM_FIELDS = ("name", "start_ns", "end_ns", "group", "collective", "seq", "src", "dst")


@dataclass(frozen=True)
class WindowMeta:
    job: str
    session: str
    rank: int
    world_size: int
    host: str
    pid: int
    training_tid: int  # OS thread id of the training (main) thread
    window_start_ns: int
    window_end_ns: int
    local_rank: int = -1
    clock: str = "monotonic"  # "monotonic" online; "trace" for Kineto files
    source: str = "online"  # "online" | "kineto"
    file: str = ""  # where it was read from (offline)
    iteration_ms: tuple[float, ...] = ()
    # process groups as the trace names them: (name, description, member ranks); empty: not known
    # (a group of many members continued from a cut list is a ``range``: agent/kineto.py)
    process_groups: tuple[tuple[str, str, Sequence[int]], ...] = ()
    # one row per communication event that names its group: COMM_FIELDS
    comm: tuple[tuple[str, int, int, str, str, int, int, int], ...] = ()
    # ranks per host (LOCAL_WORLD_SIZE), ranks filling hosts in order; 0: not known. It decides a
    # collective's link: NVLink/PCIe inside a host, the NIC between hosts (agent/summarize/hardware.py)
    local_world_size: int = 0
    schema_version: int = SCHEMA_VERSION

    @property
    def window_ns(self) -> int:
        return self.window_end_ns - self.window_start_ns


@dataclass(frozen=True)
class RawWindow:
    meta: WindowMeta
    columns: Mapping[str, np.ndarray]  # keys and dtypes as COLUMNS, all the same length
    names: tuple[str, ...]
    stacks: tuple[tuple[int, ...], ...] = ()  # name ids, outermost first

    def __post_init__(self) -> None:
        n = None
        for col, dtype in COLUMNS.items():
            if col not in self.columns:
                raise SchemaError(f"RawWindow: missing column {col!r}")
            arr = self.columns[col]
            if arr.dtype != dtype:
                raise SchemaError(f"RawWindow: column {col!r} has dtype {arr.dtype}, expected {dtype}")
            if n is None:
                n = len(arr)
            elif len(arr) != n:
                raise SchemaError(f"RawWindow: column {col!r} has {len(arr)} rows, expected {n}")

    def __len__(self) -> int:
        return len(self.columns["kind"])

    def col(self, name: str) -> np.ndarray:
        return self.columns[name]

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        meta = asdict(self.meta)
        meta["process_groups"] = [(n, d, _ranks_json(r)) for n, d, r in self.meta.process_groups]
        arrays: dict[str, np.ndarray] = {f"col_{k}": np.ascontiguousarray(v) for k, v in self.columns.items()}
        arrays["meta_json"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        arrays["names_json"] = np.frombuffer(json.dumps(list(self.names)).encode(), dtype=np.uint8)
        flat = np.fromiter((i for s in self.stacks for i in s), dtype=np.int32)
        offsets = np.cumsum([0] + [len(s) for s in self.stacks], dtype=np.int64)
        arrays["stack_frames"] = flat
        arrays["stack_offsets"] = offsets
        return _save_npz_atomic(path, arrays)

    @classmethod
    def load(cls, path: str | Path) -> RawWindow:
        path = Path(path)
        try:
            with open(path, "rb") as fh, _bounded(fh, f"raw window {path}", RAW_LIMITS, MAX_RAW_BYTES) as z:
                meta_d = json.loads(bytes(z["meta_json"]).decode())
                check_schema_version(meta_d, f"raw window {path}")
                meta_d["iteration_ms"] = tuple(meta_d.get("iteration_ms", ()))
                meta_d["process_groups"] = tuple((str(g[0]), str(g[1]), _ranks_from_json(g[2]))
                                                 for g in meta_d.get("process_groups", ()))
                meta_d["comm"] = tuple((str(c[0]), int(c[1]), int(c[2]), str(c[3]), str(c[4]), int(c[5]), int(c[6]),
                                        int(c[7])) for c in meta_d.get("comm", ()))
                meta = WindowMeta(**meta_d)
                names = tuple(json.loads(bytes(z["names_json"]).decode()))
                columns = {k: z[f"col_{k}"] for k in COLUMNS}
                flat = z["stack_frames"]
                offsets = z["stack_offsets"]
        except SchemaError:
            raise
        except (OSError, KeyError, ValueError, TypeError, zipfile.BadZipFile, EOFError) as exc:
            raise TraceError(f"{path}: not a readable raw window ({type(exc).__name__}: {exc})") from None
        stacks = tuple(tuple(int(x) for x in flat[offsets[i] : offsets[i + 1]]) for i in range(len(offsets) - 1))
        return cls(meta=meta, columns=columns, names=names, stacks=stacks)


def _save_npz_atomic(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    """Write ``arrays`` as an .npz at ``path`` via a temporary file, so a reader never sees half a file.
    The temporary file is new, unpredictable and private (``O_CREAT | O_EXCL | O_NOFOLLOW``, 0600:
    issue 46), and the rename replaces a symlink planted at ``path`` instead of following it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            # numpy's stub lets ** fill savez's allow_pickle (a bool, and only since numpy 2.1)
            np.savez(fh, **arrays)  # type: ignore[arg-type]
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


# What a load accepts, checked on each member's declared shape before it is read (issue 46:
# ``npz_bounds``). A window's rows: the profiler's events of one window (Kineto's own traces of a
# minute hold a few million); a series' samples: 1 kHz for over half an hour.
MAX_WINDOW_ROWS = 20_000_000
MAX_SERIES_SAMPLES = 2_000_000
_MAX_JSON_BYTES = 64 << 20
RAW_LIMITS = {"col_": (MAX_WINDOW_ROWS, 1), "meta_json": (_MAX_JSON_BYTES, 1), "names_json": (_MAX_JSON_BYTES, 1),
              "stack_frames": (4 * MAX_WINDOW_ROWS, 1), "stack_offsets": (MAX_WINDOW_ROWS + 1, 1)}
MAX_RAW_BYTES = 4 << 30
SAMPLE_LIMITS = {"t_": (MAX_SERIES_SAMPLES, 1), "v_": (MAX_SERIES_SAMPLES, 1), "meta_json": (1 << 20, 1)}
MAX_SAMPLE_BYTES = 64 * MAX_SERIES_SAMPLES * 12


class _bounded:  # noqa: N801 - used as a context manager like np.load
    """``np.load`` of the open ``fh`` after ``check_npz`` accepted it."""

    def __init__(self, fh: Any, where: str, limits: Mapping[str, tuple[int, int]], max_bytes: int) -> None:
        check_npz(fh, where, limits, max_bytes)
        self.z = np.load(fh, allow_pickle=False)

    def __enter__(self) -> Any:
        return self.z

    def __exit__(self, *exc: object) -> None:
        self.z.close()


_MAX_GROUP_RANK = 10_000_000


def _ranks_json(ranks: Sequence[int]) -> Any:
    """A group's members for the meta JSON: a ``range`` as {"start", "stop", "step"}."""
    if isinstance(ranks, range):
        return {"start": ranks.start, "stop": ranks.stop, "step": ranks.step}
    return [int(r) for r in ranks]


def _ranks_from_json(v: Any) -> Sequence[int]:
    if isinstance(v, Mapping):
        start, stop, step = (int(v[k]) for k in ("start", "stop", "step"))
        if step <= 0 or not 0 <= start <= stop <= _MAX_GROUP_RANK + step:
            raise ValueError(f"bad rank range {start}:{stop}:{step}")
        return range(start, stop, step)
    return tuple(int(r) for r in v)


# Series that are not a utilization, each written by one sampler and read by the summarizer.
CPU_WAIT = "cpu_wait"  # the training thread's share of each interval runnable without a core (schedstat)
TCP_RETRANS = "tcp_retrans"  # one value: the share of TCP segments retransmitted over the window


@dataclass(frozen=True)
class UtilSeries:
    """Utilization samples of one resource: value[i] in [0, 1] over the interval ending at t_ns[i]."""

    resource: str  # "cpu" (training thread), "sm", "pcie", "nvlink", "nic", "disk", "mem"
    t_ns: np.ndarray  # int64, increasing, on the window's time base
    value: np.ndarray  # float32 in [0, 1]
    period_ns: int  # nominal sampling period
    source: str = ""  # "procfs", "nvml", "nsys", "fixture"


@dataclass(frozen=True)
class SampleSet:
    series: Mapping[str, UtilSeries] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def get(self, resource: str) -> UtilSeries | None:
        return self.series.get(resource)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        arrays: dict[str, np.ndarray] = {}
        series: dict[str, dict[str, object]] = {}
        for name, s in self.series.items():
            arrays[f"t_{name}"] = np.asarray(s.t_ns, dtype=np.int64)
            arrays[f"v_{name}"] = np.asarray(s.value, dtype=np.float32)
            series[name] = {"period_ns": int(s.period_ns), "source": s.source}
        meta = {"schema_version": self.schema_version, "series": series}
        arrays["meta_json"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        return _save_npz_atomic(path, arrays)

    @classmethod
    def load(cls, path: str | Path) -> SampleSet:
        path = Path(path)
        try:
            with open(path, "rb") as fh, _bounded(fh, f"samples {path}", SAMPLE_LIMITS, MAX_SAMPLE_BYTES) as z:
                meta = json.loads(bytes(z["meta_json"]).decode())
                check_schema_version(meta, f"samples {path}")
                series = {
                    name: UtilSeries(name, z[f"t_{name}"], z[f"v_{name}"], int(m["period_ns"]), str(m.get("source", "")))
                    for name, m in meta["series"].items()
                }
        except SchemaError:
            raise
        except (OSError, KeyError, ValueError, TypeError, zipfile.BadZipFile, EOFError) as exc:
            raise TraceError(f"{path}: not a readable sample file ({type(exc).__name__}: {exc})") from None
        return cls(series=series)
