"""The timer server: :class:`TimerServer`, :class:`TimerServerThread` for synchronous
programs, and the records of its read-only view (:class:`ServerSnapshot`, what
:meth:`TimerServer.snapshot` returns; :class:`ServerState`, what
:meth:`TimerServer.get_state` returns), its :class:`ServerCounters` and the
:class:`LifecycleState` it is in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from aiotimer._faces import face_getattr

if TYPE_CHECKING:
    from aiotimer.server._document import (
        API_VERSION,
        DEFAULT_LIMIT,
        SCOPES_PER_WORKER,
        WORKER_STATES,
        IncidentInfo,
        ServerInfo,
        StatusSnapshot,
        SupervisorInfo,
        TimerInfo,
        counters_by_name,
        incident_info,
    )
    from aiotimer.server._eventbus import INCIDENT_KINDS, RECENT_INCIDENTS
    from aiotimer.server._ingest import MAX_TIMERS, MAX_TIMERS_PER_WORKER
    from aiotimer.server._server import (
        LifecycleState,
        ReapRetry,
        ServerCounters,
        ServerState,
        TimerServer,
    )
    from aiotimer.server._thread import LoopName, TimerServerThread, loop_factory
    from aiotimer.server._view import EventHistory, ServerSnapshot

__all__ = [
    "API_VERSION",
    "DEFAULT_LIMIT",
    "INCIDENT_KINDS",
    "MAX_TIMERS",
    "MAX_TIMERS_PER_WORKER",
    "RECENT_INCIDENTS",
    "SCOPES_PER_WORKER",
    "WORKER_STATES",
    "EventHistory",
    "IncidentInfo",
    "LifecycleState",
    "LoopName",
    "ReapRetry",
    "ServerCounters",
    "ServerInfo",
    "ServerSnapshot",
    "ServerState",
    "StatusSnapshot",
    "SupervisorInfo",
    "TimerInfo",
    "TimerServer",
    "TimerServerThread",
    "counters_by_name",
    "incident_info",
    "loop_factory",
]

#: Every name loads on first use, from the module that defines it: a caller that needs
#: only the document records (``aiotimer status``) never imports the engine.
_LAZY: Final[dict[str, str]] = {
    "API_VERSION": "aiotimer.server._document",
    "DEFAULT_LIMIT": "aiotimer.server._document",
    "EventHistory": "aiotimer.server._view",
    "INCIDENT_KINDS": "aiotimer.server._eventbus",
    "IncidentInfo": "aiotimer.server._document",
    "LifecycleState": "aiotimer._edges.lifecycle",
    "LoopName": "aiotimer.server._thread",
    "MAX_TIMERS": "aiotimer.server._ingest",
    "MAX_TIMERS_PER_WORKER": "aiotimer.server._ingest",
    "RECENT_INCIDENTS": "aiotimer.server._eventbus",
    "ReapRetry": "aiotimer.reapers",
    "SCOPES_PER_WORKER": "aiotimer.server._document",
    "ServerCounters": "aiotimer.events",
    "ServerInfo": "aiotimer.server._document",
    "ServerSnapshot": "aiotimer.server._view",
    "ServerState": "aiotimer.server._view",
    "StatusSnapshot": "aiotimer.server._document",
    "SupervisorInfo": "aiotimer.server._document",
    "TimerInfo": "aiotimer.server._document",
    "TimerServer": "aiotimer.server._server",
    "TimerServerThread": "aiotimer.server._thread",
    "WORKER_STATES": "aiotimer.server._document",
    "counters_by_name": "aiotimer.server._document",
    "incident_info": "aiotimer.server._document",
    "loop_factory": "aiotimer.server._thread",
}

__getattr__, __dir__ = face_getattr("aiotimer.server", globals(), lazy=_LAZY)
