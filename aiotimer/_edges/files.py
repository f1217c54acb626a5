"""The one safe way to open what aiotimer owns: files and directories of this user only.

The journal, the statistics file, the event log, the marker, the control directory and
the dump files may sit in directories other users can write to, so every one is opened
here, under five rules:

* **No symlink is followed.** The last component is opened with ``O_NOFOLLOW``, and a
  directory is opened with ``O_DIRECTORY | O_NOFOLLOW``. (Components above it are the
  caller's choice of place.)
* **Nothing blocks on a FIFO or a device.** A file is opened ``O_NONBLOCK`` and
  ``fstat``-ed before any read or write: only a regular file is used (the flag is then
  cleared where the caller writes).
* **Only this user's files.** A file or directory of another uid is refused; so is an
  appended file with more than one link (a hard link to someone else's file).
* **Reads are capped.** A file larger than the caller's limit is refused, not read.
* **Writes are atomic.** :func:`write_atomic` writes a temporary file with an
  unpredictable name in the same directory (``O_CREAT | O_EXCL | O_NOFOLLOW``), flushes
  it, and renames it over the target, which must be absent or a regular file of this
  user; a crash leaves the old content or the new, never a torn file.

A refusal is an :class:`~aiotimer.errors.UnsafePathError` (an :class:`OSError`) whose
message is one line: what the path is for, the path, what is wrong, what to do.
Other failures (a missing directory, a full disk) are the :class:`OSError` the system
gave. No aiotimer import but :mod:`aiotimer.errors`: workers import this too.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import stat
from typing import Final

from aiotimer.errors import UnsafePathError

__all__ = [
    "check_private_dir",
    "create_exclusive",
    "make_private_dir",
    "open_owned",
    "open_owned_append",
    "read_owned",
    "read_shared",
    "remove_owned",
    "write_atomic",
]

_OPEN_DIR: Final[int] = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE_NEW: Final[int] = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_ELSEWHERE: Final[str] = "remove it or choose another path"

StrPath = str | os.PathLike[str]


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symbolic link (never followed)"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISREG, "a regular file"),
    ):
        if test(mode):
            return name
    return f"of unknown type {stat.S_IFMT(mode):o}"


def _refuse(what: str, path: StrPath, problem: str, remedy: str = _ELSEWHERE) -> UnsafePathError:
    return UnsafePathError(f"refusing the {what} {os.fspath(path)}: {problem}; {remedy}")


def _check_owned_file(what: str, path: StrPath, st: os.stat_result, *, any_owner: bool) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(what, path, f"it is {_kind(st.st_mode)}, not a regular file")
    if not any_owner and st.st_uid != os.geteuid():
        raise _refuse(
            what,
            path,
            f"it belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})",
        )


def _unusable(what: str, path: StrPath, exc: OSError, *, want_dir: bool = False) -> OSError:
    """``exc`` from opening ``path`` with ``O_NOFOLLOW`` (and ``O_NONBLOCK`` or
    ``O_DIRECTORY``), told plainly when a symlink (``ELOOP``), a FIFO without a reader
    (``ENXIO``) or something other than a directory (``ENOTDIR``) is in the way."""
    if exc.errno in (errno.ELOOP, errno.ENXIO, errno.ENOTDIR):
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            return exc
        want, ok = ("a directory", stat.S_ISDIR) if want_dir else ("a regular file", stat.S_ISREG)
        if not ok(mode):
            return _refuse(what, path, f"it is {_kind(mode)}, not {want}")
    return exc


def _open_regular(path: StrPath, flags: int, what: str, *, any_owner: bool, mode: int = 0) -> int:
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        raise _unusable(what, path, exc) from None
    try:
        _check_owned_file(what, path, os.fstat(fd), any_owner=any_owner)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_owned(path: StrPath, *, what: str = "file") -> int:
    """Open ``path`` for reading: a regular file of this user, never blocking.

    Args:
        path: the file.
        what: what the file is for, in the message (``"journal"``); every function here
            takes it.

    Returns:
        A file descriptor (``O_NONBLOCK``, which regular files ignore). Close it.

    Raises:
        UnsafePathError: it is a symlink, a FIFO, a device, ... or another user's.
        OSError: it cannot be opened (``FileNotFoundError`` when missing).
    """
    return _open_regular(path, os.O_RDONLY, what, any_owner=False)


def _read_capped(fd: int, path: StrPath, max_bytes: int, what: str) -> bytes:
    size = os.fstat(fd).st_size
    if size > max_bytes:
        raise _refuse(what, path, f"it holds {size:,} bytes, more than the {max_bytes:,} read")
    chunks, left = [], max_bytes + 1  # one more: a file still growing is caught too
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    if left <= 0:
        raise _refuse(what, path, f"it grew past the {max_bytes:,} bytes read")
    return b"".join(chunks)


def read_owned(path: StrPath, max_bytes: int, *, what: str = "file") -> bytes:
    """The content of ``path``, a regular file of this user of at most ``max_bytes``.

    Raises:
        UnsafePathError: it is not a regular file of this user, or is larger.
        OSError: it cannot be read (``FileNotFoundError`` when missing).
    """
    fd = open_owned(path, what=what)
    try:
        return _read_capped(fd, path, max_bytes, what)
    finally:
        os.close(fd)


def read_shared(
    path: StrPath, max_bytes: int, *, what: str = "file"
) -> tuple[bytes, os.stat_result]:
    """The content and status of ``path``: a regular file of *any* user of at most
    ``max_bytes``, for readers of what another user publishes (the marker).

    Raises:
        UnsafePathError: it is a symlink, a FIFO, a device, ..., or larger.
        OSError: it cannot be read (``FileNotFoundError`` when missing).
    """
    fd = _open_regular(path, os.O_RDONLY, what, any_owner=True)
    try:
        st = os.fstat(fd)
        return _read_capped(fd, path, max_bytes, what), st
    finally:
        os.close(fd)


def open_owned_append(path: StrPath, mode: int = 0o644, *, what: str = "file") -> int:
    """Open ``path`` for blocking appends, created with ``mode`` (minus the umask) when
    missing; an existing file must be a regular file of this user with one link.

    Returns:
        A file descriptor (``O_WRONLY | O_APPEND``, blocking). Close it.

    Raises:
        UnsafePathError: a symlink, a FIFO, a device, another user's file or a hard
            link is in the way.
        OSError: it cannot be opened (its directory is missing, read-only ...).
    """
    fd = _open_regular(
        path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, what, any_owner=False, mode=mode
    )
    try:
        if os.fstat(fd).st_nlink != 1:
            raise _refuse(what, path, "it has other hard links (it may be someone else's file)")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def create_exclusive(path: StrPath, mode: int = 0o600, *, what: str = "file") -> int:
    """Create ``path`` anew (exactly ``mode``) for appending; never open a file that was
    there. A stale regular file of this user (left by a dead process) is removed and the
    creation tried once more.

    Returns:
        A file descriptor (``O_WRONLY | O_APPEND``). Close it.

    Raises:
        UnsafePathError: something else is in the way (a symlink, a FIFO, another
            user's file), or it came back between the removal and the retry.
        OSError: it cannot be created.
    """
    flags = _CREATE_NEW | os.O_APPEND
    for _ in range(2):
        try:
            fd = os.open(path, flags, 0o600)
        except FileExistsError:
            with contextlib.suppress(FileNotFoundError):  # gone meanwhile: just retry
                _check_owned_file(what, path, os.lstat(path), any_owner=False)
                os.unlink(path)
            continue
        try:
            os.fchmod(fd, mode)
        except BaseException:
            os.close(fd)
            raise
        return fd
    raise _refuse(what, path, "a file came back at once after the stale one was removed")


def write_atomic(
    path: StrPath,
    data: bytes,
    mode: int = 0o600,
    *,
    durable: bool = True,
    what: str = "file",
    replace: bool = False,
) -> None:
    """Replace ``path`` with ``data`` atomically, the file's mode exactly ``mode``.

    The data goes to a new temporary file with an unpredictable name in the same
    directory, which is then renamed over ``path``.

    Args:
        path: the file; absent or a regular file of this user.
        data: the whole new content.
        mode: the permission bits (the umask does not apply).
        durable: ``fsync`` the file before the rename and the directory after, so the
            new content survives a power loss. Not needed for a file that is
            meaningless after a reboot (a journal tied to the boot id, a marker naming a
            pid).
        what: what the file is for, in the message.
        replace: rename over whatever is at ``path`` but a directory (a symlink,
            another user's file, a FIFO): for a path only this file may hold, so that a
            squatter cannot keep it. The rename replaces the directory entry; what it
            named is never opened, followed or written (the kernel still refuses
            another user's file in a sticky directory, unless root).

    Raises:
        UnsafePathError: something other than a regular file of this user is at
            ``path`` (it is left in place), or a directory with ``replace``.
        OSError: it cannot be written (the temporary file is removed).
    """
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(path)
        if not replace:
            _check_owned_file(what, path, st, any_owner=False)
        elif stat.S_ISDIR(st.st_mode):
            raise _refuse(what, path, "it is a directory")
    tmp = f"{os.fspath(path)}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, _CREATE_NEW, 0o600)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        dir_fd = os.open(os.path.dirname(os.fspath(path)) or ".", _OPEN_DIR)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def remove_owned(path: StrPath, *, what: str = "file") -> bool:
    """Remove ``path`` if it is a regular file of this user; ``False`` if it was absent.

    Raises:
        UnsafePathError: something else is there (left in place).
        OSError: it cannot be removed.
    """
    try:
        _check_owned_file(what, path, os.lstat(path), any_owner=False)
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def make_private_dir(path: StrPath, *, what: str = "directory") -> bool:
    """Make ``path`` a private directory of this user: created with mode 0700 when
    missing (its parent must exist), else used only if :func:`check_private_dir` passes.

    Returns:
        ``True`` if it was created now.

    Raises:
        UnsafePathError: it exists and is not private (see :func:`check_private_dir`).
        OSError: it cannot be created (its parent is missing, read-only ...).
    """
    try:
        os.mkdir(path, 0o700)  # the umask can only take more away
    except FileExistsError:
        created = False
    else:
        created = True
    check_private_dir(path, what=what)  # also when made now: it may have been swapped
    return created


def check_private_dir(path: StrPath, *, what: str = "directory") -> None:
    """Check that ``path`` is a directory (not a symlink to one) of this user that
    neither group nor others can write to.

    Raises:
        UnsafePathError: it is not.
        OSError: it cannot be opened (``FileNotFoundError`` when missing).
    """
    try:
        fd = os.open(path, _OPEN_DIR)
    except OSError as exc:
        raise _unusable(what, path, exc, want_dir=True) from None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if st.st_uid != os.geteuid():
        raise _refuse(
            what,
            path,
            f"it belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()}): someone "
            "else may have made it",
        )
    if st.st_mode & 0o022:
        raise _refuse(
            what,
            path,
            f"group or others may write to it (mode {stat.S_IMODE(st.st_mode):04o})",
            "make it private (chmod 700) or choose another path",
        )
