"""What the control socket serves: typed, JSON-ready snapshots of a running server.

The records are ``msgspec`` structs, so the same types encode the server's answer and
decode it in a client (unknown keys are ignored, so an older client reads a newer
server). They are meant to be reused by anything that publishes a server's state
elsewhere (a node record in a cluster store, say).

Times on the wire are wall-clock epoch seconds or durations, never a loop's clock: a
timer's ``deadline`` is its monotonic deadline moved to the wall clock at the snapshot.

They are built from a server's own read-only view, :class:`~aiotimer.server.ServerSnapshot`
(:meth:`~aiotimer.server.TimerServer.snapshot`, taken in the server's loop, bounded: at
most ``limit`` timers, workers and scope sites, with exact counts beside them), by
:func:`status_snapshot`, which only converts: times to the wall clock, records to structs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

import msgspec

from aiotimer.core._learned import LearnedSummary
from aiotimer.core._stats import ScopeStats
from aiotimer.core._timer import Timer
from aiotimer.events import Event, ServerCounters, WorkerInfo, WorkerReaped
from aiotimer.server._view import (
    DEFAULT_LIMIT,
    SCOPES_PER_WORKER,
    WORKER_STATES,
    EventHistory,
    ServerSnapshot,
)
from aiotimer.wire import Request

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

#: The version of the control API; it is the ``/v1/`` of every path.
API_VERSION: Final[int] = 1
#: The largest ``limit`` a request may ask for.
MAX_LIMIT: Final[int] = 10_000


class TimerInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One live timer: worker ``pid``, ``scope_id``, when it expires and the server acts
    (``deadline``, epoch seconds; ``seconds_left`` from the snapshot, negative if overdue)
    and its ``signal`` (``<= 0``: report only).

    An ``async with`` block has two deadlines: ``kill_after > 0`` seconds before
    ``deadline`` (the reap) is the block's own (``block_deadline``, epoch seconds;
    ``block_seconds_left``, negative once passed), when the worker cancels its task
    (``TimeoutError``). Both are ``None`` for a block of one tier. ``passed`` says which
    deadline has passed: ``"none"``, ``"block"`` (its task was cancelled, the block has
    not ended yet: it is reaped at ``deadline`` unless it ends first) or ``"reap"``.

    ``request`` is the wire request that set the timer, every key as the worker sent it
    (the journal's, after a restart; ``None`` for a timer made without one): a key the
    wire grows is listed here with no change to this record.
    """

    pid: int
    scope_id: str
    deadline: float
    seconds_left: float
    signal: int
    kill_after: float = 0.0
    block_deadline: float | None = None
    block_seconds_left: float | None = None
    passed: str = "none"
    request: Request | None = None


class IncidentInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One recent reap or refusal (``aiotimer status`` lists them as what happened):
    event number ``seq`` and ``kind`` (``timer_expired``, ``worker_reaped``,
    ``signal_refused``, ``request_rejected`` ...) at ``time`` (epoch seconds), the
    worker's ``pid`` (and ``rank`` under a supervisor), the block (``scope_id``), the
    task that held the worker's loop when a reap's stack dump named it (``task``), how
    late the server acted (``late``, seconds past the reap deadline; ``kill_after``
    seconds more past the block's own deadline) and ``what`` happened, in one line.
    """

    seq: int
    time: float
    kind: str
    what: str
    pid: int | None = None
    rank: int | None = None
    scope_id: str | None = None
    task: str | None = None
    late: float | None = None
    kill_after: float | None = None


class ServerInfo(msgspec.Struct, frozen=True, kw_only=True):
    """The server itself.

    ``state`` is its lifecycle state; ``started_at`` epoch seconds and ``uptime``
    seconds of the current run; ``sources`` where requests arrive; ``policy`` the reap
    policy in words; ``fifo``/``control`` its paths (``None`` when it has none);
    ``next_expiry_in`` seconds to the earliest deadline; ``idle_for`` seconds since it
    last handled input or an expiry; ``max_loop_lag`` the most an expiry was handled
    late (seconds; the host loop was busy elsewhere); ``journal`` the journal's path and
    ``journal_problem`` why it cannot be written now (``None``: it can).
    """

    pid: int
    version: str
    state: str
    started_at: float | None = None
    uptime: float | None = None
    sources: tuple[str, ...] = ()
    policy: str = ""
    fifo: str | None = None
    control: str | None = None
    next_expiry_in: float | None = None
    idle_for: float | None = None
    max_loop_lag: float = 0.0
    journal: str | None = None
    journal_problem: str | None = None


class SupervisorInfo(msgspec.Struct, frozen=True, kw_only=True):
    """The supervisor that runs the workers (``aiotimer run``), if any.

    ``state`` is its lifecycle state, ``command`` the workers' argv, ``restarts`` the
    restarts of all slots, ``restarts_in_window`` those counted against the budget now,
    ``outcome`` how the run ended (``None`` while it runs), ``gave_up`` why it gave up,
    ``hang_report`` the last hang report's summary line.
    """

    run_id: str
    state: str
    command: tuple[str, ...]
    nproc: int
    restarts: int
    restarts_in_window: int
    outcome: str | None = None
    gave_up: str | None = None
    hang_report: str | None = None


class StatusSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """A server's whole state at ``time`` (epoch seconds), as ``GET /v1/state`` serves it.

    ``timers`` are the earliest-expiring live timers, ``workers`` and ``scopes`` (the
    per-site duration statistics, most expirations first) are cut at the request's
    ``limit``; the ``*_total`` fields count them all. ``counters`` are the run's
    :class:`~aiotimer.server.ServerCounters` by name. ``recent`` are the last reaps and
    refusals, oldest first (at most :data:`~aiotimer.server.RECENT_INCIDENTS`).
    ``learned`` are the learned timeouts' scopes (``expires(after=learned(...))``): the
    samples, the value in force and ``initial`` of each, most samples first.
    """

    api: int = API_VERSION
    time: float
    server: ServerInfo
    workers: tuple[WorkerInfo, ...] = ()
    workers_total: int = 0
    timers: tuple[TimerInfo, ...] = ()
    timers_total: int = 0
    counters: dict[str, int] = {}
    scopes: tuple[ScopeStats, ...] = ()
    scopes_total: int = 0
    supervisor: SupervisorInfo | None = None
    recent: tuple[IncidentInfo, ...] = ()
    learned: tuple[LearnedSummary, ...] = ()

    @property
    def truncated(self) -> bool:
        """Whether any list was cut at the request's limit."""
        return (
            len(self.timers) < self.timers_total
            or len(self.workers) < self.workers_total
            or len(self.scopes) < self.scopes_total
        )


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
    info = ServerInfo(
        pid=snap.pid,
        version=snap.version,
        state=snap.state.value,
        started_at=snap.started_at,
        uptime=snap.uptime,
        sources=snap.sources,
        policy=snap.policy,
        fifo=snap.fifo,
        control=control,
        next_expiry_in=snap.next_expiry_in,
        idle_for=snap.idle_for,
        max_loop_lag=snap.loop_lag.max,
        journal=snap.journal,
        journal_problem=snap.journal_problem,
    )
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
