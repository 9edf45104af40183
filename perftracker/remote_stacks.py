"""Python stacks of the training thread read from outside the process, as py-spy does: another
process follows the interpreter's frame pointers with ``process_vm_readv`` and needs no thread,
no GIL and no signal in the training process.

Two halves:

- ``calibrate()`` runs once in the training thread when a window opens. It finds where this
  interpreter keeps the thread's current frame and a code object's name, file and first line by
  reading its own memory through ``process_vm_readv`` (a bad address is an error, never a crash)
  and checking the answers against objects it knows (its own frames and code objects). The result
  is a ``StackLayout``: the training thread's ``PyThreadState`` address and the offsets, sent to
  the sampler process as one JSON line. Built for CPython 3.11 (frame and code layouts change in
  each minor version); elsewhere it raises ``PerftrackerError`` and the window samples stacks in a
  thread instead (perftracker/runtime/stack_sampler.py).
- ``RemoteStackReader`` runs in the sampler process: ``sample()`` reads the thread's stack,
  innermost first, as ``(frame address, RemoteCode)`` pairs: the same shape as the in-process
  sampler's ``(id(frame), code)``, so ``stacks.python_executions`` turns both into executions.
  A read the target tore (its innermost frame changed while the stack was read) is dropped: a
  one-sample gap.

Requires ptrace-read access to the training process (same uid and Yama ``ptrace_scope`` <= 1, or
CAP_SYS_PTRACE), as the perf CPU source does.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from perftracker.errors import PerftrackerError

_FRAME_CODE = 32  # _PyInterpreterFrame.f_code (CPython 3.11, 64-bit)
_FRAME_PREVIOUS = 48  # _PyInterpreterFrame.previous
_CFRAME_CURRENT = 8  # _PyCFrame.current_frame
MAX_DEPTH = 256
BLOCK = 16384  # bytes of the data stack read at once below the innermost frame


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


# PyDLL, not CDLL: the call keeps the GIL. A CDLL call releases it, so in the training process's own
# sampler thread each of a sample's ~5 reads had to win the GIL back from a training thread running
# Python (up to a switch interval each) and now and then let it change the stack mid-walk (a torn
# sample, dropped). On an idle 2-core host that gave 716-815 samples per 1.5 s window and gaps of
# 18-31 ms that hid whole 10 ms calls, against 1,268-1,290 and 7-9 ms with the GIL kept. A read
# takes microseconds; holding the GIL for it also freezes the Python stack it reads.
_libc = ctypes.PyDLL(None, use_errno=True)
_readv = _libc.process_vm_readv
_readv.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                   ctypes.c_ulong]
_readv.restype = ctypes.c_ssize_t


class Memory:
    """Reads another (or this) process's memory; ``None`` for an unreadable address."""

    def __init__(self, pid: int, size: int = 32768) -> None:
        self.pid = pid
        self._buf = ctypes.create_string_buffer(size)
        self._local = _IoVec(ctypes.cast(self._buf, ctypes.c_void_p), 0)
        self._remote = _IoVec(0, 0)

    def read(self, addr: int, n: int) -> bytes | None:
        if addr <= 0 or n > len(self._buf):
            return None
        self._local.len = n
        self._remote.base, self._remote.len = addr, n
        if _readv(self.pid, ctypes.byref(self._local), 1, ctypes.byref(self._remote), 1, 0) != n:
            return None
        return ctypes.string_at(self._buf, n)

    def word(self, addr: int) -> int | None:
        b = self.read(addr, 8)
        return None if b is None else int.from_bytes(b, "little")


@dataclass(frozen=True)
class StackLayout:
    tstate: int  # the training thread's PyThreadState
    tstate_cframe: int  # offset of PyThreadState.cframe
    code_type: int  # address of PyCode_Type (a code object's ob_type)
    code_filename: int
    code_name: int
    code_firstlineno: int
    str_length: int  # PyASCIIObject.length
    str_state: int  # PyASCIIObject.state (a bit field; its first byte holds kind and ascii)
    str_ascii_bit: int  # the mask of the "ascii" bit in it
    str_ascii_data: int  # an ASCII compact string's characters
    str_latin1_data: int  # a 1-byte-kind non-ASCII compact string's characters
    version: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> StackLayout:
        return cls(**json.loads(text))


class _Probe:  # a method: its code's co_name ("meth") differs from its co_qualname
    def meth(self) -> None:
        pass


def calibrate() -> StackLayout:
    """The layout for the calling thread (call it in the training thread); PerftrackerError if
    this interpreter's layout cannot be confirmed."""
    if sys.implementation.name != "cpython" or sys.version_info[:2] != (3, 11) or sys.maxsize < 2**32:
        raise PerftrackerError(f"remote stacks: not built for {sys.implementation.name} {sys.version.split()[0]}")
    mem = Memory(os.getpid())
    get_ts = ctypes.pythonapi.PyThreadState_Get
    get_ts.restype = ctypes.c_void_p
    tstate = int(get_ts())
    cframe_off, own_fp = _find_cframe(mem, tstate)
    code = _Probe.meth.__code__
    addr = id(code)
    code_type = mem.word(addr + 8)
    if code_type != id(type(code)):
        raise PerftrackerError("remote stacks: code object header not as expected")
    words = {off: mem.word(addr + off) for off in range(16, 256, 8)}
    fn = [o for o, v in words.items() if v == id(code.co_filename)]
    nm = [o for o, v in words.items() if v == id(code.co_name)]
    line_off = _find_firstlineno(mem)
    ascii_s, latin_s = "".join(["perftracker", "_probe"]), "".join(["perftracker", "_\xe9"])
    length = [o for o in range(8, 48, 8) if mem.word(id(ascii_s) + o) == len(ascii_s)]
    ascii_raw, latin_raw = mem.read(id(ascii_s), 128), mem.read(id(latin_s), 128)
    if len(fn) != 1 or len(nm) != 1 or not length or ascii_raw is None or latin_raw is None:
        raise PerftrackerError("remote stacks: code or string layout not found")
    ascii_data = ascii_raw.find(ascii_s.encode())
    latin_data = latin_raw.find(latin_s.encode("latin-1"))
    state_off = length[0] + 16  # length, hash, state
    a_state, l_state = ascii_raw[state_off], latin_raw[state_off]  # the bit field's first byte; the rest is padding
    bit = a_state ^ l_state
    if ascii_data < 0 or latin_data < 0 or bin(bit).count("1") != 1 or not a_state & bit:
        raise PerftrackerError("remote stacks: string layout not found")
    layout = StackLayout(tstate, cframe_off, code_type, fn[0], nm[0], line_off, length[0], state_off, bit,
                         ascii_data, latin_data, sys.version.split()[0])
    # read our own stack back from this very call's frame down (the frames above it, the
    # reader's own, are gone by the time they would be read)
    reader = RemoteStackReader(os.getpid(), layout)
    got = [c.co_name for _, c in reader._walk(own_fp) or ()]
    caller = sys._getframe(1).f_code.co_name
    if got[:2] != ["calibrate", caller]:
        raise PerftrackerError(f"remote stacks: own stack not read back ({got[:4]})")
    return layout


def _find_cframe(mem: Memory, tstate: int) -> tuple[int, int]:
    """The offset of PyThreadState.cframe, and the caller's (live) interpreter frame."""
    me = sys._getframe(1)  # calibrate()'s frame, with its caller
    want = (id(me.f_code), id(me.f_back.f_code) if me.f_back is not None else 0)
    for off in range(0, 512, 8):
        fp = mem.word((mem.word(tstate + off) or 0) + _CFRAME_CURRENT) or 0
        for _ in range(8):  # _find_cframe's own frame (and Memory's) may be above calibrate's
            if not fp:
                break
            prev = mem.word(fp + _FRAME_PREVIOUS) or 0
            if (mem.word(fp + _FRAME_CODE), mem.word(prev + _FRAME_CODE) if prev else 0) == want:
                return off, fp
            fp = prev
    raise PerftrackerError("remote stacks: the thread's current frame not found")


def _find_firstlineno(mem: Memory) -> int:
    """The int offset holding co_firstlineno: the one that matches two code objects."""
    ns: dict[str, object] = {}
    exec(compile("def a():\n    pass\n" + "\n" * 3000 + "def b():\n    pass\n", "<probe>", "exec"), ns)
    codes = [ns["a"].__code__, ns["b"].__code__]  # type: ignore[attr-defined]
    hits = None
    for c in codes:
        raw = mem.read(id(c), 256) or b""
        offs = {o for o in range(16, len(raw) - 4, 4) if int.from_bytes(raw[o:o + 4], "little") == c.co_firstlineno}
        hits = offs if hits is None else hits & offs
    if not hits:
        raise PerftrackerError("remote stacks: co_firstlineno not found")
    return min(hits)


@dataclass(frozen=True, eq=False)
class RemoteCode:
    """A code object of the target, by what ``stacks.frame_name`` needs; one instance per code
    address (compared with ``is``, as code objects are)."""

    co_filename: str
    co_firstlineno: int
    co_name: str


class RemoteStackReader:
    """Reads one thread's Python stack in another process (see the module doc)."""

    def __init__(self, pid: int, layout: StackLayout) -> None:
        self.mem = Memory(pid)
        self.layout = layout
        self.codes: dict[int, RemoteCode] = {}
        self._strings: dict[int, str] = {}
        self.torn = 0  # samples dropped because the stack changed while it was read
        self._first_code = 0
        self._lock = threading.Lock()


    def _top(self) -> int | None:
        cframe = self.mem.word(self.layout.tstate + self.layout.tstate_cframe)
        return self.mem.word(cframe + _CFRAME_CURRENT) if cframe else None

    def sample(self) -> tuple[tuple[int, RemoteCode], ...] | None:
        """The stack, innermost first; None when it could not be read whole, or the innermost
        frame (its address or code) changed while it was read: the frames read after a return
        may belong to a later call at the same address, a torn stack (e.g. inner() under other()).
        Not caught: a return and a new call of the same function at the same address within the
        read (~3 us per frame) whose callers changed."""
        for _ in range(2):  # a torn read is tried once more at once
            top = self._top()
            got = self._walk(top) if top else None
            # the same innermost frame (address and code) after the walk as before it
            if top and got and self._top() == top and self.mem.word(top + _FRAME_CODE) == self._first_code:
                return got
        self.torn += 1
        return None

    def _walk(self, fp: int) -> tuple[tuple[int, RemoteCode], ...] | None:
        """Follow ``previous`` from ``fp``. Callers' frames sit below the innermost one in the same
        data-stack chunk, so one read of the BLOCK bytes below it serves most of the walk (one
        system call instead of one per frame); a frame outside it is read on its own."""
        mem = self.mem
        out: list[tuple[int, RemoteCode]] = []
        codes = self.codes
        lo = max(fp - BLOCK, 4096) & ~7
        block = mem.read(lo, fp + _FRAME_PREVIOUS + 8 - lo)
        if block is None:  # the chunk starts above lo: per frame
            lo, block = fp, mem.read(fp, _FRAME_PREVIOUS + 8)
            if block is None:
                return None
        words = memoryview(block).cast("B")[:len(block) & ~7].cast("Q")  # native 64-bit words
        hi = lo + len(words) * 8
        code_w, prev_w = _FRAME_CODE // 8, _FRAME_PREVIOUS // 8
        while fp and len(out) < MAX_DEPTH:
            if lo <= fp and fp + _FRAME_PREVIOUS + 8 <= hi and not (fp - lo) & 7:
                i = (fp - lo) >> 3
                code_addr, prev = words[i + code_w], words[i + prev_w]
            else:
                raw = mem.read(fp, _FRAME_PREVIOUS + 8)
                if raw is None:
                    return None
                code_addr = int.from_bytes(raw[_FRAME_CODE:_FRAME_CODE + 8], "little")
                prev = int.from_bytes(raw[_FRAME_PREVIOUS:_FRAME_PREVIOUS + 8], "little")
            code = codes.get(code_addr) or self._code(code_addr)
            if code is None:
                return None
            if not out:
                self._first_code = code_addr
            out.append((fp, code))
            fp = prev
        return tuple(out)

    def _code(self, addr: int) -> RemoteCode | None:
        lay, mem = self.layout, self.mem
        raw = mem.read(addr, max(lay.code_filename, lay.code_name, lay.code_firstlineno) + 8)
        if raw is None or int.from_bytes(raw[8:16], "little") != lay.code_type:
            return None
        filename = self._str(int.from_bytes(raw[lay.code_filename:lay.code_filename + 8], "little"))
        name = self._str(int.from_bytes(raw[lay.code_name:lay.code_name + 8], "little"))
        if filename is None or name is None:
            return None
        line = int.from_bytes(raw[lay.code_firstlineno:lay.code_firstlineno + 4], "little", signed=True)
        code = self.codes[addr] = RemoteCode(filename, line, name)
        return code

    def _str(self, addr: int) -> str | None:
        s = self._strings.get(addr)
        if s is not None:
            return s
        lay, mem = self.layout, self.mem
        head = mem.read(addr, lay.str_latin1_data)
        if head is None:
            return None
        n = int.from_bytes(head[lay.str_length:lay.str_length + 8], "little")
        state = head[lay.str_state]
        if not 0 <= n <= 4096:
            return None
        kind = (state >> 2) & 7  # interned: 2 bits, then kind: 3 bits
        if state & lay.str_ascii_bit:
            data = mem.read(addr + lay.str_ascii_data, n) if n else b""
            s = data.decode("ascii", "replace") if data is not None else None
        elif kind == 1:
            data = mem.read(addr + lay.str_latin1_data, n) if n else b""
            s = data.decode("latin-1") if data is not None else None
        else:
            s = "<non-latin-1 name>"
        if s is not None:
            self._strings[addr] = s
        return s


def save_samples(path: str, t_ns: list[int], samples: list[tuple[tuple[int, RemoteCode], ...]]) -> None:
    """Write sampled stacks (``RemoteStackReader.sample`` results) as one npz file, atomically."""
    import numpy as np

    from perftracker.model.raw_window import _save_npz_atomic

    index: dict[int, int] = {}  # id(RemoteCode) -> row of the code table
    table: list[tuple[str, int, str]] = []
    frames: list[int] = []
    code_idx: list[int] = []
    for stack in samples:
        for fp, code in stack:
            i = index.get(id(code))
            if i is None:
                i = index[id(code)] = len(table)
                table.append((code.co_filename, code.co_firstlineno, code.co_name))
            frames.append(fp)
            code_idx.append(i)
    _save_npz_atomic(Path(path), {
        "t_ns": np.asarray(t_ns, np.int64),
        "depth": np.asarray([len(s) for s in samples], np.int32),
        "frames": np.asarray(frames, np.uint64),
        "code_idx": np.asarray(code_idx, np.int32),
        "codes_json": np.frombuffer(json.dumps(table).encode(), np.uint8),
    })


def load_samples(path: str | Path) -> tuple[list[int], list[tuple[tuple[int, RemoteCode], ...]]]:
    """The (t_ns, samples) a sampler process wrote: the in-process sampler's shape."""
    import numpy as np

    with np.load(path, allow_pickle=False) as z:
        t_ns = z["t_ns"].tolist()
        depth = z["depth"].tolist()
        frames = z["frames"].tolist()
        code_idx = z["code_idx"].tolist()
        table = json.loads(bytes(z["codes_json"]).decode())
    codes = [RemoteCode(str(f), int(line), str(n)) for f, line, n in table]
    samples = []
    pos = 0
    for d in depth:
        samples.append(tuple((frames[j], codes[code_idx[j]]) for j in range(pos, pos + d)))
        pos += d
    return t_ns, samples
