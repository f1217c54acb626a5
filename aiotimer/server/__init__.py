"""The timer server: :class:`TimerServer`, and :class:`TimerServerThread` for
synchronous programs.
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

__all__ = [
    "Counters",
    "Lifecycle",
    "LoopName",
    "ReapRetry",
    "ServerState",
    "TimerServer",
    "TimerServerThread",
    "loop_factory",
]
