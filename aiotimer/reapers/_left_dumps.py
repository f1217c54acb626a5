"""The dump files that a server's exited workers left behind: removed, or a bounded few
kept (:class:`LeftDumps`). Split from :mod:`aiotimer.reapers._dumps`, which reads dumps.
"""

from __future__ import annotations

import collections
import logging
import os
from pathlib import Path
from typing import Final

from aiotimer.reapers._dumps import _open_checked, _parse_header
from aiotimer.wire import dump_path_for

__all__ = ["MAX_KEPT_DUMPS", "LeftDumps"]

logger = logging.getLogger("aiotimer")


#: The most dump files of exited workers a server keeps (``keep=True``); older ones go.
MAX_KEPT_DUMPS: Final[int] = 64


class LeftDumps:
    """The dump files that a server's exited workers left behind.

    A worker's hook removes its file when the worker exits normally, but a worker killed
    by SIGKILL (a reap) cannot: its file stays in the dump directory. When the server
    sees one of its pinned workers gone, :meth:`exited` looks for that worker's file (its
    header names the same pid and start time, so a new process that got the pid is never
    touched) and removes it, or with ``keep`` keeps it, at most :data:`MAX_KEPT_DUMPS`
    of them (the oldest go first): the server's events already hold the dumps it took.

    A few small reads of a file in a private directory (opened without blocking, never
    followed if it is a link): done where the server learns of the exit.
    """

    __slots__ = ("_kept", "dump_dir", "keep")

    def __init__(self, dump_dir: str | os.PathLike[str] | None, *, keep: bool = False) -> None:
        #: The dump directory (``None``: :func:`~aiotimer.wire._dumpfile.dump_dir_for`'s
        #: default).
        self.dump_dir = dump_dir
        self.keep = keep
        self._kept: collections.deque[tuple[Path, int, int]] = collections.deque()

    @property
    def kept(self) -> tuple[Path, ...]:
        """The files kept (``keep``), oldest first."""
        return tuple(path for path, _, _ in self._kept)

    def exited(self, pid: int, start_time: int | None) -> None:
        """Worker ``pid``, started at ``start_time`` (``None``: unknown, its file is left
        alone), has exited: remove or keep the file it left."""
        if start_time is None:
            return
        path = dump_path_for(pid, self.dump_dir)
        try:
            fd = _open_checked(path)
        except OSError:
            return  # none left (or not one we may touch)
        try:
            st = os.fstat(fd)
            first = os.pread(fd, 256, 0).split(b"\n", 1)[0].decode("ascii", "replace")
        except OSError:
            return
        finally:
            os.close(fd)
        info = _parse_header(first, path)
        if info is None or info.pid != pid or info.start_time != start_time:
            return  # another process's file
        if not self.keep:
            _remove_if_same(path, st.st_dev, st.st_ino)
            return
        self._kept.append((path, st.st_dev, st.st_ino))
        while len(self._kept) > MAX_KEPT_DUMPS:
            _remove_if_same(*self._kept.popleft())


def _remove_if_same(path: Path, dev: int, ino: int) -> None:
    """Remove ``path`` if it is still the file ``(dev, ino)``."""
    try:
        st = os.lstat(path)
        if (st.st_dev, st.st_ino) == (dev, ino):
            os.unlink(path)
    except OSError as exc:
        if not isinstance(exc, FileNotFoundError):
            logger.warning("the dump file %s could not be removed: %s", path, exc)
