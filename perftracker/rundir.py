"""The run dir (``/tmp/perftracker-<uid>`` by default): checked before it is trusted, written safely.

The default path is predictable, so on a shared host another user can create it first, make it
world-writable and plant their own ``agent.sock`` or a symlink where we write. Hence:

- ``ensure_private_dir`` creates a directory with mode 0700, or accepts an existing one only when
  it is a real directory (not a symlink), owned by us (or root, where ``trusted_owners`` says so),
  and not writable by group or others (a directory shared with one trusted group through
  ``group_gid`` may be group-readable). Anything else raises ``RunDirError`` naming the problem.
- ``check_agent_socket`` is what a worker checks before it talks to ``agent.sock``: the run dir as
  above (owned by the worker's user or root) and the socket itself owned by one of them.
- ``write_private`` writes a file atomically with mode 0600 through a fresh temporary file opened
  with ``O_CREAT | O_EXCL | O_NOFOLLOW``: a planted symlink is never followed, only replaced.

Standard library only: the worker imports this inside the training process.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from perftracker.errors import ConfigError, TransportError

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


class RunDirError(ConfigError):
    """A run dir (or a file in it) is not safe to use: wrong owner, too open, or a symlink."""


class UnsafeSocketError(TransportError):
    """The agent socket (or its directory) is not owned by this user or root: not talked to."""


def _describe_owner(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def check_dir(path: str | os.PathLike[str], trusted_owners: tuple[int, ...] | None = None,
              what: str = "run dir") -> os.stat_result:
    """Raise RunDirError unless ``path`` is a directory (not a symlink), owned by one of
    ``trusted_owners`` (default: this process's effective uid) and not group- or other-writable."""
    owners = trusted_owners if trusted_owners is not None else (os.geteuid(),)
    p = os.fspath(path)
    try:
        st = os.lstat(p)
    except OSError as exc:
        raise RunDirError(f"{what} {p}: cannot inspect it ({exc.strerror})") from None
    if stat.S_ISLNK(st.st_mode):
        raise RunDirError(f"{what} {p} is a symlink; refusing it (remove it or choose another PERFTRACKER_RUN_DIR)")
    if not stat.S_ISDIR(st.st_mode):
        raise RunDirError(f"{what} {p} is not a directory")
    if st.st_uid not in owners:
        raise RunDirError(f"{what} {p} is owned by {_describe_owner(st.st_uid)}, not by this user "
                          f"({_describe_owner(os.geteuid())}); refusing it, since another user may have planted "
                          f"it (remove it or set PERFTRACKER_RUN_DIR to a directory of your own)")
    if st.st_mode & 0o022:
        raise RunDirError(f"{what} {p} has mode {stat.S_IMODE(st.st_mode):04o}: writable by group or others; "
                          f"refusing it (chmod 700 it, or remove it and let perftracker create it)")
    return st


def ensure_private_dir(path: str | os.PathLike[str], *, group_gid: int | None = None,
                       what: str = "run dir") -> Path:
    """Create ``path`` (mode 0700; 0750 with ``group_gid``) or check an existing one (``check_dir``).

    Missing parents are created with the usual mode. With ``group_gid`` the directory's group
    becomes that gid and it is group-readable (for workers of another uid in that group)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(p, PRIVATE_DIR_MODE)
    except FileExistsError:
        pass
    except OSError as exc:
        raise RunDirError(f"{what} {p}: cannot create it ({exc.strerror})") from None
    st = check_dir(p, what=what)
    if group_gid is not None:
        if st.st_gid != group_gid:
            os.chown(p, -1, group_gid, follow_symlinks=False)
        os.chmod(p, 0o750)
    elif stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(p, PRIVATE_DIR_MODE)  # ours, not writable by others, but readable: tighten
    return p


def make_private_dir(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` (and missing parents) with mode 0700 when it is missing; an existing one is
    kept as it is (a store's volume, a project's runs dir: not a predictable shared path)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(p, PRIVATE_DIR_MODE)
    except FileExistsError:
        pass
    return p


def check_agent_socket(path: str | os.PathLike[str]) -> None:
    """A worker's check before connecting: the socket's directory and the socket are owned by
    this user or root, and the directory is not writable by group or others. UnsafeSocketError
    otherwise (a missing socket is left to connect() to report)."""
    trusted = (os.geteuid(), 0)
    p = os.fspath(path)
    try:
        check_dir(os.path.dirname(p) or ".", trusted, what="agent socket directory")
    except RunDirError as exc:
        if "cannot inspect" in str(exc):
            return
        raise UnsafeSocketError(str(exc)) from None
    try:
        st = os.lstat(p)
    except OSError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise UnsafeSocketError(f"{p} is not a Unix socket")
    if st.st_uid not in trusted:
        raise UnsafeSocketError(f"agent socket {p} is owned by {_describe_owner(st.st_uid)}, not by this user or "
                                f"root; not connecting to it")


def open_private(path: str | os.PathLike[str], flags: int = os.O_WRONLY | os.O_TRUNC) -> int:
    """An fd of ``path`` opened for writing with mode 0600, never through a symlink."""
    return os.open(os.fspath(path), flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_FILE_MODE)


def write_private(path: str | os.PathLike[str], data: bytes | str) -> None:
    """Atomically replace ``path`` with ``data`` (mode 0600). The temporary file is new
    (O_EXCL | O_NOFOLLOW), and the rename replaces a symlink at ``path`` instead of following it."""
    p = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
