"""torch's request classes and typed errors, and their translation to aiotimer requests."""

from __future__ import annotations

import json
import signal as _signal
from typing import Any, Final

from aiotimer.errors import NotConfiguredError, ServerUnavailableError
from aiotimer.wire import Request, RequestTooLargeError

#: torch's default reap signal.
_SIGKILL: Final[int] = int(_signal.SIGKILL)


# -- errors ------------------------------------------------------------------------------


class TimerNotConfiguredError(NotConfiguredError, RuntimeError):
    """``expires()`` found no client: call :func:`configure` first (or pass ``client=``).

    A ``RuntimeError``, as torch raises in this case.
    """


class TimerServerUnavailableError(ServerUnavailableError, BrokenPipeError):
    """No timer server reads the FIFO (within the client's ``connect_timeout``).

    A ``BrokenPipeError``, as torch's ``FileTimerClient`` raises in this case.
    """


class TimerRequestTooLargeError(RequestTooLargeError, RuntimeError):
    """A request line would exceed ``PIPE_BUF`` bytes (use a shorter ``scope_id``).

    A ``RuntimeError``, as torch raises in this case.
    """


# -- requests ----------------------------------------------------------------------------


class TimerRequest:
    """An acquire (``expiration_time >= 0``, epoch seconds) or a release (negative).

    Same attributes, constructor and equality as torch's ``TimerRequest``; ``worker_id``
    is a pid for every server in this module.
    """

    __slots__ = ("expiration_time", "scope_id", "worker_id")

    def __init__(self, worker_id: Any, scope_id: str, expiration_time: float) -> None:
        self.worker_id = worker_id
        self.scope_id = scope_id
        self.expiration_time = expiration_time

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TimerRequest):
            return (
                self.worker_id == other.worker_id
                and self.scope_id == other.scope_id
                and self.expiration_time == other.expiration_time
            )
        return False

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value (as torch's)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(worker_id={self.worker_id!r}, scope_id={self.scope_id!r}, "
            f"expiration_time={self.expiration_time!r})"
        )


class FileTimerRequest(TimerRequest):
    """A :class:`TimerRequest` with the ``signal`` to reap with (``<= 0``: report only).

    Same constructor, attributes, equality and :meth:`to_json` as torch's
    ``FileTimerRequest``.
    """

    __slots__ = ("signal", "version")

    def __init__(
        self, worker_pid: int, scope_id: str, expiration_time: float, signal: int = 0
    ) -> None:
        super().__init__(worker_id=worker_pid, scope_id=scope_id, expiration_time=expiration_time)
        self.version = 1
        self.signal = signal

    @property
    def worker_pid(self) -> int:
        """The worker's pid (``worker_id``)."""
        pid: int = self.worker_id
        return pid

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FileTimerRequest):
            return (
                super().__eq__(other)
                and self.version == other.version
                and self.signal == other.signal
            )
        return False

    __hash__ = None

    def to_json(self) -> str:
        """The request as torch's ``FileTimerRequest.to_json()`` writes it (same bytes)."""
        return json.dumps(
            {
                "version": self.version,
                "pid": self.worker_pid,
                "scope_id": self.scope_id,
                "expiration_time": self.expiration_time,
                "signal": self.signal,
            }
        )

    def __repr__(self) -> str:
        return (
            f"FileTimerRequest(worker_pid={self.worker_id!r}, scope_id={self.scope_id!r}, "
            f"expiration_time={self.expiration_time!r}, signal={self.signal!r})"
        )


def _to_request(request: TimerRequest) -> Request:
    """``request`` as an aiotimer request (``TimerRequest`` has no signal: SIGKILL)."""
    pid = request.worker_id
    if not isinstance(pid, int) or isinstance(pid, bool):
        raise TypeError(f"worker_id must be a pid (an int), got {pid!r}")
    signal = getattr(request, "signal", _SIGKILL)
    return Request(
        pid=pid,
        scope_id=request.scope_id,
        expiration_time=request.expiration_time,
        signal=int(signal),
    )
