"""Watch one directory entry (the FIFO's path) without polling where the OS allows.

On Linux, :class:`PathWatch` asks inotify (through ``ctypes``; no dependency) to report
creations, deletions, renames and attribute changes in the entry's directory, and
:meth:`PathWatch.changed` returns when one concerns the entry's name, so an idle server
makes no wake-ups for it. Elsewhere, or when inotify cannot be had (no more watches,
a seccomp filter), it falls back to returning every ``poll_interval`` seconds; the caller
then compares the entry with what it expects either way, so both modes behave the same.
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
_WATCHED: Final[int] = (
    _IN_ATTRIB
    | _IN_MOVED_FROM
    | _IN_MOVED_TO
    | _IN_CREATE
    | _IN_DELETE
    | _IN_DELETE_SELF
    | _IN_MOVE_SELF
    | _IN_ONLYDIR
)
#: Events that concern the whole directory (or lost events): always "changed".
_ANY: Final[int] = _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_Q_OVERFLOW | _IN_IGNORED
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
        self._names = {os.fsencode(p.name) for p in (self.path, *others)}
        self._fd = -1

    def __enter__(self) -> PathWatch:
        libc = _libc()
        if libc is None:
            return self
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            return self
        directory = os.fsencode(self.path.parent)
        if libc.inotify_add_watch(fd, directory, _WATCHED) < 0:
            os.close(fd)
            return self
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    async def changed(self) -> None:
        """Return once something may have happened to the entry (or a poll interval)."""
        if self._fd < 0:
            await anyio.sleep(self.poll_interval)
            return
        while True:
            await anyio.wait_readable(self._fd)
            if self._drain():
                return

    def _drain(self) -> bool:
        """Read the pending events; ``True`` if one concerns the entry."""
        hit = False
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return hit
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = -1  # fall back to polling from now on
                return True
            offset = mask = 0
            while offset + _HEADER.size <= len(data):
                _wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
                name = data[offset + _HEADER.size : offset + _HEADER.size + length]
                offset += _HEADER.size + length
                if mask & _ANY or name.rstrip(b"\0") in self._names:
                    hit = True
            if mask & _IN_IGNORED:  # the directory itself went away
                os.close(self._fd)
                self._fd = -1
                return True
