"""What an ``.npz`` may declare before numpy inflates it (issue 46).

``np.load`` trusts the shape each ``.npy`` member's header declares: a deflated member of int64
zeros declaring 100,000,000 elements is 778 KB on disk and 800 MB once read (and the summarizer's
work on it took 10 GB). ``check_npz`` reads only the zip's directory and each member's header (a
few hundred bytes inflated per member) and raises ``TraceError`` before any array is read when

- a member is not a plain ``.npy`` array (object dtype, a header numpy cannot read),
- a member declares more elements than its limit (``limits``: member-name prefix -> elements, the
  longest matching prefix wins; a member no prefix names is refused), or not the dimensions asked,
- a deflated member declares more than ``MAX_INFLATE_RATIO`` times the bytes it holds (past
  ``SMALL_BYTES``): perftracker writes its ``.npz`` files uncompressed, so a member that inflates
  that much is not one of ours, and the work it would cause is not bounded by the data present,
- the members together declare more than ``max_total_bytes``.

Standard library and numpy only.
"""

from __future__ import annotations

import math
import zipfile
from collections.abc import Mapping
from typing import IO

import numpy as np

from perftracker.errors import TraceError

MAX_INFLATE_RATIO = 100  # a deflated member may declare at most this many times its stored bytes
SMALL_BYTES = 1 << 20  # ... unless it declares at most this much
MAX_MEMBERS = 1024
_HEADER_MAX = 10_000  # numpy's own default max_header_size


def _header(fh: IO[bytes]) -> tuple[tuple[int, ...], np.dtype]:
    version = np.lib.format.read_magic(fh)
    if version == (1, 0):
        shape, _fortran, dtype = np.lib.format.read_array_header_1_0(fh, max_header_size=_HEADER_MAX)
    else:
        shape, _fortran, dtype = np.lib.format.read_array_header_2_0(fh, max_header_size=_HEADER_MAX)
    return tuple(int(x) for x in shape), dtype


def _limit(name: str, limits: Mapping[str, tuple[int, int]]) -> tuple[int, int] | None:
    best = max((p for p in limits if name.startswith(p)), key=len, default=None)
    return None if best is None else limits[best]


def check_npz(fh: IO[bytes], where: str, limits: Mapping[str, tuple[int, int]], max_total_bytes: int) -> None:
    """TraceError unless every member of the ``.npz`` open as ``fh`` stays inside ``limits``
    (member-name prefix -> (max elements, dimensions)) and the bounds of the module doc. Leaves
    ``fh`` at its start."""
    try:
        with zipfile.ZipFile(fh) as zf:
            infos = zf.infolist()
            if len(infos) > MAX_MEMBERS:
                raise TraceError(f"{where}: {len(infos)} members, at most {MAX_MEMBERS}")
            total = 0
            for info in infos:
                name = info.filename.removesuffix(".npy")
                limit = _limit(name, limits)
                if limit is None:
                    raise TraceError(f"{where}: unexpected member {name[:80]!r}")
                with zf.open(info) as member:
                    shape, dtype = _header(member)
                if dtype.hasobject:
                    raise TraceError(f"{where}: member {name!r} holds Python objects")
                items = math.prod(shape)
                max_items, ndim = limit
                if len(shape) != ndim or items > max_items:
                    raise TraceError(f"{where}: member {name!r} declares shape {shape}: at most {max_items:,} "
                                     f"elements in {ndim} dimension(s); refused before reading it")
                nbytes = items * dtype.itemsize
                if (info.compress_type != zipfile.ZIP_STORED and nbytes > SMALL_BYTES
                        and nbytes > MAX_INFLATE_RATIO * max(1, info.compress_size)):
                    raise TraceError(f"{where}: member {name!r} declares {nbytes:,} bytes from {info.compress_size:,} "
                                     f"compressed (more than {MAX_INFLATE_RATIO}x); refused before inflating it")
                total += nbytes
                if total > max_total_bytes:
                    raise TraceError(f"{where}: members declare more than {max_total_bytes:,} bytes; refused")
    except TraceError:
        raise
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, NotImplementedError) as exc:
        raise TraceError(f"{where}: not a readable .npz ({type(exc).__name__}: {exc})") from None
    finally:
        fh.seek(0)
