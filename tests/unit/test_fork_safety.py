"""fork_safety: a process whose RDMA memory is not fork-protected never forks a conversion child
(issue 30). libibverbs' answer is given here as its enum values (no RDMA hardware on this host)."""

from __future__ import annotations

from pathlib import Path

from perftracker.runtime import fork_safety as fs

MAPS = """\
7f0000000000-7f0000001000 r-xp 00000000 08:01 123 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000002000-7f0000003000 rw-p 00000000 00:00 0
7f0000004000-7f0000005000 r-xp 00000000 08:01 456 /usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.50.0
"""


def test_finds_the_loaded_libibverbs_and_only_it() -> None:
    assert fs.loaded_libibverbs(MAPS) == "/usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.50.0"
    assert fs.loaded_libibverbs(MAPS.replace("libibverbs", "libibumad")) is None
    assert fs.loaded_libibverbs("") is None


def test_unprotected_rdma_is_unsafe_protected_or_absent_is_safe() -> None:
    lib = "/usr/lib/libibverbs.so.1"
    assert "without fork protection" in fs.fork_unsafe_reason(fs.IBV_FORK_DISABLED, lib)
    assert "cannot tell" in fs.fork_unsafe_reason(None, lib)  # an old libibverbs: no answer is no
    assert "unknown status 7" in fs.fork_unsafe_reason(7, lib)
    assert fs.fork_unsafe_reason(fs.IBV_FORK_ENABLED, lib) == ""  # ibv_fork_init / RDMAV_FORK_SAFE (NCCL)
    assert fs.fork_unsafe_reason(fs.IBV_FORK_UNNEEDED, lib) == ""  # kernel copies pinned pages at fork
    assert fs.fork_unsafe_reason(fs.IBV_FORK_DISABLED, None) == ""  # no libibverbs: no RDMA memory


def test_this_process_without_rdma_may_fork() -> None:
    assert fs.fork_unsafe() == ""  # the test process has not loaded libibverbs


def test_a_libibverbs_that_cannot_answer_is_unsafe(tmp_path: Path) -> None:
    maps = tmp_path / "maps"  # names a library that is not loaded: RTLD_NOLOAD finds nothing to ask
    maps.write_text(MAPS.replace("/usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.50.0", str(tmp_path / "libibverbs.so.1")))
    assert "cannot tell" in fs.fork_unsafe(maps)
    assert "cannot read" in fs.fork_unsafe(tmp_path / "absent")
