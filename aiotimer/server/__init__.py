"""The timer server: :class:`TimerServer`, :class:`TimerServerThread` for synchronous
programs, and the records of its read-only view (:class:`ServerSnapshot`, what
:meth:`TimerServer.snapshot` returns; :class:`ServerState`, what
:meth:`TimerServer.get_state` returns), its :class:`ServerCounters` and the
:class:`LifecycleState` it is in.
"""

from __future__ import annotations

from aiotimer._faces import face_getattr
from aiotimer.server._server import (
    LifecycleState,
    ReapRetry,
    ServerCounters,
    ServerState,
    TimerServer,
)
from aiotimer.server._thread import (
    LoopName,
    TimerServerThread,
    loop_factory,
)
from aiotimer.server._view import EventHistory, ServerSnapshot

__all__ = [
    "EventHistory",
    "LifecycleState",
    "LoopName",
    "ReapRetry",
    "ServerCounters",
    "ServerSnapshot",
    "ServerState",
    "TimerServer",
    "TimerServerThread",
    "loop_factory",
]

__getattr__, __dir__ = face_getattr("aiotimer.server", globals())
