"""What the control socket serves: typed, JSON-ready snapshots of a running server.

The records are ``msgspec`` structs, so the same types encode the server's answer and
decode it in a client (unknown keys are ignored, so an older client reads a newer
server). They are meant to be reused by anything that publishes a server's state
elsewhere (a node record in a cluster store, say).

Times on the wire are wall-clock epoch seconds or durations, never a loop's clock: a
timer's ``deadline`` is its monotonic deadline moved to the wall clock at the snapshot.

The records are defined beside the server's view (:mod:`aiotimer.server._document`) and
re-exported here. The server's part, :class:`ServerInfo`, is built once per snapshot by
the server's view (:meth:`~aiotimer.server.TimerServer.snapshot` returns a
:class:`~aiotimer.server.ServerSnapshot`, taken in the server's loop, bounded: at most
``limit`` timers, workers and scope sites, with exact counts beside them, whose
``server`` it is) and served as it is; :func:`status_snapshot` adds only the control
plane's own ``control`` path, and converts what the document shows otherwise than the
view: timers' deadlines to the wall clock, events to incidents, counters to names.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

import msgspec

from aiotimer.core import Timer
from aiotimer.events import Event, ServerCounters, WorkerInfo, WorkerReaped
from aiotimer.server import (
    API_VERSION,
    DEFAULT_LIMIT,
    SCOPES_PER_WORKER,
    WORKER_STATES,
    EventHistory,
    IncidentInfo,
    ServerInfo,
    ServerSnapshot,
    StatusSnapshot,
    SupervisorInfo,
    TimerInfo,
)

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
    """``snap`` as ``GET /v1/state`` serves it; ``control`` is the control socket's path
    (the control plane's own, shown as ``server.control``). O(len of snap's lists)."""
    wall, mono = snap.time, snap.monotonic
    info = snap.server if control is None else msgspec.structs.replace(snap.server, control=control)
    return StatusSnapshot(
        time=wall,
        server=info,
        workers=snap.workers,
        workers_total=snap.workers_total,
        timers=tuple(_timer_info(t, wall, mono) for t in snap.timers),
        timers_total=snap.timers_total,
        counters=counters_by_name(snap.counters),
        scopes=snap.scopes,
        scopes_total=snap.scopes_total,
        recent=tuple(incident_info(n, e) for n, e in snap.incidents),
        learned=snap.learned,
    )


def _timer_info(t: Timer, wall: float, mono: float) -> TimerInfo:
    left = t.deadline - mono
    block_left = None if t.kill_after <= 0 else left - t.kill_after  # two tiers only
    passed = (
        "reap" if left < 0 else "block" if block_left is not None and block_left < 0 else "none"
    )
    return TimerInfo(
        pid=t.pid,
        scope_id=t.scope_id,
        deadline=wall + left,
        seconds_left=left,
        signal=t.signal,
        kill_after=t.kill_after,
        block_deadline=None if block_left is None else wall + block_left,
        block_seconds_left=block_left,
        passed=passed,
        request=t.request,
    )


def incident_info(seq: int, event: Event) -> IncidentInfo:
    """Event number ``seq``, an incident (a reap or a refusal), as ``recent`` lists it."""
    scope = getattr(event, "scope_id", None)
    task = None
    if isinstance(event, WorkerReaped):
        scope = event.scopes[0] if event.scopes else None
        held = event.culprit
        if held is not None:
            task, scope = held[0], held[1] or scope
    return IncidentInfo(
        seq=seq,
        time=event.time,
        kind=event.kind,
        what=event.describe(),
        pid=getattr(event, "pid", None),
        scope_id=scope,
        task=task,
        late=getattr(event, "late", None),
        kill_after=getattr(event, "kill_after", None) or None,
    )


def counters_by_name(counters: ServerCounters) -> dict[str, int]:
    """``counters`` as ``{name: value}`` (the shape every answer carries them in)."""
    return {f.name: getattr(counters, f.name) for f in dataclasses.fields(counters)}


def event_page(history: EventHistory) -> EventPage:
    """``history`` as ``GET /v1/events`` serves it."""
    return EventPage(
        events=tuple({**e.to_dict(), "seq": n} for n, e in history.events),
        last=history.last,
        missed=history.missed,
    )
