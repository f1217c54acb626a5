"""HTTP/1.1 on an anyio byte stream, through h11: requests in, responses out.

h11 owns the protocol (parsing, framing, keep-alive); this module only moves bytes
between it and the stream, bounds what a peer may send (header and body size, time to
send a request) and maps a request to a response through a handler.
"""

from __future__ import annotations

import socket
import struct
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import anyio
import anyio.abc
import anyio.lowlevel
import h11
import msgspec

__all__ = [
    "MAX_BODY",
    "MAX_HEADERS",
    "Activity",
    "HttpRequest",
    "HttpResponse",
    "PeerCredentials",
    "error_response",
    "json_response",
    "peer_credentials",
    "serve_connection",
]

#: The largest request head (request line + headers) accepted, in bytes.
MAX_HEADERS: Final[int] = 16 * 1024
#: The largest request body accepted, in bytes.
MAX_BODY: Final[int] = 64 * 1024
_CHUNK: Final[int] = 64 * 1024

_encode_json = msgspec.json.Encoder().encode


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """One request: ``method`` (upper case), ``path`` (decoded, no query), ``query``
    (last value per key) and ``body``."""

    method: str
    path: str
    query: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class HttpResponse:
    """One response: ``status``, ``body`` and its ``content_type``."""

    status: int
    body: bytes
    content_type: str = "application/json"


def json_response(value: Any, status: int = 200) -> HttpResponse:
    """``value`` (anything msgspec encodes: structs, dataclasses, dicts) as JSON."""
    return HttpResponse(status, _encode_json(value) + b"\n")


def error_response(status: int, message: str) -> HttpResponse:
    """``{"error": message, "status": status}``."""
    return json_response({"error": message, "status": status}, status)


@dataclass(frozen=True, slots=True)
class PeerCredentials:
    """Who is at the other end of a Unix socket, as the kernel says (``SO_PEERCRED``)."""

    pid: int
    uid: int
    gid: int


def peer_credentials(sock: socket.socket) -> PeerCredentials:
    """The peer's pid, uid and gid (Linux ``SO_PEERCRED``)."""
    fmt = "3i"
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize(fmt))
    pid, uid, gid = struct.unpack(fmt, raw)
    return PeerCredentials(pid, uid, gid)


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]


class Activity(Protocol):
    """Told when a connection waits for its peer and when it works on a request (the
    listener's :class:`~aiotimer.control._listen.Slot`)."""

    def waiting(self) -> None:
        """The connection waits for its peer: for (the rest of) a request, or to take
        an answer."""

    def working(self) -> None:
        """The connection has a whole request and works on it."""


class _Quiet:
    def waiting(self) -> None:
        pass

    def working(self) -> None:
        pass


async def serve_connection(
    stream: anyio.abc.ByteStream,
    handle: Handler,
    *,
    request_timeout: float,
    activity: Activity | None = None,
) -> None:
    """Answer requests on ``stream`` until the peer closes it, keep-alive permitting.

    A peer that takes more than ``request_timeout`` seconds to send a request (or its
    body), or to take its answer, is disconnected; a malformed or oversized request (a
    head over :data:`MAX_HEADERS` bytes, even when it came in one read) gets a 4xx and
    the connection is closed. ``activity`` is told when the connection waits for a
    request (or for the peer to take its answer) and when it works on one.
    """
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADERS)
    activity = activity if activity is not None else _Quiet()
    while True:
        # One request per loop step: a peer's pipelined requests wait their turn behind
        # expiry and other connections instead of taking the loop for all of them.
        await anyio.lowlevel.checkpoint()
        activity.waiting()
        try:
            with anyio.fail_after(request_timeout):
                request = await _read_request(conn, stream)
        except TimeoutError:
            return
        except _BadRequestError as exc:
            with anyio.move_on_after(request_timeout):
                await _send(conn, stream, error_response(exc.status, exc.message), close=True)
            return
        if request is None:
            return
        activity.working()
        response = await handle(request)
        # Waiting again, for the peer to take the answer: a peer that pipelines requests
        # and never reads must not hold its place against a newcomer (nor does one that
        # keeps a connection idle).
        activity.waiting()
        with anyio.move_on_after(request_timeout) as sending:
            await _send(conn, stream, response, close=False)
        if sending.cancelled_caught:
            return  # a peer that does not take its answer
        if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
            return  # h11 decided the connection closes (HTTP/1.0, Connection: close)
        conn.start_next_cycle()


class _BadRequestError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def _read_request(conn: h11.Connection, stream: anyio.abc.ByteStream) -> HttpRequest | None:
    """The next whole request, or ``None`` when the peer closed the connection."""
    head: h11.Request | None = None
    body = bytearray()
    # Bytes of this request's head h11 has been given so far: h11 bounds a head only
    # while it is incomplete, so one that arrives whole in one read is measured here.
    fed = len(conn.trailing_data[0])
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise _BadRequestError(exc.error_status_hint, f"bad request: {exc}") from None
        if event is h11.NEED_DATA:
            try:
                data = await stream.receive(_CHUNK)
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                data = b""
            conn.receive_data(data)
            fed += len(data)
            if not data and conn.their_state is h11.IDLE:
                return None
        elif isinstance(event, h11.Request):
            if fed - len(conn.trailing_data[0]) > MAX_HEADERS:
                raise _BadRequestError(431, f"request head over {MAX_HEADERS} bytes")
            head = event
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_BODY:
                raise _BadRequestError(413, f"request body over {MAX_BODY} bytes")
        elif isinstance(event, h11.EndOfMessage):
            assert head is not None
            return _request(head, bytes(body))
        elif isinstance(event, h11.ConnectionClosed):
            return None
        # h11.PAUSED cannot happen before we respond


def _request(head: h11.Request, body: bytes) -> HttpRequest:
    target = urllib.parse.urlsplit(head.target.decode("ascii", "replace"))
    query = dict(urllib.parse.parse_qsl(target.query, keep_blank_values=True))
    path = urllib.parse.unquote(target.path)
    return HttpRequest(head.method.decode("ascii", "replace").upper(), path, query, body)


async def _send(
    conn: h11.Connection, stream: anyio.abc.ByteStream, response: HttpResponse, *, close: bool
) -> None:
    if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
        return  # too late to answer (h11 already sent or gave up)
    headers = [
        ("Content-Type", response.content_type),
        ("Content-Length", str(len(response.body))),
        ("Cache-Control", "no-store"),
    ]
    if close:
        headers.append(("Connection", "close"))
    try:
        data = conn.send(h11.Response(status_code=response.status, headers=headers))
        data += conn.send(h11.Data(data=response.body)) or b""
        data += conn.send(h11.EndOfMessage()) or b""
        await stream.send(data or b"")
    except (h11.LocalProtocolError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        return
