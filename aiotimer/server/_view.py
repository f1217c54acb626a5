"""A timer server's read-only view: one bounded snapshot behind every read.

:meth:`~aiotimer.server.TimerServer.snapshot` returns a :class:`ServerSnapshot`: plain
frozen records, copied in the server's loop, that nothing changes afterwards. Every other
read derives from it: :meth:`~aiotimer.server.TimerServer.get_state` (a
:class:`ServerState`), ``scope_stats()``, the server's ``repr``, the control plane's
``/v1/state`` and ``/metrics`` (:mod:`aiotimer.control`) and a cluster node's record.

Cost: a snapshot lists at most ``limit`` timers (the earliest deadlines, a best-first walk
of the heap), ``limit`` workers (each with up to :data:`SCOPES_PER_WORKER` scope ids) and
``sites`` scope sites, and counts every list exactly beside it (``timers_total`` ...), so
it costs O(limit log limit + workers): the workers' pids are copied to count them (a
list copy, ~10 us per 1,000). Counting every worker by state (``by_state``, for metrics)
asks each one, a few times more. ``limit=None`` lists everything (O(timers log
timers)), for callers that asked for that (``get_state()``).

This is the one module that reads the engine's state (``table``, ``stats``, ``counts``,
``workers()``, ``is_reaping()``, ``reap_latency``, ``loop_lag``, ``last_progress``), so
one file adapts if those move.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from aiotimer._edges.lifecycle import LifecycleState
from aiotimer.core._latency import LatencyHistogram
from aiotimer.core._learned import LearnedSummary
from aiotimer.core._stats import ScopeStats
from aiotimer.core._timer import Timer
from aiotimer.events import Event, ServerCounters, ServerStopped, WorkerInfo
from aiotimer.reapers._policy import ReapPolicy
from aiotimer.reapers._steps import format_plan
from aiotimer.server._learning import LEARNED_LISTED

if TYPE_CHECKING:
    from aiotimer._edges.clock import Clock
    from aiotimer.server._engine import Engine
    from aiotimer.server._journal import Journal, JournalKept

__all__ = [
    "DEFAULT_LIMIT",
    "SCOPES_PER_WORKER",
    "WORKER_STATES",
    "About",
    "EventHistory",
    "ServerSnapshot",
    "ServerState",
    "describe_policy",
    "server_state",
    "stopped_event",
    "take",
    "watches",
]

#: Timers, workers and scope sites listed by default (the totals are always exact).
DEFAULT_LIMIT: Final[int] = 50
#: Scope ids listed per worker (its ``timers`` count is exact).
SCOPES_PER_WORKER: Final[int] = 8
#: The states of a server's workers.
WORKER_STATES: Final[tuple[str, ...]] = ("timed", "idle", "reaping")


@dataclass(frozen=True, slots=True)
class ServerSnapshot:
    """A server at one moment, copied in its loop (see the module docs).

    ``time`` and ``monotonic`` are the server clock's readings at the snapshot: timers'
    deadlines, ``next_deadline`` and ``last_progress`` are on its monotonic clock.
    ``started_at`` is the wall-clock start of the current run (``None`` unless it runs).
    ``policy`` is the reap policy in words; ``fifo`` the FIFO's path, if any.
    ``counters`` are the current (or last) run's. ``workers`` (watched workers, then the
    server's own process if it has timers), ``timers`` (earliest deadline first) and
    ``scopes`` (duration statistics per scope site, most expirations first) are cut at
    the snapshot's limits, with exact ``*_total`` counts; ``worker_states`` counts every
    worker by state, if the snapshot was asked to (else ``None``). ``reap_latency``
    (deadline to first signal) and ``loop_lag`` (how late expiries were handled) are
    copies of the run's histograms; ``undelivered`` counts events dropped for slow
    subscribers; ``incidents`` are the last reaps and refusals, numbered as events,
    oldest first. ``journal`` is the journal's path (``None``: it keeps none) and
    ``journal_problem`` why it cannot be written now (``None``: it can, or it has not
    tried yet). ``learned`` are the learned timeouts' scopes (the
    :data:`~aiotimer.server._learning.LEARNED_LISTED` with most samples). A
    server that is not running lists no
    workers or timers, and keeps its last run's counters, statistics and histograms.
    """

    state: LifecycleState
    pid: int
    version: str
    time: float
    monotonic: float
    counters: ServerCounters
    started_at: float | None = None
    sources: tuple[str, ...] = ()
    policy: str = ""
    fifo: str | None = None
    next_deadline: float | None = None
    last_progress: float | None = None
    workers: tuple[WorkerInfo, ...] = ()
    workers_total: int = 0
    worker_states: Mapping[str, int] | None = None
    timers: tuple[Timer, ...] = ()
    timers_total: int = 0
    scopes: tuple[ScopeStats, ...] = ()
    scopes_total: int = 0
    reap_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    loop_lag: LatencyHistogram = field(default_factory=LatencyHistogram)
    undelivered: int = 0
    incidents: tuple[tuple[int, Event], ...] = ()
    journal: str | None = None
    journal_problem: str | None = None
    learned: tuple[LearnedSummary, ...] = ()

    @property
    def uptime(self) -> float | None:
        """Seconds the current run has been serving (``None`` unless it runs)."""
        return None if self.started_at is None else self.time - self.started_at

    @property
    def next_expiry_in(self) -> float | None:
        """Seconds from the snapshot to the earliest deadline (negative: overdue)."""
        return None if self.next_deadline is None else self.next_deadline - self.monotonic

    @property
    def idle_for(self) -> float | None:
        """Seconds since the server last handled input or an expiry."""
        return None if self.last_progress is None else self.monotonic - self.last_progress

    @property
    def truncated(self) -> bool:
        """Whether any list was cut at the snapshot's limits."""
        return (
            len(self.timers) < self.timers_total
            or len(self.workers) < self.workers_total
            or len(self.scopes) < self.scopes_total
        )


@dataclass(frozen=True, slots=True)
class ServerState:
    """A consistent snapshot of a server, from :meth:`TimerServer.get_state`.

    ``timers`` are every live timer, in deadline order; ``workers`` the watched workers'
    pids; ``next_deadline`` and ``last_progress`` (when the loop last handled input or an
    expiry) are on the server's monotonic clock, and ``next_expiry_in`` is seconds from
    the snapshot. Counters and ``scopes`` (the duration statistics per scope site, see
    :meth:`TimerServer.scope_stats`) are those of the current (or last) run.
    """

    state: LifecycleState
    sources: tuple[str, ...]
    timers: tuple[Timer, ...]
    workers: tuple[int, ...]
    next_deadline: float | None
    next_expiry_in: float | None
    counters: ServerCounters
    last_progress: float | None
    scopes: tuple[ScopeStats, ...] = ()


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


@dataclass(frozen=True, slots=True, kw_only=True)
class About:
    """What a server says about itself in every snapshot (fixed for its life)."""

    pid: int
    version: str
    sources: tuple[str, ...]
    policy: str
    fifo: str | None


def take(
    engine: Engine | None,
    about: About,
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
) -> ServerSnapshot:
    """A snapshot of ``engine`` (the current or last run; ``None``: never started), in
    the server's loop, with its ``journal`` (if it keeps one). ``live``: the run still
    serves, so its workers and timers are listed. ``limit``/``sites`` cut the lists
    (``None``: all); ``by_state`` counts the workers by state. The other arguments are
    the server's own and go into the snapshot as they are."""
    counters = ServerCounters() if engine is None else engine.counts
    fields: dict[str, Any] = {}
    if engine is not None:
        stats = engine.stats
        fields.update(
            last_progress=engine.last_progress,
            scopes=tuple(stats.summaries(sites)),
            scopes_total=len(stats),
            reap_latency=engine.reap_latency.copy(),
            loop_lag=engine.loop_lag.copy(),
            learned=tuple(engine.learning.summaries(LEARNED_LISTED)),
        )
    if engine is not None and live:
        table = engine.table
        pids = _worker_pids(engine, about.pid)
        workers = []
        for each in pids if limit is None else pids[:limit]:
            scopes, n = table.worker_scopes(each, SCOPES_PER_WORKER)
            kind = "reaping" if engine.is_reaping(each) else "timed" if n else "idle"
            workers.append(WorkerInfo(pid=each, state=kind, timers=n, scopes=tuple(scopes)))
        fields.update(
            next_deadline=table.next_deadline(),
            workers=tuple(workers),
            workers_total=len(pids),
            timers=table.snapshot() if limit is None else tuple(table.earliest(limit)),
            timers_total=len(table),
        )
        if by_state:
            fields.update(worker_states=_worker_states(engine, pids))
    elif by_state:
        fields.update(worker_states=dict.fromkeys(WORKER_STATES, 0))
    return ServerSnapshot(
        state=state,
        pid=about.pid,
        version=about.version,
        time=clock.time(),
        monotonic=clock.monotonic(),
        counters=dataclasses.replace(counters, events_dropped=events_dropped),
        started_at=started_at if live else None,
        sources=about.sources,
        policy=about.policy,
        fifo=about.fifo,
        undelivered=undelivered,
        incidents=incidents,
        journal=None if journal is None else str(journal.path),
        journal_problem=None if journal is None else journal.problem,
        **fields,
    )


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


def server_state(snap: ServerSnapshot) -> ServerState:
    """``snap`` as a :class:`ServerState` (its workers: the watched ones' pids)."""
    return ServerState(
        state=snap.state,
        sources=snap.sources,
        timers=snap.timers,
        workers=tuple(w.pid for w in snap.workers if w.pid is not None and w.pid != snap.pid),
        next_deadline=snap.next_deadline,
        next_expiry_in=snap.next_expiry_in,
        counters=snap.counters,
        last_progress=snap.last_progress,
        scopes=snap.scopes,
    )


def stopped_event(snap: ServerSnapshot, kept: JournalKept | None = None) -> ServerStopped:
    """The ``ServerStopped`` event of the run ``snap`` (taken as it ends) shows, and the
    journal it ``kept`` for the next server, if any."""
    return ServerStopped(
        time=snap.time,
        timers=snap.timers_total,
        counters=dataclasses.asdict(snap.counters),
        scopes=snap.scopes,
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
