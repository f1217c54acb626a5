"""The Unix-socket source: the FIFO's request lines over a socket whose peers the kernel
names.

Over a FIFO a request says which pid it is for, and the server has to believe it: a
client can name any process. Over this socket the kernel tells the server who connected
(``SO_PEERCRED``: pid and uid), so a request is accepted only for the connected process
itself; a line naming another pid is rejected.

How it works:

* **Messages, not a byte stream.** The socket is ``SOCK_SEQPACKET``: each write is one
  message, delivered whole or refused with ``EAGAIN`` when there is no room, never cut,
  exactly as a FIFO write of at most ``PIPE_BUF`` bytes. So a client writes one line per
  message without ever handling a partial write, and the line format is the FIFO's.
* **Claiming the path.** A missing path gets a new socket, chmod-ed to exactly ``mode``.
  An existing path is replaced only if it is a socket owned by this user that nobody
  accepts on (a connection attempt is refused); anything else is refused and left alone.
* **Peers.** Each accepted connection reads ``SO_PEERCRED`` once. Where the kernel has
  ``SO_PEERPIDFD`` (Linux >= 6.5) the peer is pinned by a pidfd while its start time is
  read, so the start time is proven to be the connected process's; elsewhere it is read
  at accept. Every request of the connection is stamped with that start time (a line
  carrying another is rejected), so the server never pins a process that got the
  peer's pid after the peer died.
* **Reading.** One task per connection reads what is readable into its own
  :class:`~aiotimer.wire.LineDecoder` (lines of different clients never mix) and
  hands each batch to the sink, and registers a drain (see :mod:`aiotimer.sources._base`)
  that returns what a peer sent before a deadline, for the server to apply before it
  acts on that deadline: every message queued on the connection when the server decided
  to act (``FIONREAD``), however many, and only when one of the peer's own timers is due,
  as a connection carries requests for its peer alone (a flood by other peers costs it
  nothing; the peer's own is bounded by what was queued at the decision).
  End of stream flushes a partial line as a rejection.
  A closed connection is not an exit by itself (a forked child may hold the socket);
  the worker's exit is seen through its pidfd as for every source.
* **Leaving.** Connections and the listening socket are closed, and the path removed
  if it is still the socket this source bound.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import os
import pathlib
import select
import socket
import stat
import struct
import termios
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Final

import anyio
import anyio.abc
import anyio.lowlevel
import msgspec

from aiotimer._edges.procfs import read_start_time
from aiotimer.errors import ProcessGoneError, SourceError
from aiotimer.sources._base import RequestSink, draining
from aiotimer.sources._budget import lines_end
from aiotimer.wire import (
    MAX_LINE_BYTES,
    Decoded,
    LineDecoder,
    Rejection,
    Request,
    encode,
)

__all__ = ["SocketSource", "peer_credentials"]

#: ``SO_PEERPIDFD`` (Linux >= 6.5); Python names it from 3.12 on.
_SO_PEERPIDFD: Final[int] = getattr(socket, "SO_PEERPIDFD", 77)
_UCRED: Final = struct.Struct("3i")
_BACKLOG: Final[int] = 1024
_CHUNK: Final[int] = 1 << 16


@dataclass(frozen=True, slots=True)
class Peer:
    """Who is on the other end of a connection, as the kernel says."""

    pid: int
    uid: int
    start_time: int | None
    """The peer's start time (``/proc/<pid>/stat`` field 22); ``None`` without ``/proc``."""


def peer_credentials(conn: socket.socket) -> Peer:
    """The connected peer of Unix socket ``conn``.

    Raises:
        ProcessGoneError: the peer has already exited.
        OSError: the socket has no peer credentials (not a connected Unix socket).
    """
    pid, uid, _gid = _UCRED.unpack(
        conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    )
    if pid <= 0:
        raise ProcessGoneError("the peer's pid is not visible here (another pid namespace)")
    pidfd = _peer_pidfd(conn)
    try:
        start_time = read_start_time(pid)
        if pidfd is not None and _readable(pidfd):
            raise ProcessGoneError(f"peer process {pid} has exited")
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return Peer(pid, uid, start_time)


def _peer_pidfd(conn: socket.socket) -> int | None:
    try:
        fd = conn.getsockopt(socket.SOL_SOCKET, _SO_PEERPIDFD)
    except OSError:
        return None  # ENOPROTOOPT: a kernel without SO_PEERPIDFD
    return fd if fd >= 0 else None


def _readable(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def _bind_to_peer(batch: Decoded, peer: Peer) -> Decoded:
    """Keep the requests that name ``peer`` itself, stamped with its start time."""
    out = Decoded(rejections=batch.rejections)
    for req in batch.requests:
        problem = None
        if req.pid != peer.pid:
            problem = (
                f"pid {req.pid} is not the connected process (pid {peer.pid}); over the "
                "socket a client can only name itself"
            )
        elif req.start_time is not None and req.start_time != peer.start_time:
            problem = (
                f"start_time {req.start_time} is not the connected process's ({peer.start_time})"
            )
        if problem is not None:
            out.rejections.append(Rejection.of(problem, _wire(req)))
        elif req.start_time is None and peer.start_time is not None:
            out.requests.append(msgspec.structs.replace(req, start_time=peer.start_time))
        else:
            out.requests.append(req)
    return out


def _wire(req: Request) -> bytes:
    try:
        return encode(req)[:-1]
    except ValueError:  # too long to encode as one line: its msgspec form
        return msgspec.json.encode(req)


class _Listener:
    """The listening socket of one :meth:`SocketSource.serve` run and the inode it made."""

    __slots__ = ("inode", "path", "sock")

    def __init__(self, path: pathlib.Path, mode: int) -> None:
        self.path = path
        self.inode: tuple[int, int] | None = None
        _clear_stale(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            self.sock.bind(os.fspath(path))
            st = os.lstat(path)
            self.inode = (st.st_dev, st.st_ino)
            os.chmod(path, mode, follow_symlinks=False)
            self.sock.listen(_BACKLOG)
            self.sock.setblocking(False)
        except OSError as exc:
            self.close()
            raise SourceError(f"cannot listen on Unix socket {path}: {exc}") from exc
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self.sock.close()
        if self.inode is None:
            return
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(self.path)
            if (st.st_dev, st.st_ino) == self.inode:
                os.unlink(self.path)


def _clear_stale(path: pathlib.Path) -> None:
    """Remove a stale socket of ours at ``path``; refuse anything else.

    Raises:
        SourceError: the path is not a socket, not ours, or a live server accepts on it.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SourceError(
            f"{path} exists and is not a socket; refusing to replace it. "
            "Choose another path or remove it yourself."
        )
    if st.st_uid != os.geteuid():
        raise SourceError(
            f"socket {path} belongs to uid {st.st_uid}, not to this user; refusing to take it"
        )
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as probe:
        probe.setblocking(False)
        try:
            probe.connect(os.fspath(path))
        except ConnectionRefusedError:
            os.unlink(path)  # nobody accepts on it: stale
            return
        except BlockingIOError:
            pass  # a full backlog: someone listens
        except OSError as exc:
            raise SourceError(f"cannot check whether socket {path} is in use: {exc}") from exc
    raise SourceError(
        f"socket {path} is being served by another process; stop it or choose another path"
    )


class SocketSource:
    """Serve request lines on a Unix ``SOCK_SEQPACKET`` socket at ``path`` (see the module
    docstring).

    Args:
        path: where to bind the socket.
        mode: permission bits of the socket file (connecting needs write permission).
        max_line: the longest accepted line, newline included.
    """

    __slots__ = ("_max_line", "_mode", "_name", "_path")

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        mode: int = 0o600,
        max_line: int = MAX_LINE_BYTES,
    ) -> None:
        self._path = pathlib.Path(path)
        self._mode = mode
        self._max_line = max_line
        self._name = f"socket:{self._path}"
        LineDecoder(max_line)  # validates max_line now rather than in serve()

    @property
    def name(self) -> str:
        """``"socket:<path>"``."""
        return self._name

    @property
    def path(self) -> pathlib.Path:
        """The socket's path."""
        return self._path

    async def serve(
        self,
        sink: RequestSink,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Bind and listen, then feed ``sink`` from every connection until cancelled.

        Raises:
            SourceError: the path cannot be claimed or bound (see the class docstring).
        """
        listener = _Listener(self._path, self._mode)
        try:
            async with anyio.create_task_group() as tg:
                task_status.started()
                while True:
                    await anyio.wait_readable(listener.sock)
                    try:
                        conn, _ = listener.sock.accept()
                    except (BlockingIOError, ConnectionAbortedError):
                        continue
                    tg.start_soon(self._serve_connection, conn, sink)
        finally:
            listener.close()

    async def _serve_connection(self, conn: socket.socket, sink: RequestSink) -> None:
        with conn:
            conn.setblocking(False)
            try:
                peer = peer_credentials(conn)
            except (ProcessGoneError, OSError) as exc:
                reason = f"connection refused: no identifiable peer ({exc})"
                sink.submit(Decoded(rejections=[Rejection.of(reason, b"")]), self._name)
                return
            connection = _Connection(conn, peer, self._name, self._max_line)
            with draining(sink, connection):
                while not connection.ended:
                    if connection.held:  # the rest of a message of garbage
                        await anyio.lowlevel.checkpoint()
                    else:
                        await anyio.wait_readable(conn)
                    batch = connection.receive()
                    if batch is not None and (batch.requests or batch.rejections):
                        sink.submit(batch, self._name)

    def __repr__(self) -> str:
        return f"<SocketSource {str(self._path)!r} mode={self._mode:#o}>"


class _Connection:
    """One accepted connection: its decoder, and its drain (a
    :class:`~aiotimer.sources._base.Drain`). Every request it accepts names its peer
    (the others are rejected), so only an expiry of the peer's own timers needs it
    drained; then every message queued on it when the decision was made
    (:meth:`hold`) is applied, however many: the queue is the peer's own, so what
    other peers send costs this drain nothing."""

    __slots__ = ("_conn", "_decoder", "_limit", "_peer", "_received", "ended", "held", "name")

    def __init__(self, conn: socket.socket, peer: Peer, name: str, max_line: int) -> None:
        self._conn = conn
        self._peer = peer
        self.name = name
        self._decoder = LineDecoder(max_line)
        self.ended = False
        #: What a message held past one step's lines, decoded by the next steps.
        self.held = b""
        self._received = 0  # bytes received so far
        # The drain's bound: bytes received plus those queued at the decision (None:
        # not measured yet in this decision).
        self._limit: int | None = 0

    def hold(self) -> None:
        """A decision is made now: the drain is bounded to the messages queued now,
        measured when the decision first looks for the peer (at once, in the same
        call, unless the peer falls due later in the decision), so that a decision
        costs nothing on the connections of workers that are not due."""
        self._limit = None

    def look(self, pids: AbstractSet[int] | None) -> bool:
        """``True`` when the peer is one of ``pids`` and messages it sent before the
        decision are still to decode."""
        if self.ended or not (pids is None or self._peer.pid in pids):
            return False
        if self._limit is None:
            self._limit = self._received + _queued(self._conn)
        return bool(self.held) or self._received < self._limit

    def step(self) -> Decoded | None:
        """The drain's step: :meth:`receive`, within the bound; ``None`` once every
        message queued at the decision was decoded."""
        limit = self._received if self._limit is None else self._limit
        if self.ended or (not self.held and self._received >= limit):
            return None
        return self.receive()

    def receive(self) -> Decoded | None:
        """Decode the next message (or the rest of one: at most one step's lines, see
        :mod:`aiotimer.sources._budget`): what it held, bound to the peer (at end of
        stream: the partial line held, rejected); ``None`` when nothing is queued or it
        has ended."""
        if self.ended:
            return None
        chunk, self.held = self.held, b""
        if not chunk:
            try:
                chunk = self._conn.recv(_CHUNK)
            except BlockingIOError:
                return None
            except OSError:
                chunk = b""  # ECONNRESET: the peer is gone, as at end of stream
            self._received += len(chunk)
        end = lines_end(chunk)
        if end < len(chunk):
            chunk, self.held = chunk[:end], chunk[end:]
        batch = self._decoder.feed(chunk) if chunk else self._decoder.flush()
        self.ended = not chunk
        if batch.requests or batch.rejections:
            return _bind_to_peer(batch, self._peer)
        return batch


def _queued(conn: socket.socket) -> int:
    """Bytes queued on ``conn`` (``FIONREAD``: every message, for a Unix socket); 0 if
    it cannot tell (a closed socket)."""
    count = array.array("i", [0])
    try:
        fcntl.ioctl(conn.fileno(), termios.FIONREAD, count)
    except OSError:
        return 0
    return count[0]
