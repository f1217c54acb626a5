"""The server behind a FIFO path: which kind it is, a descriptor to it, and what it may
be sent. :class:`~aiotimer.client.FifoClient` decides how to talk from this.

* **Which kind.** The marker beside the FIFO (:mod:`aiotimer._edges.marker`) names a live
  aiotimer server that reads this very FIFO: such a server gets one persistent
  descriptor and aiotimer's extension keys. A marker whose owner is not the FIFO's is
  not trusted (it reads as none). Without a marker the reader is taken for
  torch's ``FileTimerServer``: open, write, close per request, with torch's exact bytes
  (:func:`torch_request`; torch's server stops reaping while a writer keeps the pipe
  open).
* **Which descriptor.** The FIFO, opened ``O_WRONLY | O_NONBLOCK`` (``ENXIO``: no reader
  yet). When the marker names the server's Unix socket (``aiotimer serve --socket``),
  a connection to it instead: the kernel tells the server who this process is. It is
  ``SOCK_SEQPACKET`` (a write is whole or refused, like a FIFO write), so the client is
  the same over both; a socket that cannot be reached falls back to the FIFO.
* **Refusals.** A path that is not a FIFO, or not the FIFO the marker's server reads (a
  replaced path, a symlink), is never written to.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from typing import Final

from aiotimer._edges.marker import MarkerFile, read_live_marker
from aiotimer.errors import ServerUnavailableError
from aiotimer.wire import Request

__all__ = [
    "BROKEN_ERRNOS",
    "NO_READER_ERRNOS",
    "open_server",
    "torch_request",
    "unavailable_message",
]

log = logging.getLogger("aiotimer.client")

#: Opening the FIFO failed because no server reads it (yet): no FIFO, or no reader.
NO_READER_ERRNOS: Final = frozenset({errno.ENXIO, errno.ENOENT})
#: A persistent descriptor whose reader left: the FIFO (EPIPE) or the socket (ECONNRESET).
BROKEN_ERRNOS: Final = frozenset({errno.EPIPE, errno.ECONNRESET})


def open_server(path: str) -> tuple[int, MarkerFile | None]:
    """A non-blocking descriptor to the server reading the FIFO ``path``, and that
    server's marker (``None``: not an aiotimer server; the caller closes the
    descriptor after each request).

    Raises:
        OSError: the FIFO cannot be opened; an errno in :data:`NO_READER_ERRNOS` means
            no server reads it yet.
        ServerUnavailableError: ``path`` is not a FIFO, or not the FIFO the server
            named by its marker reads.
    """
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISFIFO(st.st_mode):
            raise ServerUnavailableError(
                f"{path!r} is not a FIFO; point the client at the path the timer "
                "server was started with (aiotimer serve --fifo PATH)"
            )
        # Only a marker of the FIFO's owner speaks for it: the server that made the
        # FIFO wrote it; another user's was planted (it could name the planter's socket).
        server = read_live_marker(path, owner=st.st_uid)
        if server is not None and not server.marker.reads(st):
            raise ServerUnavailableError(
                f"{path!r} is not the FIFO the timer server (pid "
                f"{server.marker.pid}) reads: the path was replaced (a symlink or "
                "another FIFO); refusing to send there. Check who changed the path; "
                "the server recreates its FIFO once the path is free"
            )
    except BaseException:
        os.close(fd)
        raise
    if server is not None and server.marker.socket is not None:
        sock = _connect(server.marker.socket)
        if sock is not None:  # the server's socket names this process: prefer it
            os.close(fd)
            fd = sock
    return fd, server


def _connect(path: str) -> int | None:
    """A non-blocking descriptor connected to the server's Unix socket, or ``None``.

    The socket is ``SOCK_SEQPACKET``: a write is one message, whole or refused with
    ``EAGAIN`` like a FIFO write, so the rest of the client is the same over both.
    """
    import socket  # noqa: PLC0415 (only clients of a server that offers a socket pay for it)

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        sock.connect(path)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        log.info("cannot connect to the timer server's socket %s (%s); using its FIFO", path, exc)
        return None
    return sock.detach()


def torch_request(request: Request) -> Request:
    """``request`` without aiotimer's extension fields (torch's exact bytes)."""
    return Request(
        pid=request.pid,
        scope_id=request.scope_id,
        expiration_time=request.expiration_time,
        signal=request.signal,
    )


def unavailable_message(path: str, error: OSError, waited: float) -> str:
    """What :class:`~aiotimer.errors.ServerUnavailableError` says when no server read
    ``path`` within ``waited`` seconds (``error``: the last attempt's)."""
    why = "does not exist" if error.errno == errno.ENOENT else "has no reader"
    return (
        f"no timer server reads {path!r} (the FIFO {why}; waited {waited:.2f}s): "
        "start one with `aiotimer serve --fifo PATH` (or embed TimerServer) before the "
        "workers, or raise connect_timeout if it is still starting"
    )
