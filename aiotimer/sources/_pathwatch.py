"""Watch one directory entry (the FIFO's path) without polling where the OS allows.

On Linux, :class:`PathWatch` asks inotify (through ``ctypes``; no dependency) to report
what happens to the inode each watched entry names (removed, renamed, replaced,
attributes changed), and, only while an entry is missing, creations and renames in its
directory; :meth:`PathWatch.changed` returns when one concerns a watched entry. So an
idle server makes no wake-ups for it, nor does a busy directory (its own journal
written beside the FIFO, other files in ``/tmp``). Elsewhere, or when inotify cannot be
had (no more watches, a seccomp filter), it falls back to returning every
``poll_interval`` seconds; the caller then compares the entry with what it expects
either way, so both modes behave the same.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Final

import anyio

__all__ = ["PathWatch"]

_IN_NONBLOCK: Final[int] = os.O_NONBLOCK
_IN_CLOEXEC: Final[int] = os.O_CLOEXEC
_IN_ATTRIB: Final[int] = 0x004
_IN_MOVED_FROM: Final[int] = 0x040
_IN_MOVED_TO: Final[int] = 0x080
_IN_CREATE: Final[int] = 0x100
_IN_DELETE: Final[int] = 0x200
_IN_DELETE_SELF: Final[int] = 0x400
_IN_MOVE_SELF: Final[int] = 0x800
_IN_Q_OVERFLOW: Final[int] = 0x4000
_IN_IGNORED: Final[int] = 0x8000
_IN_ONLYDIR: Final[int] = 0x01000000
_IN_DONT_FOLLOW: Final[int] = 0x02000000
#: What is watched on an entry's own inode (a write into the FIFO is not).
_ON_ENTRY: Final[int] = _IN_ATTRIB | _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_DONT_FOLLOW
#: What is watched on the directory while an entry is missing.
_ON_DIRECTORY: Final[int] = (
    _IN_MOVED_FROM
    | _IN_MOVED_TO
    | _IN_CREATE
    | _IN_DELETE
    | _IN_DELETE_SELF
    | _IN_MOVE_SELF
    | _IN_ONLYDIR
)
#: Events on the directory's watch that end it (or lost events).
_DIRECTORY_GONE: Final[int] = _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_IGNORED
_HEADER: Final = struct.Struct("iIII")


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return None
    if not hasattr(libc, "inotify_init1"):
        return None
    return libc


class PathWatch:
    """Tells when the directory entry ``path`` (or one of ``also``, entries of the same
    directory) may have changed.

    Use as a context manager (it holds an inotify descriptor while open).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        also: Iterable[str | os.PathLike[str]] = (),
        poll_interval: float = 1.0,
    ) -> None:
        self.path = Path(path)
        self.poll_interval = poll_interval
        others = [Path(p) for p in also]
        if any(p.parent != self.path.parent for p in others):
            raise ValueError("every watched entry must be in the same directory")
        self._entries = [os.fsencode(p) for p in (self.path, *others)]
        self._names = {os.fsencode(p.name) for p in (self.path, *others)}
        self._libc: ctypes.CDLL | None = None
        self._fd = -1
        self._entry_wds: set[int] = set()  # the watches of the entries' current inodes
        self._dir_wd = -1  # the directory's watch, while an entry is missing
        self._seen: list[tuple[int, int] | None] | None = None  # the entries' inodes

    def __enter__(self) -> PathWatch:
        libc = _libc()
        if libc is None:
            return self
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            return self
        self._libc, self._fd = libc, fd
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_watching()

    async def changed(self) -> None:
        """Return once something may have happened to the entry (or a poll interval)."""
        while self._fd >= 0:
            if self._sync():
                return
            await anyio.wait_readable(self._fd)
            if self._drain():
                return
        await anyio.sleep(self.poll_interval)

    def _sync(self) -> bool:
        """Watch the inode each entry names now, and the directory while one is missing
        (or its inode cannot be watched); ``True`` if an entry is not what it was at the
        last call (or is missing at the first), or inotify failed (polling from now on)."""
        libc, fd = self._libc, self._fd
        assert libc is not None
        seen: list[tuple[int, int] | None] = []
        unwatched = False
        self._entry_wds = set()
        for entry in self._entries:
            wd = libc.inotify_add_watch(fd, entry, _ON_ENTRY)  # first: then look
            if wd >= 0:
                self._entry_wds.add(wd)
            elif ctypes.get_errno() in (errno.ENOSPC, errno.ENOMEM):  # out of watches
                self._stop_watching()
                return True
            else:  # missing, or not ours to watch (EACCES): the directory will tell
                unwatched = True
            try:
                st = os.lstat(entry)
            except OSError:
                seen.append(None)
            else:
                seen.append((st.st_dev, st.st_ino))
        missing = unwatched or None in seen
        if missing and self._dir_wd < 0:
            wd = libc.inotify_add_watch(fd, os.fsencode(self.path.parent), _ON_DIRECTORY)
            if wd < 0:
                self._stop_watching()
                return True
            self._dir_wd = wd
        elif not missing and self._dir_wd >= 0:
            libc.inotify_rm_watch(fd, self._dir_wd)  # its IN_IGNORED is not a change
            self._dir_wd = -1
        before, self._seen = self._seen, seen
        return seen != before if before is not None else None in seen

    def _stop_watching(self) -> None:
        """Close the inotify descriptor: poll from now on."""
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1

    def _drain(self) -> bool:
        """Read the pending events; ``True`` if one concerns an entry."""
        hit = False
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return hit
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                self._stop_watching()
                return True
            offset = 0
            while offset + _HEADER.size <= len(data):
                wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
                name = data[offset + _HEADER.size : offset + _HEADER.size + length]
                offset += _HEADER.size + length
                if mask & _IN_Q_OVERFLOW or wd in self._entry_wds:
                    hit = True
                elif wd == self._dir_wd >= 0:
                    if mask & _DIRECTORY_GONE:
                        self._stop_watching()  # the directory itself went away
                        return True
                    if name.rstrip(b"\0") in self._names:
                        hit = True
