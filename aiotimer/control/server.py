"""The control socket: HTTP/1.1 + JSON on a Unix socket, and ``/metrics`` over TCP.

Access is the file system's and the kernel's business: the socket is created with mode
0600 in a private directory (made 0700, or an existing one of this user that nobody
else can write to: never another user's), and every connection's peer is checked with
``SO_PEERCRED``: only the server's own user and root are answered, anyone else gets
``403`` and is reported through ``on_refused``.

Requests are answered in the event loop of the owner, so every read is a consistent
snapshot; handlers keep their work bounded (see :mod:`aiotimer.control.snapshot`) so a
request never stalls expiry. Routes are data: a list of :class:`Route` (method, path
pattern, handler), so a layer on top (a supervisor) adds its own. A handler that raises
gets its request a ``500`` and a log line, nothing more.

Both listeners serve under a cap (``max_connections`` at once: a new connection takes
the place of the one that has waited longest for its peer, to send a request or to take
an answer, or is closed when all are busy working on a request), keep a reserve of
descriptors for the server, close a connection that sends no complete request within
``request_timeout`` seconds, and survive ``accept()`` failing (see
:mod:`aiotimer.control._listen`). :class:`~aiotimer.control.ControlPlane` runs them.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import re
import socket
import stat
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import anyio
import anyio.abc
from anyio import create_tcp_listener, create_unix_listener

from aiotimer._edges.files import make_private_dir
from aiotimer._edges.limits import DescriptorReserve
from aiotimer.control._http import (
    HttpRequest,
    HttpResponse,
    PeerCredentials,
    error_response,
    peer_credentials,
    serve_connection,
)
from aiotimer.control._listen import Slot, serve_listener
from aiotimer.control._paths import MAX_SOCKET_PATH, fits_socket
from aiotimer.errors import ControlError, UnsafePathError

__all__ = [
    "MAX_CONNECTIONS",
    "REQUEST_TIMEOUT",
    "ControlServer",
    "Route",
    "serve_tcp",
]

logger = logging.getLogger("aiotimer.control")

#: Connections served at once per listener; more are closed at once.
MAX_CONNECTIONS: Final[int] = 16
#: Seconds a peer has to send each request (and to take its answer) before it is
#: disconnected.
REQUEST_TIMEOUT: Final[float] = 10.0


@dataclass(frozen=True, slots=True)
class Route:
    """``handler`` answers ``method`` requests whose path matches ``pattern`` in full;
    the pattern's named groups are passed to it as keyword arguments (strings)."""

    method: str
    pattern: str
    handler: Callable[..., Awaitable[HttpResponse]]


class ControlServer:
    """Serves ``routes`` on a Unix socket at ``path`` until cancelled.

    Args:
        path: the socket's path. Its directory is created (mode 0700) if missing; an
            existing one must be a directory of this user that group and others cannot
            write to.
        routes: what it answers; anything else gets ``404`` (or ``405``).
        on_refused: called with the credentials of each refused peer (another user).
        max_connections: connections served at once (see
            :mod:`aiotimer.control._listen` for who makes room for whom).
        request_timeout: seconds a peer has to send each request.
        reserve: descriptors a connection must leave free, else it is closed at once.

    Raises (from :meth:`serve`):
        ControlError: the path is too long for a Unix socket, its directory is not
            private (a symlink, another user's, writable by others), another live
            server listens there, or something other than a socket is in the way.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        routes: Sequence[Route],
        *,
        on_refused: Callable[[PeerCredentials], None] | None = None,
        max_connections: int = MAX_CONNECTIONS,
        request_timeout: float = REQUEST_TIMEOUT,
        reserve: DescriptorReserve | None = None,
    ) -> None:
        self.path = Path(path)
        self._router = _Router(routes)
        self._on_refused = on_refused
        self._uid = os.getuid()
        self._max_connections = max_connections
        self._request_timeout = request_timeout
        self._reserve = reserve

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Bind the socket, report started, then serve until cancelled; the socket file
        is removed on the way out."""
        created = _prepare(self.path)
        listener = await create_unix_listener(self.path, mode=0o600)
        ident = os.stat(self.path)
        try:
            async with listener:
                task_status.started()
                await serve_listener(
                    listener,
                    self._connection,
                    name=f"control socket {self.path}",
                    max_connections=self._max_connections,
                    reserve=self._reserve,
                )
        finally:
            with contextlib.suppress(OSError):
                now = os.stat(self.path)
                if (now.st_ino, now.st_dev) == (ident.st_ino, ident.st_dev):
                    os.unlink(self.path)
            if created:
                with contextlib.suppress(OSError):  # not empty: someone else's files
                    self.path.parent.rmdir()

    async def _connection(self, stream: anyio.abc.SocketStream, slot: Slot) -> None:
        peer = peer_credentials(stream.extra(anyio.abc.SocketAttribute.raw_socket))
        allowed = peer.uid in (self._uid, 0)
        if not allowed and self._on_refused is not None:
            self._on_refused(peer)

        async def handle(request: HttpRequest) -> HttpResponse:
            if not allowed:
                return error_response(403, f"uid {peer.uid} may not use this control socket")
            return await self._router.dispatch(request)

        await serve_connection(stream, handle, request_timeout=self._request_timeout, activity=slot)


class _Router:
    """Maps a request to the first route whose method and whole path match."""

    def __init__(self, routes: Sequence[Route]) -> None:
        self._routes = [(r.method, re.compile(r.pattern), r.handler) for r in routes]

    async def dispatch(self, request: HttpRequest) -> HttpResponse:
        """The matching route's answer; ``404``/``405`` when none matches, ``400`` when
        the handler raises :class:`~aiotimer.errors.ControlError` (a bad parameter),
        ``500`` (and a log line) when it raises anything else."""
        methods: list[str] = []
        for method, pattern, handler in self._routes:
            match = pattern.fullmatch(request.path)
            if match is None:
                continue
            if method != request.method:
                methods.append(method)
                continue
            try:
                return await handler(request, **match.groupdict())
            except ControlError as exc:
                return error_response(400, str(exc))
            except Exception as exc:
                logger.exception("the control handler of %s %s raised", method, request.path)
                return error_response(500, f"internal error: {exc!r}")
        if methods:
            return error_response(405, f"use {' or '.join(methods)} on {request.path}")
        return error_response(404, f"no such endpoint: {request.path}")


async def serve_tcp(
    routes: Sequence[Route],
    port: int,
    *,
    host: str = "127.0.0.1",
    max_connections: int = MAX_CONNECTIONS,
    request_timeout: float = REQUEST_TIMEOUT,
    reserve: DescriptorReserve | None = None,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``routes`` over TCP on ``host:port`` until cancelled, for scrapers that
    cannot read a Unix socket; reports the bound port as started (``port=0``: any free
    one). No peer check is possible there: give it read-only routes (``GET /metrics``)
    and keep it on the loopback interface.

    Raises:
        ControlError: the port cannot be bound (in use, or not allowed).
    """
    router = _Router(routes)
    try:
        multi = await create_tcp_listener(local_host=host, local_port=port)
    except OSError as exc:
        raise ControlError(f"cannot serve metrics on {host}:{port}: {exc}") from exc

    async def connection(stream: anyio.abc.SocketStream, slot: Slot) -> None:
        await serve_connection(
            stream, router.dispatch, request_timeout=request_timeout, activity=slot
        )

    async with multi, anyio.create_task_group() as tg:
        bound = multi.listeners[0].extra(anyio.abc.SocketAttribute.local_port)
        for listener in multi.listeners:
            assert isinstance(listener, anyio.abc.SocketListener)
            tg.start_soon(
                functools.partial(
                    serve_listener,
                    listener,
                    connection,
                    name=f"metrics port {host}:{bound}",
                    max_connections=max_connections,
                    reserve=reserve,
                )
            )
        task_status.started(bound)


def _prepare(path: Path) -> bool:
    """Make ``path`` bindable: its directory is private (made 0700 here, or a directory
    of this user nobody else can write to), and nothing but a stale socket is at
    ``path`` (a live server's socket is never taken over). ``True`` if it created the
    directory."""
    if not fits_socket(path):
        raise ControlError(
            f"control socket path {str(path)!r} is longer than {MAX_SOCKET_PATH} bytes, "
            "the limit of a Unix socket; pass a shorter control path"
        )
    path.parent.parent.mkdir(parents=True, exist_ok=True)
    try:  # another user's directory would see, forge and answer our requests
        if make_private_dir(path.parent, what="control directory"):
            return True
    except UnsafePathError as exc:
        raise ControlError(str(exc)) from exc
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(st.st_mode):
        raise ControlError(
            f"{str(path)!r} exists and is not a socket; remove it or choose another control path"
        )
    if _listening(path):
        raise ControlError(
            f"another server listens on the control socket {str(path)!r}; "
            "stop it or choose another control path"
        )
    path.unlink(missing_ok=True)  # stale: left by a server that died
    return False


def _listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(os.fspath(path))
        except OSError as exc:
            if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
                return False
            raise ControlError(f"cannot probe the control socket {str(path)!r}: {exc}") from exc
    return True
