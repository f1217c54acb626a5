"""The in-process transport: a server embedded in this very process."""

from __future__ import annotations

from typing import Protocol

from aiotimer.client._transport import DEFAULT_SIGNAL, client_signal
from aiotimer.wire import Request

__all__ = ["InProcessClient", "RequestSubmitter"]


class RequestSubmitter(Protocol):
    """A server embedded in this process: ``submit`` is thread-safe and never blocks."""

    def submit(self, request: Request) -> None:
        """Apply ``request`` (from any thread)."""
        ...


class InProcessClient:
    """Hand requests straight to a server running in this process (no pipe, no encoding).

    Note that a server never signals its own process: timers of the server's own pid
    are reported when they expire, not reaped.
    """

    def __init__(self, server: RequestSubmitter, *, signal: int = DEFAULT_SIGNAL) -> None:
        self._server = server
        self._signal = client_signal(signal)

    @property
    def signal(self) -> int:
        """The default signal for timers acquired through this client."""
        return self._signal

    def send(self, request: Request) -> None:
        """Submit ``request`` to the embedded server."""
        self._server.submit(request)

    async def send_async(self, request: Request) -> None:
        """Submit ``request`` to the embedded server (never waits)."""
        self._server.submit(request)

    def __repr__(self) -> str:
        return f"<InProcessClient {self._server!r}>"
