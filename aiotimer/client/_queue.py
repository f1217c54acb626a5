"""The multiprocessing-queue transport (torch's ``LocalTimerClient`` style)."""

from __future__ import annotations

import queue as _queue
import time
from typing import Any, Protocol

from aiotimer.client._transport import (
    DEFAULT_SIGNAL,
    DEFAULT_WRITE_TIMEOUT,
    RETRY_FIRST,
    Sleep,
    Steps,
    client_signal,
    delivered_late,
    drive,
    drive_async,
    next_retry,
)
from aiotimer.errors import ClientBackpressureError
from aiotimer.wire import Request

__all__ = ["QueueClient", "QueueRequest"]


class QueueRequest:
    """torch's ``TimerRequest`` shape (``worker_id``, ``scope_id``, ``expiration_time``)
    plus aiotimer's ``signal`` and ``mono`` attributes, which torch's server ignores.

    A negative ``expiration_time`` is a release.
    """

    __slots__ = ("expiration_time", "mono", "scope_id", "signal", "worker_id")

    def __init__(
        self,
        worker_id: int,
        scope_id: str,
        expiration_time: float,
        signal: int = DEFAULT_SIGNAL,
        mono: float | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.scope_id = scope_id
        self.expiration_time = expiration_time
        self.signal = signal
        self.mono = mono

    def __getstate__(self) -> tuple[int, str, float, int, float | None]:
        return (self.worker_id, self.scope_id, self.expiration_time, self.signal, self.mono)

    def __setstate__(self, state: tuple[int, str, float, int, float | None]) -> None:
        self.worker_id, self.scope_id, self.expiration_time, self.signal, self.mono = state

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, QueueRequest):
            return NotImplemented
        return self.__getstate__() == other.__getstate__()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"QueueRequest(worker_id={self.worker_id}, scope_id={self.scope_id!r}, "
            f"expiration_time={self.expiration_time}, signal={self.signal})"
        )


class PutQueue(Protocol):
    def put(self, obj: Any, block: bool = ..., timeout: float | None = ...) -> None: ...


class QueueClient:
    """Send requests through a ``multiprocessing`` queue (torch's ``LocalTimerClient`` style).

    Each request is a :class:`QueueRequest` — torch's ``TimerRequest`` attributes, so
    torch's ``LocalTimerServer`` accepts it too, plus ``signal`` and ``mono`` for
    aiotimer's queue source. A bounded queue that stays full for ``write_timeout``
    seconds raises :class:`~aiotimer.errors.ClientBackpressureError`.
    """

    def __init__(
        self,
        mp_queue: PutQueue,
        *,
        signal: int = DEFAULT_SIGNAL,
        write_timeout: float = DEFAULT_WRITE_TIMEOUT,
    ) -> None:
        self._queue = mp_queue
        self._signal = client_signal(signal)
        self.write_timeout = float(write_timeout)

    @property
    def signal(self) -> int:
        """The default signal for timers acquired through this client."""
        return self._signal

    def send(self, request: Request) -> None:
        """Put ``request`` on the queue, blocking at most ``write_timeout`` if it is full."""
        drive(self._sending(request))

    async def send_async(self, request: Request) -> None:
        """Put ``request`` on the queue, awaiting (not blocking) while it is full."""
        await drive_async(self._sending(request), shield=request.is_release)

    def _sending(self, request: Request) -> Steps:
        started = time.monotonic()
        retry = RETRY_FIRST
        waited = False
        while True:
            # Waiting for room is not counted against the block (TimerClient).
            now = request if not waited else delivered_late(request, time.monotonic() - started)
            item = QueueRequest(
                now.pid,
                now.scope_id,
                -1 if now.is_release else now.expiration_time,
                now.signal,
                now.mono,
            )
            try:
                self._queue.put(item, block=False)
            except _queue.Full:
                waited = True
                elapsed = time.monotonic() - started
                if elapsed >= self.write_timeout:
                    raise ClientBackpressureError(
                        f"the timer server's queue stayed full for {self.write_timeout:g}s; "
                        "the server is overloaded or stuck"
                    ) from None
                yield Sleep(min(retry, self.write_timeout - elapsed))
                retry = next_retry(retry)
            else:
                return

    def __repr__(self) -> str:
        return f"<QueueClient {self._queue!r}>"
