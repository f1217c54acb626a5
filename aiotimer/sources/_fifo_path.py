"""The FIFO source's path: claiming it, opening the FIFO, publishing the marker, watching.

How it works:

* **Its mode** (:func:`check_fifo_mode`): never readable by group or others. A reader
  takes the lines it reads away from the server (a hung worker's acquire stolen is a
  hang never reaped, a release stolen is a healthy worker killed), so such a mode is
  refused, not masked. Write bits for others are allowed (and warned about elsewhere).
* **Claiming the path.** A missing path gets a new FIFO, chmod-ed to exactly ``mode``
  (umask does not apply). An existing path is replaced only if it is a FIFO owned by
  this user that nobody reads: a live server (aiotimer's or torch's) is detected by
  opening the FIFO for writing without blocking, which succeeds only while some process
  has it open for reading. Anything that is not a FIFO (file, directory, symlink) is
  refused and left untouched.
* **Opening it.** The FIFO is opened ``O_RDONLY | O_NONBLOCK``, its buffer grown to
  ``PIPE_SIZE`` where the OS allows, and a dummy writer descriptor is kept open, so the
  reader never sees end-of-file when clients come and go (no spinning).
* **The marker.** Once clients can send, ``path + MARKER_SUFFIX`` is written atomically
  (JSON naming the server and the FIFO's inode), so clients know they may keep a
  descriptor open, and refuse the path if it names another file. A squatted marker path
  (another user's file, a symlink) is replaced by a rename, or, where that is refused
  too, the server serves without a marker (one error line); it never stops serving for
  it.
* **Watching the path** (:class:`~aiotimer.sources._pathwatch.PathWatch`: inotify, no
  polling). A FIFO removed from under the server is made anew and published (the old
  one is still read, for clients holding it open); a path replaced by anything else (a
  symlink, a file, another FIFO) is reported and left alone until it is free again; a
  marker removed or overwritten is published again.
* **Leaving.** Both descriptors of every FIFO are closed and the marker removed; a FIFO
  is removed only if this run created it and the path still names the same inode.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import pathlib
import stat
from collections.abc import Callable, Mapping
from typing import Final

import anyio

from aiotimer._edges.marker import (
    AIOTIMER,
    Marker,
    marker_path,
    publish_marker,
    read_marker,
    remove_marker,
)
from aiotimer._version import __version__
from aiotimer.errors import SourceError
from aiotimer.sources._pathwatch import PathWatch

__all__ = ["PIPE_SIZE", "FifoPath", "OpenFifo", "check_fifo_mode", "grow_pipe"]

#: The pipe capacity asked for (Linux ``F_SETPIPE_SZ``; the default is 64 KiB). A larger
#: buffer absorbs bursts from many writers, so fewer of them meet a full pipe (torch's
#: clients fail outright when they do), and one wake-up reads more lines.
PIPE_SIZE: Final[int] = 1 << 20
#: The most FIFOs one run reads: the current one and those it replaced (still held open
#: by clients) after the path was removed.
_MAX_FIFOS: Final[int] = 4
_Inode = tuple[int, int]
#: The read bits of group and others: a FIFO never has them.
_FOREIGN_READ: Final[int] = 0o044

logger = logging.getLogger("aiotimer")


def _inode(st: os.stat_result) -> _Inode:
    return (st.st_dev, st.st_ino)


def check_fifo_mode(mode: int) -> int:
    """``mode``, if a FIFO may have these permission bits: ``0o000..0o777`` without read
    for group or others (see the module docs).

    Raises:
        ValueError: it may not; the message is one line saying why and what to use.
    """
    if not 0 <= mode <= 0o777:
        raise ValueError(f"FIFO mode {mode:#o} is not permission bits between 0000 and 0777")
    if mode & _FOREIGN_READ:
        who = " and ".join(
            name for bit, name in ((0o040, "its group"), (0o004, "every user")) if mode & bit
        )
        raise ValueError(
            f"FIFO mode {mode:04o} would let {who} read the FIFO, taking requests meant "
            f"for the server (hung workers then go unreaped); use {mode & ~_FOREIGN_READ:04o}"
        )
    return mode


def grow_pipe(fd: int, size: int = PIPE_SIZE) -> int:
    """Ask for a pipe buffer of ``size`` bytes, best effort; return the capacity it has.

    Unprivileged users are capped by ``/proc/sys/fs/pipe-max-size`` (1 MiB by default)
    and a per-user total; then the current capacity is kept. Returns 0 where the OS
    cannot tell (not Linux).
    """
    set_size = getattr(fcntl, "F_SETPIPE_SZ", None)
    get_size = getattr(fcntl, "F_GETPIPE_SZ", None)
    if set_size is None or get_size is None:
        return 0
    with contextlib.suppress(OSError):
        return fcntl.fcntl(fd, set_size, size)
    return fcntl.fcntl(fd, get_size)


class OpenFifo:
    """A FIFO this run made at ``path`` and opened: its inode, our two descriptors.
    Its buffer is grown to :data:`PIPE_SIZE` unless ``grow`` is false.

    Raises:
        SourceError: the path cannot be claimed, or the FIFO not opened.
    """

    __slots__ = ("inode", "path", "read_fd", "reading", "write_fd")

    def __init__(self, path: pathlib.Path, mode: int, *, grow: bool = True) -> None:
        self.path = path
        self.reading = anyio.CancelScope()  # the task reading it
        _create(path, mode)
        self.read_fd = self.write_fd = -1
        self.inode: _Inode | None = None
        flags = os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            self.read_fd = os.open(path, os.O_RDONLY | flags)
            st = os.fstat(self.read_fd)
            if not stat.S_ISFIFO(st.st_mode) or st.st_uid != os.geteuid():
                raise SourceError(f"{path} was replaced while it was being created")
            self.inode = _inode(st)
            # mkfifo applied the umask; through the descriptor no symlink can interfere.
            os.fchmod(self.read_fd, mode)
            if grow:
                grow_pipe(self.read_fd)
            # The dummy writer: with it, read() never returns end-of-file.
            self.write_fd = os.open(path, os.O_WRONLY | flags)
        except OSError as exc:
            self.close()
            raise SourceError(f"cannot open FIFO {path}: {exc}") from exc
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close both descriptors; remove the FIFO unless the path now holds another file."""
        for fd in (self.read_fd, self.write_fd):
            if fd >= 0:
                os.close(fd)
        self.read_fd = self.write_fd = -1
        if self.inode is None:
            return
        with contextlib.suppress(FileNotFoundError):
            if _inode(os.lstat(self.path)) == self.inode:
                os.unlink(self.path)


def _create(path: pathlib.Path, mode: int) -> None:
    """Make ``path`` a new FIFO, replacing a stale FIFO of ours.

    Raises:
        SourceError: the path is not a FIFO, not ours, or a live server reads it.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        _check_replaceable(path, st)
        os.unlink(path)
    try:
        os.mkfifo(path, mode)
    except FileExistsError as exc:
        raise SourceError(f"{path} appeared while the FIFO was being created") from exc
    except OSError as exc:
        raise SourceError(f"cannot create FIFO {path}: {exc}") from exc


def _kind(st: os.stat_result) -> str:
    if stat.S_ISLNK(st.st_mode):
        return "a symlink"
    if stat.S_ISDIR(st.st_mode):
        return "a directory"
    return "another FIFO" if stat.S_ISFIFO(st.st_mode) else "not a FIFO"


def _check_replaceable(path: pathlib.Path, st: os.stat_result) -> None:
    """Raise :class:`SourceError` unless ``path`` is a stale FIFO of ours."""
    if not stat.S_ISFIFO(st.st_mode):
        kind = _kind(st)
        raise SourceError(
            f"{path} exists and is {kind}; refusing to replace it. "
            "Choose another path or remove it yourself."
        )
    if st.st_uid != os.geteuid():
        raise SourceError(
            f"FIFO {path} belongs to uid {st.st_uid}, not to this user; refusing to take it"
        )
    try:
        probe = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # no reader: nobody serves it, it is stale
            return
        raise SourceError(f"cannot check whether FIFO {path} is in use: {exc}") from exc
    os.close(probe)
    found = read_marker(path)
    owner = None if found is None else found.marker.pid
    who = f"aiotimer server pid {owner}" if owner is not None else "another process"
    raise SourceError(
        f"FIFO {path} is being served by {who}; stop that server or choose another path"
    )


class FifoPath:
    """One run's hold on the FIFO path: the FIFOs it made there (the newest one at the
    path) and the marker beside it (see the module docs).

    Args:
        path: where the FIFO lives.
        mode: the FIFO's permission bits, applied exactly.
        marker: extra keys for the marker file.
    """

    def __init__(self, path: pathlib.Path, mode: int, marker: Mapping[str, object]) -> None:
        self._path = path
        self._mode = mode
        self._marker = marker
        self._fifos: list[OpenFifo] = []
        self._published = False
        self._unpublished: str | None = None  # why the marker could not be published

    def open(self) -> OpenFifo:
        """Claim the path, make and open the FIFO, publish the marker.

        Raises:
            SourceError: the path cannot be claimed or the FIFO opened.
        """
        fifo = OpenFifo(self._path, self._mode)
        self._fifos.append(fifo)
        self._publish(fifo)
        return fifo

    async def keep(self, read: Callable[[OpenFifo], None]) -> None:
        """Keep the path naming our newest FIFO, and the marker ours; forever. ``read``
        is called with each FIFO made anew, to start reading it.

        Removed: a new FIFO is made and published (the old one is still read, for the
        clients that hold it open). Replaced by anything else: reported, left alone
        (clients refuse it: its inode is not the marker's) until the path is free again.
        """
        reported: str | None = None
        with PathWatch(self._path, also=(marker_path(self._path),)) as watch:
            while True:
                await watch.changed()
                current = self._fifos[-1]
                try:
                    st: os.stat_result | None = os.lstat(self._path)
                except FileNotFoundError:
                    st = None
                except OSError as exc:
                    logger.error("cannot check the FIFO path %s: %s", self._path, exc)
                    continue
                if st is not None and _inode(st) == current.inode:
                    reported = None
                    found = read_marker(self._path)
                    if found is None or found.marker.pid != os.getpid():
                        if self._unpublished is None:
                            logger.warning(
                                "the marker of %s was removed or replaced; publishing it again",
                                self._path,
                            )
                        self._publish(current)
                    continue
                if st is not None:
                    kind = _kind(st)
                    if reported != kind:
                        reported = kind
                        logger.error(
                            "the FIFO path %s was replaced by %s; clients refuse it. The "
                            "server goes on reading its FIFO through the descriptors it "
                            "holds, and makes a new one once the path is free",
                            self._path,
                            kind,
                        )
                    continue
                try:
                    fresh = OpenFifo(self._path, self._mode)
                except SourceError as exc:
                    logger.error("cannot recreate the FIFO %s: %s", self._path, exc)
                    continue
                self._fifos.append(fresh)
                if len(self._fifos) > _MAX_FIFOS:
                    # The oldest: its clients have long reconnected. Its reader closes it.
                    self._fifos.pop(0).reading.cancel()
                self._publish(fresh)
                reported = None
                read(fresh)
                logger.warning("the FIFO %s was removed; made a new one", self._path)

    def close(self) -> None:
        """Remove the marker (if published), then close every FIFO of the run."""
        try:
            if self._published:
                remove_marker(self._path)
        except OSError as exc:  # a squatter's file in its place: left there
            logger.error("cannot remove the marker of %s: %s", self._path, exc)
        finally:
            for fifo in self._fifos:
                fifo.close()
            self._fifos.clear()

    def republish(self) -> None:
        """Write the marker again for the newest FIFO (its extra keys changed)."""
        if self._fifos:
            self._publish(self._fifos[-1])

    def _publish(self, fifo: OpenFifo) -> None:
        """Publish the marker of ``fifo``; a failure is logged (once per cause) and the
        server serves on without it (see :func:`~aiotimer._edges.marker.publish_marker`)."""
        assert fifo.inode is not None
        dev, ino = fifo.inode
        marker = Marker(
            server=AIOTIMER, pid=os.getpid(), version=__version__, fifo_dev=dev, fifo_ino=ino
        )
        why = publish_marker(self._path, marker, self._marker)
        if why is None:
            self._published = True
            if self._unpublished is not None:
                logger.warning("the marker of %s is published again", self._path)
        elif why != self._unpublished:
            logger.error("%s", why)
        self._unpublished = why
