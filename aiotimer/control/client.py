"""A small blocking client of the control socket (what ``aiotimer status`` uses).

One request per connection, HTTP/1.1 through h11 on a plain Unix socket with a timeout.
Find the socket from a FIFO path with :meth:`ControlClient.for_fifo`: an aiotimer server
names its control socket in the marker file beside its FIFO.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
import urllib.parse
from pathlib import Path
from typing import TypeVar

import h11
import msgspec

from aiotimer._edges.marker import read_live_marker, read_marker
from aiotimer.control.snapshot import EventPage, StatusSnapshot
from aiotimer.errors import ControlError, ServerUnavailableError

__all__ = ["ControlClient", "control_path_for_fifo"]

_T = TypeVar("_T")
_MAX_RESPONSE = 64 * 1024 * 1024


def _until(sock: socket.socket, deadline: float) -> None:
    """Let the next operation on ``sock`` wait only until ``deadline`` (monotonic).

    Raises:
        TimeoutError: the deadline has passed.
    """
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    sock.settimeout(left)


def control_path_for_fifo(fifo: str | os.PathLike[str]) -> Path:
    """The control socket named in the marker beside ``fifo``.

    Raises:
        ServerUnavailableError: no live aiotimer server serves ``fifo`` (no FIFO, no
            marker, the marker's server is gone, or the marker is not the FIFO
            owner's: planted, not trusted).
        ControlError: the server runs without a control socket.
    """
    try:
        owner: int | None = os.stat(fifo).st_uid
    except OSError:
        owner = None
    found = read_marker(fifo)
    if found is None or owner is None:
        what = "no FIFO" if owner is None else "no aiotimer marker beside it"
        raise ServerUnavailableError(
            f"no aiotimer server serves {os.fspath(fifo)!r} ({what}); is it running?"
        )
    if found.uid != owner:
        raise ServerUnavailableError(
            f"the marker beside {os.fspath(fifo)!r} belongs to uid {found.uid}, not to the "
            f"FIFO's owner (uid {owner}): someone else planted it; not trusted. Name the "
            "control socket with --control, and remove the marker"
        )
    marker = found.marker
    if read_live_marker(fifo) is None:
        raise ServerUnavailableError(
            f"the aiotimer server of {os.fspath(fifo)!r} (pid {marker.pid}) is gone; "
            "its marker is stale"
        )
    if marker.control is None:
        raise ControlError(
            f"the aiotimer server of {os.fspath(fifo)!r} (pid {marker.pid}) runs without a "
            "control socket; restart it without --no-control (an embedding program "
            "serves one with aiotimer.control.ControlPlane)"
        )
    return Path(marker.control)


class ControlClient:
    """Talks to the control socket at ``path``; each call (connecting, sending and the
    whole answer) takes at most ``timeout`` seconds.

    Raises (from every request method):
        ServerUnavailableError: nothing serves the socket (missing, or stale).
        ControlError: the server answered with an error (its message is included), gave
            no whole answer within ``timeout``, or closed the connection (at its
            connection cap with every connection busy, or short of descriptors).
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 5.0) -> None:
        self.path = Path(path)
        self.timeout = timeout

    @classmethod
    def for_fifo(cls, fifo: str | os.PathLike[str], *, timeout: float = 5.0) -> ControlClient:
        """The client of the server on FIFO ``fifo`` (see :func:`control_path_for_fifo`)."""
        return cls(control_path_for_fifo(fifo), timeout=timeout)

    # -- endpoints --------------------------------------------------------------------

    def state(self, *, limit: int | None = None) -> StatusSnapshot:
        """``GET /v1/state``: the server's state, lists cut at ``limit`` (server default)."""
        query = {} if limit is None else {"limit": str(limit)}
        return self._decode(self.get("/v1/state", query), StatusSnapshot)

    def events(self, *, since: int = 0, limit: int | None = None) -> EventPage:
        """``GET /v1/events``: the recorded events numbered above ``since``."""
        query = {"since": str(since)}
        if limit is not None:
            query["limit"] = str(limit)
        return self._decode(self.get("/v1/events", query), EventPage)

    def metrics(self) -> str:
        """``GET /metrics``: the Prometheus text exposition."""
        return self.get("/metrics").decode("utf-8")

    def dump(self, pid: int, *, timeout: float = 2.0) -> str | None:
        """``POST /v1/workers/<pid>/dump``: a stack dump of worker ``pid``, ``None`` if
        none came within ``timeout`` seconds."""
        body = self.request("POST", f"/v1/workers/{pid}/dump", {"timeout": f"{timeout:g}"})
        text = json.loads(body).get("stacks")
        return text if isinstance(text, str) else None

    def hang_report(self) -> dict[str, object]:
        """``GET /v1/hang-report`` (under a supervisor): the last hang report, with its
        ``text``; raises :class:`~aiotimer.errors.ControlError` when none was taken."""
        return self._json(self.get("/v1/hang-report"))

    def restart(self, rank: int) -> dict[str, object]:
        """``POST /v1/ranks/<rank>/restart`` (under a supervisor): restart worker
        ``rank`` now; its new ``state``, ``pid`` and ``restarts``."""
        return self._json(self.request("POST", f"/v1/ranks/{rank}/restart"))

    def stop(self, rank: int) -> dict[str, object]:
        """``POST /v1/ranks/<rank>/stop`` (under a supervisor): stop worker ``rank``
        for good; its new ``state``."""
        return self._json(self.request("POST", f"/v1/ranks/{rank}/stop"))

    # -- plumbing ---------------------------------------------------------------------

    def get(self, path: str, query: dict[str, str] | None = None) -> bytes:
        """The body of a successful ``GET path?query``."""
        return self.request("GET", path, query)

    def request(self, method: str, path: str, query: dict[str, str] | None = None) -> bytes:
        """Send one request; the body of a 2xx answer (else :class:`ControlError`). The
        whole exchange (connecting, sending, the answer) takes at most ``timeout``
        seconds."""
        target = path + ("?" + urllib.parse.urlencode(query) if query else "")
        deadline = time.monotonic() + self.timeout
        with self._connect() as sock:
            conn = h11.Connection(h11.CLIENT)
            request = h11.Request(
                method=method,
                target=target,
                headers=[("Host", "localhost"), ("Connection", "close"), ("Content-Length", "0")],
            )
            data = (conn.send(request) or b"") + (conn.send(h11.EndOfMessage()) or b"")
            try:
                _until(sock, deadline)
                sock.sendall(data)
            except OSError as exc:  # closed at once (busy, or its descriptors kept), slow
                raise ControlError(f"{method} {path}: {self._broke(exc)}") from exc
            status, body = self._receive(conn, sock, deadline)
        if not 200 <= status < 300:
            try:
                message = json.loads(body).get("error", "")
            except (ValueError, AttributeError):
                message = body[:200].decode("utf-8", "replace")
            raise ControlError(f"{method} {path} failed with HTTP {status}: {message}")
        return body

    def _broke(self, exc: OSError) -> str:
        if isinstance(exc, TimeoutError):
            return (
                f"no answer from the control socket {str(self.path)!r} within "
                f"{self.timeout:g} s (the server is busy or stalled); try again or raise "
                "the timeout"
            )
        return (
            f"the control socket {str(self.path)!r} closed the connection ({exc}); the "
            "server may be at its connection cap or short of file descriptors: try again"
        )

    def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(os.fspath(self.path))
        except OSError as exc:
            sock.close()
            if exc.errno in (errno.ENOENT, errno.ECONNREFUSED, errno.ENOTDIR):
                raise ServerUnavailableError(
                    f"nothing serves the control socket {str(self.path)!r} "
                    f"({'missing' if exc.errno != errno.ECONNREFUSED else 'stale'}); "
                    "is the server running?"
                ) from None
            raise ControlError(f"cannot connect to {str(self.path)!r}: {exc}") from exc
        return sock

    def _receive(
        self, conn: h11.Connection, sock: socket.socket, deadline: float
    ) -> tuple[int, bytes]:
        status = 0
        body = bytearray()
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    _until(sock, deadline)
                    conn.receive_data(sock.recv(65536))
                elif isinstance(event, h11.Response):
                    status = event.status_code
                elif isinstance(event, h11.Data):
                    body += event.data
                    if len(body) > _MAX_RESPONSE:
                        raise ControlError("the control server's answer is too large")
                elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                    break
        except OSError as exc:
            raise ControlError(
                f"the control server's answer broke off: {self._broke(exc)}"
            ) from exc
        except h11.RemoteProtocolError as exc:
            raise ControlError(f"the control server's answer broke off: {exc}") from exc
        if status == 0:
            raise ControlError(
                f"the control server's answer broke off: {self._broke(ConnectionResetError())}"
            )
        return status, bytes(body)

    @staticmethod
    def _json(body: bytes) -> dict[str, object]:
        answer = json.loads(body)
        if not isinstance(answer, dict):
            raise ControlError(f"unexpected answer from the control server: {answer!r}")
        return answer

    @staticmethod
    def _decode(body: bytes, kind: type[_T]) -> _T:
        try:
            return msgspec.json.decode(body, type=kind)
        except msgspec.ValidationError as exc:
            raise ControlError(f"unexpected answer from the control server: {exc}") from exc

    def __repr__(self) -> str:
        return f"<ControlClient {str(self.path)!r}>"
