"""What the control socket serves: typed, JSON-ready snapshots of a running server.

The records are ``msgspec`` structs, so the same types encode the server's answer and
decode it in a client (unknown keys are ignored, so an older client reads a newer
server). They are meant to be reused by anything that publishes a server's state
elsewhere (a node record in a cluster store, say).

Times on the wire are wall-clock epoch seconds or durations, never a loop's clock: a
timer's ``deadline`` is its monotonic deadline moved to the wall clock at the snapshot.

A snapshot is taken in the server's event loop and must not stall it: :func:`collect`
reads at most ``limit`` timers (the earliest deadlines), ``limit`` workers (each with up
to :data:`SCOPES_PER_WORKER` scope ids) and ``limit`` scope sites, and reports the full
counts beside them (``timers_total`` ...), so a truncated list says so.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any, Final

import msgspec

from aiotimer.core._stats import SiteSummary
from aiotimer.reapers._policy import ReapPolicy
from aiotimer.reapers._steps import format_plan

if TYPE_CHECKING:
    from aiotimer._edges.clock import Clock
    from aiotimer.server._engine import Counters, Engine

__all__ = [
    "API_VERSION",
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "SCOPES_PER_WORKER",
    "WORKER_STATES",
    "EventPage",
    "ServerInfo",
    "StatusSnapshot",
    "SupervisorInfo",
    "TimerInfo",
    "WorkerInfo",
    "collect",
    "describe_policy",
    "worker_pids",
    "worker_states",
]

#: The version of the control API; it is the ``/v1/`` of every path.
API_VERSION: Final[int] = 1
#: Timers, workers and scope sites listed by default (the totals are always exact).
DEFAULT_LIMIT: Final[int] = 50
#: The largest ``limit`` a request may ask for.
MAX_LIMIT: Final[int] = 10_000
#: The states of a server's workers (a supervisor has its own).
WORKER_STATES: Final[tuple[str, ...]] = ("timed", "idle", "reaping")
#: Scope ids listed per worker (its ``timers`` count is exact).
SCOPES_PER_WORKER: Final[int] = 8


class TimerInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One live timer: worker ``pid``, ``scope_id``, when it expires (``deadline``, epoch
    seconds; ``seconds_left`` from the snapshot, negative if overdue) and its ``signal``
    (``<= 0``: report only)."""

    pid: int
    scope_id: str
    deadline: float
    seconds_left: float
    signal: int


class WorkerInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One worker the server knows: its ``pid``, ``state``, how many live ``timers`` it
    has and (up to :data:`SCOPES_PER_WORKER` of) their ``scopes``.

    ``state`` is ``"timed"`` (it has live timers), ``"idle"`` (watched, none live) or
    ``"reaping"`` (an expired timer's reap is in progress). Under a supervisor, ``state``
    is the supervisor's worker state (``"healthy"``, ``"backoff"``, ...), ``rank`` its
    slot and ``restarts`` how often that slot was restarted (``None`` without one), and
    ``pid`` is ``None`` while the slot has no process (between attempts).
    """

    pid: int | None
    state: str
    timers: int
    scopes: tuple[str, ...] = ()
    restarts: int | None = None
    rank: int | None = None


class ServerInfo(msgspec.Struct, frozen=True, kw_only=True):
    """The server itself.

    ``state`` is its lifecycle state; ``started_at`` epoch seconds and ``uptime``
    seconds of the current run; ``sources`` where requests arrive; ``policy`` the reap
    policy in words; ``fifo``/``control`` its paths (``None`` when it has none);
    ``next_expiry_in`` seconds to the earliest deadline; ``idle_for`` seconds since it
    last handled input or an expiry; ``max_loop_lag`` the most an expiry was handled
    late (seconds; the host loop was busy elsewhere).
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


class SupervisorInfo(msgspec.Struct, frozen=True, kw_only=True):
    """The supervisor that runs the workers (``aiotimer run``), if any.

    ``state`` is its lifecycle state, ``command`` the workers' argv, ``restarts`` the
    restarts of all slots, ``restarts_in_window`` those counted against the budget now,
    ``outcome`` how the run ended (``None`` while it runs), ``gave_up`` why it gave up.
    """

    run_id: str
    state: str
    command: tuple[str, ...]
    nproc: int
    restarts: int
    restarts_in_window: int
    outcome: str | None = None
    gave_up: str | None = None


class StatusSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """A server's whole state at ``time`` (epoch seconds), as ``GET /v1/state`` serves it.

    ``timers`` are the earliest-expiring live timers, ``workers`` and ``scopes`` (the
    per-site duration statistics, most expirations first) are cut at the request's
    ``limit``; the ``*_total`` fields count them all. ``counters`` are the run's
    :class:`~aiotimer.server.Counters` by name.
    """

    api: int = API_VERSION
    time: float
    server: ServerInfo
    workers: tuple[WorkerInfo, ...] = ()
    workers_total: int = 0
    timers: tuple[TimerInfo, ...] = ()
    timers_total: int = 0
    counters: dict[str, int] = {}
    scopes: tuple[SiteSummary, ...] = ()
    scopes_total: int = 0
    supervisor: SupervisorInfo | None = None

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


def collect(
    engine: Engine | None,
    *,
    server: ServerInfo,
    counters: Counters,
    clock: Clock,
    limit: int = DEFAULT_LIMIT,
) -> StatusSnapshot:
    """A snapshot of ``engine`` (``None``: the server is not running), in its loop.

    Costs O(limit log limit + workers): the worker list is walked to count it, and the
    rest is bounded by ``limit`` (see the module docs).
    """
    wall, mono = clock.time(), clock.monotonic()
    counter_dict = {f.name: getattr(counters, f.name) for f in dataclasses.fields(counters)}
    if engine is None:
        return StatusSnapshot(time=wall, server=server, counters=counter_dict)
    table = engine.table
    timers = tuple(
        TimerInfo(
            pid=t.pid,
            scope_id=t.scope_id,
            deadline=wall + (t.deadline - mono),
            seconds_left=t.deadline - mono,
            signal=t.signal,
        )
        for t in table.earliest(limit)
    )
    pids = worker_pids(engine)
    workers = []
    for pid in pids[:limit]:
        scopes, n = table.worker_scopes(pid, SCOPES_PER_WORKER)
        state = _state(engine, pid, n)
        workers.append(WorkerInfo(pid=pid, state=state, timers=n, scopes=tuple(scopes)))
    sites = engine.stats.summaries(limit)
    return StatusSnapshot(
        time=wall,
        server=server,
        workers=tuple(workers),
        workers_total=len(pids),
        timers=timers,
        timers_total=len(table),
        counters=counter_dict,
        scopes=tuple(sites),
        scopes_total=len(engine.stats),
    )


def worker_pids(engine: Engine) -> list[int]:
    """Every worker ``engine`` knows: the watched ones, then pids that only have timers
    (the server's own process, which is never watched). O(workers)."""
    watched = engine.workers()
    # The engine keeps timers only of watched workers and of the server's own process.
    own = os.getpid()
    own_timed = own in engine.table.workers() and own not in watched
    return [*watched, own] if own_timed else list(watched)


def worker_states(engine: Engine) -> dict[str, int]:
    """How many workers are in each state (``timed``, ``idle``, ``reaping``). O(workers)."""
    pids = worker_pids(engine)
    with_timers = engine.table.workers()
    reaping = [pid for pid in pids if engine.is_reaping(pid)]
    timed = len(with_timers) - sum(pid in with_timers for pid in reaping)
    return {"timed": timed, "idle": len(pids) - timed - len(reaping), "reaping": len(reaping)}


def _state(engine: Engine, pid: int, timers: int) -> str:
    return "reaping" if engine.is_reaping(pid) else "timed" if timers else "idle"


def describe_policy(policy: ReapPolicy) -> str:
    """The reap policy in words."""
    if policy.default is None:
        what = "each timer's own signal (torch semantics)"
    else:
        what = format_plan(policy.default.steps())
    return f"report only (shadow mode); would do: {what}" if policy.shadow else what
