"""What the control socket serves: typed, JSON-ready snapshots of a running server.

The records are ``msgspec`` structs, so the same types encode the server's answer and
decode it in a client (unknown keys are ignored, so an older client reads a newer
server). They are meant to be reused by anything that publishes a server's state
elsewhere (a node record in a cluster store, say).

Times on the wire are wall-clock epoch seconds or durations, never a loop's clock: a
timer's ``deadline`` is its monotonic deadline moved to the wall clock at the snapshot.

The records are defined beside the server's view (:mod:`aiotimer.server._document`) and
re-exported here. The document is built once per snapshot by the server's view
(:meth:`~aiotimer.server.TimerServer.snapshot` returns a
:class:`~aiotimer.server.ServerSnapshot`, taken in the server's loop, bounded: at most
``limit`` timers, workers and scope sites, with exact counts beside them, whose
``document`` it is) and served as it is: :func:`status_snapshot` adds only the control
plane's own ``control`` path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import msgspec

from aiotimer.events import WorkerInfo
from aiotimer.server import (
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

if TYPE_CHECKING:
    from aiotimer.server import EventHistory, ServerSnapshot

__all__ = [
    "API_VERSION",
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "SCOPES_PER_WORKER",
    "WORKER_STATES",
    "EventPage",
    "IncidentInfo",
    "ServerInfo",
    "StatusSnapshot",
    "SupervisorInfo",
    "TimerInfo",
    "WorkerInfo",
    "counters_by_name",
    "event_page",
    "incident_info",
    "status_snapshot",
]

#: The largest ``limit`` a request may ask for.
MAX_LIMIT: Final[int] = 10_000


class EventPage(msgspec.Struct, frozen=True, kw_only=True):
    """Recent events, as ``GET /v1/events?since=N`` serves them.

    ``events`` are the recorded events numbered above ``N``, oldest first, each as
    :meth:`~aiotimer.events.Event.to_dict` plus its number under ``"seq"``; ``last`` is the
    number of the newest event (ask for ``since=last`` next time); ``missed`` counts the
    events above ``N`` that the server's bounded history no longer holds.
    """

    events: tuple[dict[str, Any], ...] = ()
    last: int = 0
    missed: int = 0


def status_snapshot(snap: ServerSnapshot, *, control: str | None = None) -> StatusSnapshot:
    """``snap`` as ``GET /v1/state`` serves it: its ``document``, as it is; ``control``
    is the control socket's path (the control plane's own, shown as
    ``server.control``). O(1)."""
    doc = snap.document
    if control is None:
        return doc
    return msgspec.structs.replace(doc, server=msgspec.structs.replace(doc.server, control=control))


def event_page(history: EventHistory) -> EventPage:
    """``history`` as ``GET /v1/events`` serves it."""
    return EventPage(
        events=tuple({**e.to_dict(), "seq": n} for n, e in history.events),
        last=history.last,
        missed=history.missed,
    )
