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
- ``open_owned`` / ``read_owned`` open a file only when it is a regular file (not a symlink:
  ``O_NOFOLLOW``) of this user that group and others cannot write (``check_owned_file`` on the open
  descriptor, so nothing can be swapped in between): the embedded localizer's ``localizer.json``,
  ``token``, ``localizer.lock`` and ``agent.log``.

Standard library only: the worker imports this inside the training process.
"""

from __future__ import annotations

import errno
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
              what: str = "run dir", other: str = "set PERFTRACKER_RUN_DIR to a directory of your own"
              ) -> os.stat_result:
    """Raise RunDirError unless ``path`` is a directory (not a symlink), owned by one of
    ``trusted_owners`` (default: this process's effective uid) and not group- or other-writable.
    ``other`` is the way out the message offers besides removing it."""
    owners = trusted_owners if trusted_owners is not None else (os.geteuid(),)
    p = os.fspath(path)
    try:
        st = os.lstat(p)
    except OSError as exc:
        raise RunDirError(f"{what} {p}: cannot inspect it ({exc.strerror})") from None
    if stat.S_ISLNK(st.st_mode):
        raise RunDirError(f"{what} {p} is a symlink; refusing it (remove it or {other})")
    if not stat.S_ISDIR(st.st_mode):
        raise RunDirError(f"{what} {p} is not a directory")
    if st.st_uid not in owners:
        raise RunDirError(f"{what} {p} is owned by {_describe_owner(st.st_uid)}, not by this user "
                          f"({_describe_owner(os.geteuid())}); refusing it, since another user may have planted "
                          f"it (remove it or {other})")
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


def check_owned_file(fd: int, path: str | os.PathLike[str], what: str = "file") -> os.stat_result:
    """Raise RunDirError unless the open ``fd`` (of ``path``) is a regular file owned by this
    process's effective uid and not writable by group or others."""
    st = os.fstat(fd)
    p = os.fspath(path)
    if not stat.S_ISREG(st.st_mode):
        raise RunDirError(f"{what} {p} is not a regular file; refusing it (remove it)")
    if st.st_uid != os.geteuid():
        raise RunDirError(f"{what} {p} is owned by {_describe_owner(st.st_uid)}, not by this user "
                          f"({_describe_owner(os.geteuid())}); refusing it, since another user may have planted "
                          f"it (remove it)")
    if st.st_mode & 0o022:
        raise RunDirError(f"{what} {p} has mode {stat.S_IMODE(st.st_mode):04o}: writable by group or others; "
                          f"refusing it (chmod 600 it, or remove it)")
    return st


def open_owned(path: str | os.PathLike[str], flags: int = os.O_RDONLY, what: str = "file") -> int:
    """An fd of ``path`` opened with ``flags`` (add ``O_CREAT`` to create it, mode 0600), never
    through a symlink, and only when ``check_owned_file`` accepts it: RunDirError otherwise
    (a missing file without ``O_CREAT`` raises FileNotFoundError)."""
    p = os.fspath(path)
    try:
        fd = os.open(p, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, PRIVATE_FILE_MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RunDirError(f"{what} {p} is a symlink; refusing it (remove it)") from None
        raise
    try:
        check_owned_file(fd, p, what)
        if flags & (os.O_WRONLY | os.O_RDWR):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_owned(path: str | os.PathLike[str], what: str = "file", max_bytes: int = 1 << 20) -> str | None:
    """The text of ``path`` (at most ``max_bytes``) when ``open_owned`` accepts it; None when it
    is missing. RunDirError when it is a symlink, another user's, or writable by others."""
    try:
        fd = open_owned(path, os.O_RDONLY, what)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as fh:
        return fh.read(max_bytes).decode("utf-8", "replace")


def write_in_run_dir(run_dir: str | os.PathLike[str], path: str | os.PathLike[str], data: bytes | str) -> None:
    """``write_private`` of ``path`` inside ``run_dir``, after the run dir's checks (issue 46: the
    window cost ledger was written through a run dir another user planted). The run dir is
    created 0700 when missing, else it must pass ``check_dir`` (owned by this user, not writable by
    group or others; its mode is left as it is: a run dir shared with a group stays shared); each
    directory between it and ``path`` is ``ensure_private_dir``'s. RunDirError otherwise."""
    root = Path(run_dir)
    rel = Path(path).relative_to(root)  # ValueError: not inside
    root.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(root, PRIVATE_DIR_MODE)
    except FileExistsError:
        pass
    except OSError as exc:
        raise RunDirError(f"run dir {root}: cannot create it ({exc.strerror})") from None
    check_dir(root)
    d = root
    for part in rel.parts[:-1]:
        d = ensure_private_dir(d / part, what="run dir folder")
    write_private(d / rel.name, data)


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
