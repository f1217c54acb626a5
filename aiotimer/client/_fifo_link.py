"""The persistent descriptor of a :class:`~aiotimer.client.FifoClient` to an aiotimer
server, and the lines that must reach that server before anything else.

* **Open** (:meth:`FifoLink.open_locked`): the descriptor of
  :func:`~aiotimer.client._fifo_peer.open_server` is kept when an aiotimer server is
  there; for any other reader it is the caller's, to close after its one write.
* **Which server** (:meth:`FifoLink.recheck_locked`): at most every
  ``marker_check_interval`` seconds the marker is read again: gone, the aiotimer server
  left (the descriptor is closed, the client talks torch's way); another one, a new
  server took over the FIFO.
* **The backlog**: lines written before anything else. A new server starts empty, so
  on reconnecting (a reopen after the first, or a new marker) the acquire lines of the
  client's open blocks are queued (replay); a release that found the pipe full for
  ``write_timeout`` is queued too, and a background thread writes the backlog as soon
  as the pipe has room, while the same server is there (a broken pipe means a new
  server, which would not know these blocks: the backlog is dropped with the
  descriptor).

A lock guards all of it; the methods named ``*_locked`` are called with it held.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Mapping

from aiotimer._edges.marker import MarkerFile, read_live_marker
from aiotimer.client._fifo_peer import open_server

__all__ = ["FifoLink"]

log = logging.getLogger("aiotimer.client")


class FifoLink:
    """The descriptor to the aiotimer server behind ``path`` (see the module docs).

    ``open_scopes`` is the client's map of its open blocks to their (acquire, release)
    lines, read when a replay is queued.

    Attributes:
        lock: guards everything below, and the writes.
        fd: the persistent descriptor, or ``None`` (not connected, or not an aiotimer
            server).
        backlog: the lines to write before any other, oldest first.
        recheck_at: when the marker is due to be checked again (``time.monotonic()``).
    """

    __slots__ = (
        "_connected_before",
        "_flusher",
        "_open_scopes",
        "_path",
        "_server",
        "backlog",
        "fd",
        "lock",
        "recheck_at",
    )

    def __init__(self, path: str, open_scopes: Mapping[str, tuple[bytes, bytes]]) -> None:
        self._path = path
        self._open_scopes = open_scopes
        self.lock = threading.Lock()
        self.fd: int | None = None
        self._server: MarkerFile | None = None  # whom the persistent descriptor talks to
        self.recheck_at = 0.0
        self._connected_before = False
        self.backlog: list[bytes] = []
        self._flusher: threading.Thread | None = None

    def open_locked(self, recheck_every: float) -> int:
        """A descriptor to the server reading the FIFO, kept (with a replay queued on a
        reconnection) if it is an aiotimer server; else the caller's to close.

        Raises:
            OSError, ServerUnavailableError: as
                :func:`~aiotimer.client._fifo_peer.open_server` does.
        """
        fd, server = open_server(self._path)
        if server is not None:
            self.fd, self._server = fd, server
            self.recheck_at = time.monotonic() + recheck_every
            if self._connected_before:
                self._queue_replay_locked()
            self._connected_before = True
        return fd

    def recheck_locked(self, recheck_every: float) -> None:
        """If due: has another server taken over the FIFO, or has the server left?"""
        now = time.monotonic()
        if now <= self.recheck_at:
            return
        self.recheck_at = now + recheck_every
        owner = None if self._server is None else self._server.uid  # the FIFO's, checked
        server = read_live_marker(self._path, owner=owner)
        if server == self._server:
            return
        if server is None:  # the aiotimer server left; whoever reads now, be torch-safe
            log.info("the aiotimer server of %s left; closing the descriptor", self._path)
            self.close_locked()
            return
        self._server = server  # a new server reads the same FIFO: it starts empty
        self._queue_replay_locked()

    def write_backlog_locked(self, fd: int) -> None:
        """Write the backlog, oldest first (raises what ``os.write`` raises; what was
        written is gone from it)."""
        backlog = self.backlog
        while backlog:
            os.write(fd, backlog[0])
            del backlog[0]

    def retry_release(self, line: bytes) -> None:
        """Queue a release ``line`` that could not be written in time: it goes out before
        anything else, and a background thread writes it while the same server is there.
        Without a persistent descriptor (torch's server, or none) there is nothing to
        retry against."""
        with self.lock:
            if self.fd is None:
                return
            self.backlog.append(line)
            if self._flusher is None or not self._flusher.is_alive():
                self._flusher = threading.Thread(
                    target=self._flush, name="aiotimer-release-retry", daemon=True
                )
                self._flusher.start()

    def close_locked(self) -> None:
        """Close the descriptor and drop the backlog (a new server would not know it)."""
        fd, self.fd = self.fd, None
        self._server = None
        self.backlog = []
        if fd is not None:
            os.close(fd)

    def reset_in_child(self) -> None:
        """In a forked child: drop the parent's descriptor, lock, backlog and thread."""
        self.lock = threading.Lock()
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)
        self._server = None
        self.backlog = []
        self._flusher = None  # threads do not survive a fork
        self._connected_before = False

    def _queue_replay_locked(self) -> None:
        self.backlog = [lines[0] for lines in list(self._open_scopes.values())]
        log.info("(re)connected to %s; re-sending %d open scopes", self._path, len(self.backlog))

    def _flush(self) -> None:
        """Write the backlog as soon as the pipe has room; stop when it is empty or the
        server is gone."""
        while True:
            with self.lock:
                fd = self.fd
                if fd is None or not self.backlog:
                    return
                try:
                    self.write_backlog_locked(fd)
                    return
                except BlockingIOError:
                    wait_fd = os.dup(fd)
                except OSError:
                    self.close_locked()  # the server is gone; so is what it should learn
                    return
            try:  # writable: room for PIPE_BUF bytes, so for a line
                poller = select.poll()
                poller.register(wait_fd, select.POLLOUT)
                poller.poll(1000.0)
            finally:
                os.close(wait_fd)

    def __del__(self) -> None:
        fd = getattr(self, "fd", None)  # None also when __init__ raised early
        if fd is not None:
            self.fd = None
            os.close(fd)
