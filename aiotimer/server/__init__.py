"""The timer server: :class:`TimerServer`, :class:`TimerServerThread` for synchronous
programs, and the records of its read-only view (:class:`ServerSnapshot`, what
:meth:`TimerServer.snapshot` returns).
"""

from __future__ import annotations

from aiotimer.server._server import (
    Counters,
    Lifecycle,
    ReapRetry,
    ServerState,
    TimerServer,
)
from aiotimer.server._thread import (
    LoopName,
    TimerServerThread,
    loop_factory,
)
from aiotimer.server._view import EventHistory, ServerSnapshot, WorkerView

__all__ = [
    "Counters",
    "EventHistory",
    "Lifecycle",
    "LoopName",
    "ReapRetry",
    "ServerSnapshot",
    "ServerState",
    "TimerServer",
    "TimerServerThread",
    "WorkerView",
    "loop_factory",
]
