"""The persistent descriptor of a :class:`~aiotimer.client.FifoClient` to an aiotimer
server, and the lines that must reach that server before anything else.

* **Open** (:meth:`FifoLink.open_locked`): the descriptor of
  :func:`~aiotimer.client._fifo_peer.open_server` is kept when an aiotimer server is
  there; for any other reader it is the caller's, to close after its one write.
* **Which server** (:meth:`FifoLink.recheck_locked`): at most every
  ``marker_check_interval`` seconds the marker is read again: gone, the aiotimer server
  left (the descriptor is closed, the client talks torch's way); another one, a new
  server took over the FIFO.
* **The bell** (:mod:`aiotimer.sources._bell`): when the marker names one and the
  descriptor is the FIFO, a second descriptor to the bell, which the client rings
  (:meth:`FifoLink.ring_locked`) after an acquire with less than ``bell_lead`` seconds
  to its deadline, so the server reads it at once; the ring's byte says the lead
  (:mod:`aiotimer._edges.ring`), which the server paces its reads by for
  ``bell_window`` seconds, so within that time an acquire with a lead as long or
  longer than one rung for needs no ring.
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

import contextlib
import logging
import os
import select
import stat
import threading
import time
from collections.abc import Mapping

from aiotimer._edges.marker import MarkerFile, read_live_marker
from aiotimer._edges.ring import PLAIN_RING, ring_byte
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
        bell_lead: an acquire with less than this many seconds to its deadline rings
            the bell (``0.0``: no bell).
        stamps: the server's marker asks for the ``at`` extension on both lines of a
            block (set with the bell, from the same marker).
        recheck_at: when the marker is due to be checked again (``time.monotonic()``).
    """

    __slots__ = (
        "_bell",
        "_bell_window",
        "_connected_before",
        "_flusher",
        "_open_scopes",
        "_path",
        "_rung_lead",
        "_rung_until",
        "_server",
        "backlog",
        "bell_lead",
        "fd",
        "lock",
        "recheck_at",
        "stamps",
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
        self._bell: int | None = None  # the bell's descriptor
        self.bell_lead = 0.0
        self.stamps = False
        self._bell_window = 0.0  # how long the server paces by a lead rung for
        # The lead last rung for, and until when the server paces by it (monotonic).
        self._rung_lead = 0.0
        self._rung_until = 0.0

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
            self._open_bell_locked(fd, server)
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
        if self.fd is not None:
            self._open_bell_locked(self.fd, server)
        self._queue_replay_locked()

    def ring_locked(self, lead: float, now: float) -> None:
        """Ring the bell, if there is one, for an acquire written at ``now`` (monotonic)
        ``lead`` seconds from its deadline, unless the server still paces its reads by
        a lead as short rung for earlier. A ring that fails is no loss: a full bell
        (``EAGAIN``) has rings the server has yet to read, and a server that left
        (``EPIPE``) is found by the next write to the FIFO."""
        if self._bell is None or (lead >= self._rung_lead and now < self._rung_until):
            return
        ring = ring_byte(lead)
        with contextlib.suppress(OSError):
            os.write(self._bell, ring)
            if ring != PLAIN_RING:  # a plain ring teaches the server no lead
                self._rung_lead, self._rung_until = lead, now + self._bell_window

    def _open_bell_locked(self, fd: int, server: MarkerFile) -> None:
        """Open the bell ``server``'s marker names, if ``fd`` is its FIFO (a socket
        needs none) and the bell is a FIFO of the FIFO's owner; else go without."""
        self._close_bell_locked()
        marker = server.marker
        self.stamps = marker.stamps is True
        if marker.bell is None or not marker.bell_lead or marker.bell_lead <= 0:
            return
        st = os.fstat(fd)
        if not stat.S_ISFIFO(st.st_mode):
            return
        flags = os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            bell = os.open(marker.bell, flags)
        except OSError as exc:
            log.info("cannot open the timer server's bell %s (%s)", marker.bell, exc)
            return
        bst = os.fstat(bell)
        if not stat.S_ISFIFO(bst.st_mode) or bst.st_uid != st.st_uid:
            os.close(bell)
            log.warning("%s is not the timer server's bell; not ringing it", marker.bell)
            return
        self._bell, self.bell_lead = bell, marker.bell_lead
        self._bell_window = marker.bell_window or 0.0

    def _close_bell_locked(self) -> None:
        bell, self._bell = self._bell, None
        self.bell_lead = self._bell_window = self._rung_until = 0.0
        self.stamps = False
        if bell is not None:
            os.close(bell)

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
        self._close_bell_locked()
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
        self._close_bell_locked()
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
        for name in ("fd", "_bell"):
            fd = getattr(self, name, None)  # None also when __init__ raised early
            if fd is not None:
                setattr(self, name, None)
                os.close(fd)
