"""torch's clients (``FileTimerClient``, ``LocalTimerClient``) and request queue, on
aiotimer's clients."""

from __future__ import annotations

import math
import queue as _queue
import time
from typing import TYPE_CHECKING, Any, Protocol

from aiotimer.client import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_WRITE_TIMEOUT,
    FifoClient,
    QueueClient,
)
from aiotimer.compat.torch._api import RequestQueue, TimerClient
from aiotimer.compat.torch._requests import (
    _SIGKILL,
    FileTimerRequest,
    TimerRequest,
    TimerRequestTooLargeError,
    TimerServerUnavailableError,
)
from aiotimer.core import current_pid
from aiotimer.errors import ServerUnavailableError
from aiotimer.wire import Request, RequestTooLargeError

if TYPE_CHECKING:
    from aiotimer.client import PutQueue
    from aiotimer.client import TimerClient as _AioTimerClient

# -- clients ------------------------------------------------------------------------------


def _wire(pid: int, scope_id: str, expiration_time: float, signal: int) -> Request:
    """The aiotimer request of torch's ``(pid, scope_id, expiration_time, signal)``: an
    acquire also carries its epoch deadline on the monotonic clock (sent only to
    aiotimer servers)."""
    mono = None
    if expiration_time >= 0 and math.isfinite(expiration_time):
        mono = time.monotonic() + (expiration_time - time.time())
    return Request(
        pid=pid, scope_id=scope_id, expiration_time=expiration_time, signal=int(signal), mono=mono
    )


def _send(client: _AioTimerClient, request: Request) -> None:
    """Send through an aiotimer client, raising torch-compatible typed errors."""
    try:
        client.send(request)
    except ServerUnavailableError as exc:
        raise TimerServerUnavailableError(str(exc)) from exc
    except RequestTooLargeError as exc:
        raise TimerRequestTooLargeError(str(exc)) from exc


class FileTimerClient(TimerClient):
    """Client of a FIFO timer server: aiotimer's, or torch's ``FileTimerServer``.

    torch's signature. Built on :class:`aiotimer.client.FifoClient`: against an aiotimer
    server it keeps one descriptor open and adds the monotonic deadline; against torch's
    server it opens, writes and closes per request, with torch's exact bytes.

    Args:
        file_path: the server's FIFO.
        signal: the signal to reap with (``<= 0``: report only). Can be changed later
            through the ``signal`` attribute, as in torch.
        connect_timeout: seconds to keep retrying while no server reads the FIFO (torch
            retries for about one second), then :class:`TimerServerUnavailableError`.
        write_timeout: seconds to wait for room in a full pipe, then
            :class:`~aiotimer.errors.ClientBackpressureError`.
    """

    def __init__(
        self,
        file_path: str,
        signal: int = _SIGKILL,
        *,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        write_timeout: float = DEFAULT_WRITE_TIMEOUT,
    ) -> None:
        self._file_path = file_path
        self.signal = signal
        self._client = FifoClient(
            file_path,
            signal=signal,
            connect_timeout=connect_timeout,
            write_timeout=write_timeout,
        )

    @property
    def client(self) -> FifoClient:
        """The aiotimer client underneath (usable with ``aiotimer.expires(client=...)``)."""
        return self._client

    def acquire(self, scope_id: str, expiration_time: float) -> None:
        """Set this process's timer ``scope_id`` to expire at ``expiration_time`` (epoch)."""
        self._send_request(FileTimerRequest(current_pid(), scope_id, expiration_time, self.signal))

    def release(self, scope_id: str) -> None:
        """Release this process's timer ``scope_id``."""
        self._send_request(FileTimerRequest(current_pid(), scope_id, -1, 0))

    def _send_request(self, request: FileTimerRequest) -> None:
        """Send ``request`` as it is (any pid, any signal): what :meth:`acquire` and
        :meth:`release` call, as in torch (a test may patch it, or send its own).

        Raises:
            TimerServerUnavailableError: no server reads the FIFO.
            TimerRequestTooLargeError: the request's line exceeds ``PIPE_BUF`` bytes.
        """
        _send(
            self._client,
            _wire(request.worker_pid, request.scope_id, request.expiration_time, request.signal),
        )

    def close(self) -> None:
        """Close the persistent descriptor, if any (reopened on next use)."""
        self._client.close()

    def __repr__(self) -> str:
        return f"<FileTimerClient {self._file_path!r} signal={self.signal}>"


class LocalTimerClient(TimerClient):
    """Client of a queue timer server: :class:`LocalTimerServer` or torch's.

    torch's signature. Built on :class:`aiotimer.client.QueueClient`: each request has
    torch's ``TimerRequest`` attributes (so torch's ``LocalTimerServer`` takes it) plus
    ``signal`` (SIGKILL) and the monotonic deadline for aiotimer's queue source.
    """

    def __init__(self, mp_queue: PutQueue, *, write_timeout: float = DEFAULT_WRITE_TIMEOUT) -> None:
        self._mp_queue = mp_queue
        self._client = QueueClient(mp_queue, signal=_SIGKILL, write_timeout=write_timeout)

    @property
    def client(self) -> QueueClient:
        """The aiotimer client underneath (usable with ``aiotimer.expires(client=...)``)."""
        return self._client

    def acquire(self, scope_id: str, expiration_time: float) -> None:
        """Set this process's timer ``scope_id`` to expire at ``expiration_time`` (epoch)."""
        _send(self._client, _wire(current_pid(), scope_id, expiration_time, _SIGKILL))

    def release(self, scope_id: str) -> None:
        """Release this process's timer ``scope_id``."""
        _send(self._client, _wire(current_pid(), scope_id, -1, 0))

    def __repr__(self) -> str:
        return f"<LocalTimerClient {self._mp_queue!r}>"


class _GetQueue(Protocol):
    def qsize(self) -> int: ...
    def get(self, block: bool = ..., timeout: float | None = ...) -> Any: ...


class MultiprocessingRequestQueue(RequestQueue):
    """A :class:`RequestQueue` over a ``multiprocessing.Queue`` (torch's class)."""

    def __init__(self, mp_queue: _GetQueue) -> None:
        self._mp_queue = mp_queue

    def size(self) -> int:
        """The queue's approximate size."""
        return self._mp_queue.qsize()

    def get(self, size: int, timeout: float) -> list[TimerRequest]:
        """Up to ``size`` requests, waiting at most ``timeout`` seconds in all."""
        requests: list[TimerRequest] = []
        end = time.monotonic() + timeout
        for _ in range(size):
            wait = end - time.monotonic()
            try:
                requests.append(self._mp_queue.get(block=True, timeout=max(0.0, wait)))
            except _queue.Empty:
                break
            if end - time.monotonic() <= 0:
                break
        return requests
