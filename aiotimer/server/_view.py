"""A timer server's read-only view: one bounded snapshot behind every read.

:meth:`~aiotimer.server.TimerServer.snapshot` returns a :class:`ServerSnapshot`: plain
frozen records, copied in the server's loop, that nothing changes afterwards. Its
``document`` *is* the ``GET /v1/state`` document
(:class:`~aiotimer.server._document.StatusSnapshot`), built here once from the engine's
own records (the server's part from the fixed :func:`about` record) and served as it
is; beside it are what only a caller in this process reads (counters as a record, the
histograms, the monotonic clock's readings). Every other read derives from the snapshot:
:meth:`~aiotimer.server.TimerServer.get_state` (a :class:`ServerState`, a view over one
snapshot with nothing cut), ``scope_stats()``, the server's ``repr``, the control
plane's ``/v1/state`` and ``/metrics`` (:mod:`aiotimer.control`) and a cluster node's
record.

Cost: a snapshot lists at most ``limit`` timers (the earliest deadlines, a best-first walk
of the heap), ``limit`` workers (each with up to :data:`SCOPES_PER_WORKER` scope ids) and
``sites`` scope sites, and counts every list exactly beside it (``timers_total`` ...), so
it costs O(limit log limit + workers): the workers' pids are copied to count them (a
list copy, ~10 us per 1,000). Counting every worker by state (``by_state``, for metrics)
asks each one, a few times more. Each listed timer is converted to the document's row
(its deadline moved to the wall clock, ~0.4 us). ``limit=None`` lists everything
(O(timers log timers)), for callers that asked for that (``get_state()``).

This is the one module that reads the engine's state (``table``, ``stats``, ``counts``,
``workers()``, ``is_reaping()``, ``reap_latency``, ``loop_lag``, ``last_progress``), so
one file adapts if those move.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from aiotimer._edges.lifecycle import LifecycleState
from aiotimer.core import LatencyHistogram, ScopeStats, Timer
from aiotimer.events import Event, ServerCounters, ServerStopped, WorkerInfo
from aiotimer.reapers import ReapPolicy, format_plan
from aiotimer.server._document import (
    DEFAULT_LIMIT,
    SCOPES_PER_WORKER,
    WORKER_STATES,
    ServerInfo,
    StatusSnapshot,
    TimerInfo,
    counters_by_name,
    incident_info,
    timer_info,
)
from aiotimer.server._learning import LEARNED_LISTED

if TYPE_CHECKING:
    from aiotimer._edges.clock import Clock
    from aiotimer.server._engine import Engine
    from aiotimer.server._journal import Journal, JournalKept

__all__ = [
    "DEFAULT_LIMIT",
    "SCOPES_PER_WORKER",
    "WORKER_STATES",
    "EventHistory",
    "ServerSnapshot",
    "ServerState",
    "Taken",
    "about",
    "describe_policy",
    "stopped_event",
    "take",
    "watches",
]


@dataclass(frozen=True, slots=True)
class ServerSnapshot:
    """A server at one moment, copied in its loop (see the module docs).

    ``document`` is the ``GET /v1/state`` document
    (:class:`~aiotimer.server._document.StatusSnapshot`), built here once and served as
    it is: the server's own part (``document.server``: pid, version, state, start,
    sources, reap policy in words, FIFO, next expiry, idle time, loop lag, journal),
    ``workers`` (watched workers, then the server's own process if it has timers),
    ``timers`` (earliest deadline first, deadlines on the wall clock) and ``scopes``
    (duration statistics per scope site, most expirations first), cut at the
    snapshot's limits with exact ``*_total`` counts, the ``counters`` by name, the
    ``recent`` reaps and refusals (oldest first) and the ``learned`` timeouts' scopes
    (the :data:`~aiotimer.server._learning.LEARNED_LISTED` with most samples).

    Beside it, what only a caller in this process reads: ``monotonic`` (the server
    clock's monotonic reading at ``document.time``; ``next_deadline`` and
    ``last_progress`` are on that clock), ``counters`` as their record (the current, or
    last, run's), ``worker_states`` (every worker counted by state, if the snapshot was
    asked to; else ``None``), copies of the run's ``reap_latency`` (deadline to first
    signal) and ``loop_lag`` (how late expiries were handled) histograms, and
    ``undelivered`` (events dropped for slow subscribers). A server that is not running
    lists no workers or timers, and keeps its last run's counters, statistics and
    histograms.
    """

    document: StatusSnapshot
    monotonic: float
    counters: ServerCounters
    next_deadline: float | None = None
    last_progress: float | None = None
    worker_states: Mapping[str, int] | None = None
    reap_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    loop_lag: LatencyHistogram = field(default_factory=LatencyHistogram)
    undelivered: int = 0

    @property
    def state(self) -> LifecycleState:
        """The server's lifecycle state (``document.server.state``, as its enum)."""
        return LifecycleState(self.document.server.state)


@dataclass(frozen=True, slots=True)
class ServerState:
    """A consistent snapshot of a server, from :meth:`TimerServer.get_state`: a view
    over its one record, :attr:`snapshot` (a :class:`ServerSnapshot` with nothing cut).

    ``timers`` are every live timer, in deadline order, as the ``/v1/state`` document
    lists them (:class:`~aiotimer.server._document.TimerInfo`: deadlines on the wall
    clock, ``seconds_left`` from the snapshot); ``workers`` the watched workers' pids;
    ``next_deadline`` and ``last_progress`` (when the loop last handled input or an
    expiry) are on the server's monotonic clock, and ``next_expiry_in`` is seconds from
    the snapshot. Counters and ``scopes`` (the duration statistics per scope site, see
    :meth:`TimerServer.scope_stats`) are those of the current (or last) run.
    """

    snapshot: ServerSnapshot

    @property
    def state(self) -> LifecycleState:
        """The server's lifecycle state."""
        return self.snapshot.state

    @property
    def sources(self) -> tuple[str, ...]:
        """Where requests arrive."""
        return self.snapshot.document.server.sources

    @property
    def timers(self) -> tuple[TimerInfo, ...]:
        """Every live timer, earliest deadline first."""
        return self.snapshot.document.timers

    @property
    def workers(self) -> tuple[int, ...]:
        """The watched workers' pids (not the server's own process)."""
        doc = self.snapshot.document
        own = doc.server.pid
        return tuple(w.pid for w in doc.workers if w.pid is not None and w.pid != own)

    @property
    def next_deadline(self) -> float | None:
        """The earliest deadline, on the server's monotonic clock."""
        return self.snapshot.next_deadline

    @property
    def next_expiry_in(self) -> float | None:
        """Seconds from the snapshot to the earliest deadline (negative: overdue)."""
        return self.snapshot.document.server.next_expiry_in

    @property
    def counters(self) -> ServerCounters:
        """The current (or last) run's counters."""
        return self.snapshot.counters

    @property
    def last_progress(self) -> float | None:
        """When the loop last handled input or an expiry (monotonic clock)."""
        return self.snapshot.last_progress

    @property
    def scopes(self) -> tuple[ScopeStats, ...]:
        """Duration statistics per scope site, most expirations first."""
        return self.snapshot.document.scopes


@dataclass(frozen=True, slots=True)
class EventHistory:
    """Recent events above a number, from :meth:`TimerServer.recent_events`.

    ``events`` are ``(number, event)`` pairs, oldest first (events are numbered from 1);
    ``last`` is the newest event's number; ``missed`` counts the events above the asked
    number that the bounded history no longer holds.
    """

    events: tuple[tuple[int, Event], ...] = ()
    last: int = 0
    missed: int = 0


def about(
    *, pid: int, version: str, sources: tuple[str, ...], policy: str, fifo: str | None
) -> ServerInfo:
    """What a server says about itself in every snapshot (fixed for its life): the
    :class:`ServerInfo` each snapshot's ``server`` is made from."""
    return ServerInfo(
        pid=pid,
        version=version,
        state=LifecycleState.CREATED.value,
        sources=sources,
        policy=policy,
        fifo=fifo,
    )


def take(
    engine: Engine | None,
    about: ServerInfo,
    *,
    live: bool,
    clock: Clock,
    limit: int | None,
    sites: int | None,
    by_state: bool,
    state: LifecycleState,
    started_at: float | None,
    events_dropped: int,
    undelivered: int,
    incidents: tuple[tuple[int, Event], ...] = (),
    journal: Journal | None = None,
) -> Taken:
    """A snapshot of ``engine`` (the current or last run; ``None``: never started),
    taken in the server's loop (:meth:`Taken.build` makes it), with its ``journal`` (if
    it keeps one). ``live``: the run still serves, so its workers and timers are listed.
    ``limit``/``sites`` cut the lists (``None``: all); ``by_state`` counts the workers by
    state. ``incidents`` are the recent reaps and refusals by event number. The other
    arguments are the server's own and go into the snapshot as they are."""
    wall, mono = clock.time(), clock.monotonic()
    timers: Sequence[Timer] = ()
    counters = ServerCounters() if engine is None else engine.counts
    counters = dataclasses.replace(counters, events_dropped=events_dropped)
    doc: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    if engine is not None:
        stats = engine.stats
        doc.update(
            scopes=tuple(stats.summaries(sites)),
            scopes_total=len(stats),
            learned=tuple(engine.learning.summaries(LEARNED_LISTED)),
        )
        extra.update(
            last_progress=engine.last_progress,
            reap_latency=engine.reap_latency.copy(),
            loop_lag=engine.loop_lag.copy(),
        )
    if engine is not None and live:
        table = engine.table
        pids = _worker_pids(engine, about.pid)
        workers = []
        for each in pids if limit is None else pids[:limit]:
            scopes, n = table.worker_scopes(each, SCOPES_PER_WORKER)
            kind = "reaping" if engine.is_reaping(each) else "timed" if n else "idle"
            workers.append(WorkerInfo(pid=each, state=kind, timers=n, scopes=tuple(scopes)))
        timers = table.snapshot() if limit is None else table.earliest(limit)
        doc.update(workers=tuple(workers), workers_total=len(pids), timers_total=len(table))
        extra.update(next_deadline=table.next_deadline())
        if by_state:
            extra.update(worker_states=_worker_states(engine, pids))
    elif by_state:
        extra.update(worker_states=dict.fromkeys(WORKER_STATES, 0))
    started = started_at if live else None
    nxt: float | None = extra.get("next_deadline")
    progress: float | None = extra.get("last_progress")
    loop_lag: LatencyHistogram = extra.get("loop_lag", LatencyHistogram())
    server = msgspec.structs.replace(
        about,
        state=state.value,
        started_at=started,
        uptime=None if started is None else wall - started,
        next_expiry_in=None if nxt is None else nxt - mono,
        idle_for=None if progress is None else mono - progress,
        max_loop_lag=loop_lag.max,
        journal=None if journal is None else str(journal.path),
        journal_problem=None if journal is None else journal.problem,
    )
    return Taken(
        timers=timers,
        incidents=incidents,
        document=dict(doc, time=wall, server=server, counters=counters_by_name(counters)),
        beside=dict(extra, monotonic=mono, counters=counters, undelivered=undelivered),
    )


@dataclass(frozen=True, slots=True)
class Taken:
    """What :func:`take` copies in the server's loop: immutable records only, so
    :meth:`build` can make the snapshot from them in any thread (another thread's
    :meth:`~aiotimer.server.TimerServer.snapshot` builds it there, so converting every
    live timer of a full listing does not hold up the loop)."""

    timers: Sequence[Timer]
    incidents: tuple[tuple[int, Event], ...]
    document: dict[str, Any]
    beside: dict[str, Any]

    def build(self) -> ServerSnapshot:
        """The snapshot: its document built once, each timer converted to its row."""
        doc = self.document
        wall, mono = doc["time"], self.beside["monotonic"]
        document = StatusSnapshot(
            timers=tuple([timer_info(t, wall, mono) for t in self.timers]),
            recent=tuple([incident_info(n, e) for n, e in self.incidents]),
            **doc,
        )
        return ServerSnapshot(document=document, **self.beside)


def _worker_pids(engine: Engine, own: int) -> list[int]:
    """Every worker ``engine`` knows: the watched ones, then the server's own process
    (never watched) if it has timers. O(workers)."""
    watched = engine.workers()
    # The engine keeps timers only of watched workers and of the server's own process.
    own_timed = own in engine.table.workers() and own not in watched
    return [*watched, own] if own_timed else list(watched)


def _worker_states(engine: Engine, pids: list[int]) -> dict[str, int]:
    """How many of ``pids`` are in each state (``timed``, ``idle``, ``reaping``)."""
    with_timers = engine.table.workers()
    reaping = [pid for pid in pids if engine.is_reaping(pid)]
    timed = len(with_timers) - sum(pid in with_timers for pid in reaping)
    return {"timed": timed, "idle": len(pids) - timed - len(reaping), "reaping": len(reaping)}


def watches(engine: Engine | None, pid: int) -> bool:
    """Whether ``engine`` watches worker ``pid``."""
    return engine is not None and pid in engine.workers()


def stopped_event(snap: ServerSnapshot, kept: JournalKept | None = None) -> ServerStopped:
    """The ``ServerStopped`` event of the run ``snap`` (taken as it ends) shows, and the
    journal it ``kept`` for the next server, if any."""
    doc = snap.document
    return ServerStopped(
        time=doc.time,
        timers=doc.timers_total,
        counters=doc.counters,
        scopes=doc.scopes,
        journal=None if kept is None else kept.path,
        journaled=0 if kept is None else kept.workers,
    )


def describe_policy(policy: ReapPolicy) -> str:
    """The reap policy in words."""
    if policy.default is None:
        what = "each timer's own signal (torch semantics)"
    else:
        what = format_plan(policy.default.steps())
    return f"report only (shadow mode); would do: {what}" if policy.shadow else what
