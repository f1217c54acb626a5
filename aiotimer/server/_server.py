"""The timer server: lifecycle, thread-safety and the read-only view around the engine.

Three ways to run it:

* structured: ``async with TimerServer(fifo=path) as server: ...``;
* unstructured: ``await server.start()`` ... ``await server.aclose()`` from different
  places of an asyncio program (the server's task groups live in one task the server
  owns, so no cancel scope is ever exited from another task);
* for synchronous programs: ``TimerServerThread(server)``, its own loop in a daemon thread.

Lifecycle: ``created -> starting -> running -> stopping -> stopped``; a stopped server
can be started again (with a fresh, empty table). See :mod:`aiotimer._edges.lifecycle`.

One run (its task groups) is :mod:`aiotimer.server._run`; the work itself is one pure
machine (:mod:`aiotimer.server._machine`: ingest, the decision before an expiry, acting
on due timers) whose effects its shell carries out (:mod:`aiotimer.server._engine`:
pins, reaps, drains, journal, events, the alarm); every read goes through one bounded
snapshot, :mod:`aiotimer.server._view`. The server knows nothing of the layers above it
(control plane, cluster): they read its snapshot and :meth:`TimerServer.advertise`.
"""

from __future__ import annotations

import inspect
import os
import signal as _signal
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, cast

import anyio

from aiotimer._edges.clock import Clock, MonotonicClock
from aiotimer._edges.lifecycle import LifecycleState, OwnedTask, TaskOwner
from aiotimer._edges.limits import raise_open_file_limit
from aiotimer._edges.logs import EventLogger
from aiotimer._version import __version__
from aiotimer.core import ScopeStats
from aiotimer.errors import ServerStateError
from aiotimer.events import Event
from aiotimer.reapers import Reaper, ReapPolicy, SignalReaper
from aiotimer.server import _view
from aiotimer.server._engine import (
    DUMP_SLACK,
    LAG_THRESHOLD,
    MAX_TIMERS,
    MAX_TIMERS_PER_WORKER,
    ReapRetry,
    ServerCounters,
)
from aiotimer.server._eventbus import EventBus, deliver
from aiotimer.server._journal import journal_path
from aiotimer.server._observed import RequestObserver
from aiotimer.server._run import Run, RunSettings
from aiotimer.server._statsfile import StatsFile, stats_path_for
from aiotimer.server._transports import own_sources
from aiotimer.server._view import DEFAULT_LIMIT, EventHistory, ServerSnapshot, ServerState
from aiotimer.sources import Source
from aiotimer.wire import Decoded, Rejection, Request, validate

if TYPE_CHECKING:
    import multiprocessing.queues

__all__ = [
    "LifecycleState",
    "ReapRetry",
    "ServerCounters",
    "ServerState",
    "TimerServer",
]

_T = TypeVar("_T")

#: Seconds another thread waits for the server's loop to take a snapshot.
SNAPSHOT_TIMEOUT = 10.0


class TimerServer(TaskOwner):
    """An expiration-timer server (watchdog): reaps workers whose timers expire.

    Args:
        fifo: serve torch-compatible request lines on a FIFO at this path (created with
            ``fifo_mode``; a marker file beside it tells clients an aiotimer server reads
            it).
        queue: serve requests from this ``multiprocessing`` queue (torch's
            ``TimerRequest`` objects or :class:`~aiotimer.Request`).
        sources: further request sources (see :mod:`aiotimer.sources`).
        reaper: how workers are acted on (default: :class:`~aiotimer.reapers.SignalReaper`).
        clock: the time source (default: :class:`~aiotimer.MonotonicClock`).
        policy: the escalation policy (default: torch semantics, one signal).
        on_event: called with every :class:`~aiotimer.events.Event`, in the loop's thread;
            exceptions it raises are logged and otherwise ignored. An ``async def``
            callback is awaited by a task of its own, one event at a time in order,
            through a bounded buffer: when it falls 1,000 events behind, further events
            are dropped for it and counted, so it can never stall expiry.
        event_log: append every event as a JSON line to this file (written asynchronously).
            The duration statistics are then also saved every ``stats_interval`` seconds
            to ``<event_log>.stats.json`` and merged back on the next start, so a crash
            does not lose them.
        fifo_mode: the FIFO's permission bits (the socket's too, unless ``socket_mode``).
        socket: also serve the same lines on a Unix socket at this path
            (:class:`~aiotimer.sources.SocketSource`), where the kernel names each
            client, so a client can only register itself; the FIFO's marker names it
            and clients that know it prefer it.
        socket_mode: the socket's bits (default ``fifo_mode``): ``0o666`` lets other
            users' workers register only themselves, the FIFO (any pid) kept ``0o600``.
        request_events: also emit an event per acquire and release (off: they are hot).
        reap_retry: how failed signals are retried.
        self_kill_after_reap: torch compatibility only: after a successful reap, send the
            same signal to the server's own process, as torch 2.13's ``FileTimerServer``
            does. Off by default; do not turn it on unless you rely on that behaviour.
        stats_interval: seconds between saves of the statistics (see ``event_log``).
        lag_threshold: report expiries handled more than this many seconds late (the
            event loop was blocked) as :class:`~aiotimer.events.LoopLagged` events.
        journal: keep a journal of the live timers so that a server restarted after a
            crash still reaps hung workers at their deadlines (see
            ``docs/operations.md``): ``True`` beside the FIFO (``<fifo>.journal``), a
            path, or ``False``. Default: beside the FIFO when there is one and the clock
            is the default one (the journal holds ``CLOCK_MONOTONIC`` deadlines). A
            server stopped on purpose keeps it while timers that would signal are live
            (a planned restart still reaps a hung worker), else removes it.
        max_timers: the most live timers in all; when full, the table is shared per
            user, then per worker: a new timer evicts the oldest of the largest holder's
            (of the user holding the most, if two more than its own), or is rejected
            (see ``docs/operations.md``, quotas per user).
        max_timers_per_worker: reject a worker's acquires of new timers past this many.
        on_requests: called in the server's loop with each batch of requests its
            sources read, and when (its monotonic clock), before they are applied
            (:mod:`aiotimer.server._observed`); it must be quick and must not block.
            The FIFO's marker then asks clients to stamp their blocks' lines with
            their own times (the ``at`` extension).

    Reads: :meth:`snapshot` (one bounded, consistent view, from any thread), and what
    derives from it (:meth:`get_state`, :meth:`scope_stats`). A control socket, metrics
    over TCP and a cluster record are layers on top (:class:`aiotimer.control.ControlPlane`
    composes one around a server); the FIFO's marker names what they :meth:`advertise`.

    Every event also goes to the ``aiotimer`` logger, except that rejected input and
    requests naming unknown workers are logged at most once per kind per few seconds,
    with a summary of the rest (the callback and the event log still get each one).
    """

    def __init__(
        self,
        *,
        fifo: str | os.PathLike[str] | None = None,
        queue: multiprocessing.queues.Queue[object] | None = None,
        sources: Sequence[Source] = (),
        reaper: Reaper | None = None,
        clock: Clock | None = None,
        policy: ReapPolicy | None = None,
        on_event: Callable[[Event], None] | Callable[[Event], Awaitable[object]] | None = None,
        event_log: str | os.PathLike[str] | None = None,
        fifo_mode: int = 0o600,
        request_events: bool = False,
        reap_retry: ReapRetry | None = None,
        self_kill_after_reap: bool = False,
        socket: str | os.PathLike[str] | None = None,
        stats_interval: float = 10.0,
        lag_threshold: float = LAG_THRESHOLD,
        journal: bool | str | os.PathLike[str] | None = None,
        max_timers: int = MAX_TIMERS,
        max_timers_per_worker: int = MAX_TIMERS_PER_WORKER,
        socket_mode: int | None = None,
        on_requests: RequestObserver | None = None,
    ) -> None:
        if max_timers < 1 or max_timers_per_worker < 1:
            raise ValueError("max_timers and max_timers_per_worker must be at least 1")
        self._fifo_path = None if fifo is None else Path(fifo)
        own, self._fifo_source = own_sources(
            fifo=fifo, queue=queue, socket=socket, fifo_mode=fifo_mode, socket_mode=socket_mode
        )
        self._sources: tuple[Source, ...] = (*own, *sources)
        if on_requests is not None and self._fifo_source is not None:
            self._fifo_source.advertise({"stamps": True})  # block times, by the workers
        self._reaper: Reaper = reaper if reaper is not None else SignalReaper()
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._policy = policy if policy is not None else ReapPolicy()
        is_async = inspect.iscoroutinefunction(on_event)
        self._on_event = None if is_async else cast("Callable[[Event], object]", on_event)
        self._settings = RunSettings(
            sources=self._sources,
            reaper=self._reaper,
            clock=self._clock,
            policy=self._policy,
            retry=reap_retry if reap_retry is not None else ReapRetry(),
            request_events=request_events,
            self_kill=self_kill_after_reap,
            journal_path=journal_path(journal, fifo, default=clock is None),
            max_timers=max_timers,
            max_per_worker=max_timers_per_worker,
            lag_threshold=lag_threshold,
            event_log_path=event_log,
            stats_file=None if event_log is None else StatsFile(stats_path_for(event_log)),
            stats_interval=stats_interval,
            async_on_event=cast("Callable[[Event], Awaitable[object]]", on_event)
            if is_async
            else None,
            on_requests=on_requests,
        )
        self._about = _view.about(
            pid=os.getpid(),
            version=__version__,
            sources=tuple(s.name for s in self._sources),
            policy=_view.describe_policy(self._policy),
            fifo=None if fifo is None else os.fspath(fifo),
        )
        self._bus = EventBus()
        self._life = OwnedTask("timer server")
        self._run: Run | None = None
        self._event_logger = EventLogger()

    # -- lifecycle --------------------------------------------------------------------

    @property
    def fifo_path(self) -> Path | None:
        """The FIFO's path, if the server was given one."""
        return self._fifo_path

    async def start(self) -> None:
        """Start serving; return once every source accepts requests.

        The process's soft ``RLIMIT_NOFILE`` is raised to its hard limit first: the
        server holds a descriptor (pidfd) per watched worker.

        Raises:
            ServerStateError: the server is not ``created`` or ``stopped``.
            SourceError: a source could not be opened (the server is then ``stopped``).
        """
        await self._life.start(self._serve, name="aiotimer-server")

    async def _serve(self, ready: Callable[[], None]) -> None:
        """The server's body: one run (see :mod:`aiotimer.server._run`)."""
        raise_open_file_limit()
        run = self._run = Run(
            self._settings,
            emit=self._emit,
            bus=self._bus,
            event_logger=self._event_logger,
            stopped=lambda kept: _view.stopped_event(
                self._snapshot_now(limit=0, sites=None, live=True).build(), kept
            ),
        )
        await run.serve(ready, self._life)

    async def aclose(self) -> None:
        """Stop serving and wait until everything is released. Idempotent.

        Raises:
            ServerStateError: awaited in another loop than the server's (from another
                thread use :meth:`TimerServerThread.stop`).
        """
        await super().aclose()

    def advertise(self, **keys: str | None) -> None:
        """Name ``keys`` in the marker beside the FIFO, for a layer on top that clients
        should find: with ``advertise(control=path)``, ``aiotimer status --fifo`` finds
        a control socket. Republished at once while the server runs, kept across
        restarts; a no-op without a FIFO. Call it in the server's loop (or before it
        starts).

        Args:
            keys: marker keys and their values; ``None`` withdraws a key.

        A marker that cannot be written (its path squatted) is logged, and the server
        serves on without it (see ``docs/operations.md``).
        """
        if self._fifo_source is not None:
            self._fifo_source.advertise(keys)

    # -- events -----------------------------------------------------------------------

    def emit(self, event: Event) -> None:
        """Send ``event`` to the server's logger, event log, subscribers and ``on_event``
        callback, in order with its own events: for a layer on top that reports through
        the server (a control plane's refused connection). Call it in the loop's thread.

        Args:
            event: what happened (see :mod:`aiotimer.events`).
        """
        self._emit(event)

    def _emit(self, event: Event) -> None:
        run = self._run
        log = None if run is None else run.event_log
        deliver(event, self._event_logger, log, self._bus, self._on_event)

    async def events(self) -> AsyncIterator[Event]:
        """Every event from now until the server stops, for ``async for``.

        Iterate in the server's loop. A reader that falls 1,000 events behind misses the
        events that come meanwhile (counted by the ``aiotimer_events_undelivered_total``
        metric); it never holds the server up.
        """
        async for event in self._bus.subscribe():
            yield event

    def recent_events(self, *, since: int = 0, limit: int = 1000) -> EventHistory:
        """The last events (up to 1,000 are kept), numbered from 1, above number
        ``since``, at most ``limit`` of them. Safe from any thread (taken in the loop).

        Raises:
            TimeoutError: see :meth:`snapshot`.
        """

        def read() -> EventHistory:
            numbered, missed = self._bus.since(since, limit)
            return EventHistory(events=tuple(numbered), last=self._bus.last, missed=missed)

        return self._read(read)

    # -- requests (thread-safe) ---------------------------------------------------------

    def submit(self, request: Request) -> None:
        """Apply ``request`` as if a client had sent it. Thread-safe.

        An invalid request is reported as a rejection event, like bad input from a source.

        Raises:
            ServerStateError: the server is not running.
        """
        problem = validate(request)
        if problem is None:
            batch = Decoded(requests=[request])
        else:
            batch = Decoded(rejections=[Rejection.of(problem, repr(request).encode())])
        self._running().submit(batch)

    def acquire(
        self,
        scope_id: str,
        after: float,
        *,
        pid: int | None = None,
        signal: int = _signal.SIGKILL,
    ) -> None:
        """Set the timer ``(pid, scope_id)`` to expire ``after`` seconds from now.

        ``pid`` defaults to the server's own process, which is never signalled: such
        timers only report their expiry. Thread-safe.

        Raises:
            ValueError: ``after`` is negative or not finite.
            ServerStateError: the server is not running.
        """
        if not after >= 0 or after == float("inf"):
            raise ValueError(f"after must be a finite number of seconds >= 0, got {after!r}")
        clock = self._clock
        self.submit(
            Request(
                pid=os.getpid() if pid is None else pid,
                scope_id=scope_id,
                expiration_time=clock.time() + after,
                signal=int(signal),
                mono=clock.monotonic() + after,
            )
        )

    def release(self, scope_id: str, *, pid: int | None = None) -> None:
        """Release the timer ``(pid, scope_id)``; unknown timers are ignored. Thread-safe.

        Raises:
            ServerStateError: the server is not running.
        """
        pid = os.getpid() if pid is None else pid
        self.submit(Request(pid=pid, scope_id=scope_id, expiration_time=-1, signal=0))

    def flush(self) -> None:
        """Apply every request the sources hold right now, then handle every deadline
        that has passed (first signals sent); return once done. A synchronous round, for
        owners that drive the server by hand (torch's ``_run_watchdog``). Thread-safe.

        Raises:
            ServerStateError: the server is not running.
            TimeoutError: see :meth:`snapshot`.
            RuntimeError: called from the server's own event callback.
        """
        self._running().flush(SNAPSHOT_TIMEOUT)

    def _running(self) -> Run:
        run, state = self._run, self._life.state
        if state is not LifecycleState.RUNNING or run is None or run.engine is None:
            raise ServerStateError(f"the server is {state.value}, not running")
        return run

    def _read(self, fn: Callable[[], _T]) -> _T:
        """``fn()`` on a consistent view of the server, from any thread (see
        :meth:`Run.read`)."""
        run = self._run
        return fn() if run is None else run.read(fn, SNAPSHOT_TIMEOUT)

    # -- the read-only view -------------------------------------------------------------

    def snapshot(
        self,
        limit: int | None = DEFAULT_LIMIT,
        *,
        sites: int | None = DEFAULT_LIMIT,
        by_state: bool = False,
    ) -> ServerSnapshot:
        """The server at this moment: one consistent, bounded copy (see
        :class:`~aiotimer.server.ServerSnapshot`), behind every other read.

        At most ``limit`` timers (the earliest deadlines) and workers, and ``sites``
        scope sites, are listed, with exact totals; ``None`` lists all. ``by_state``
        also counts every worker by state. Costs O(limit log limit + workers + sites).
        Safe from any thread: another thread's snapshot is taken in the server's loop,
        after every request it submitted before.

        Raises:
            ValueError: a negative ``limit`` or ``sites``.
            TimeoutError: called from another thread, and the server's loop did not
                answer within :data:`SNAPSHOT_TIMEOUT` seconds (it is blocked).
        """
        if (limit is not None and limit < 0) or (sites is not None and sites < 0):
            raise ValueError(f"limit and sites must be >= 0 or None, got {limit}, {sites}")
        now = self._read(lambda: self._snapshot_now(limit=limit, sites=sites, by_state=by_state))
        return now.build()  # in the caller's thread: the loop only copies

    def _snapshot_now(
        self,
        *,
        limit: int | None,
        sites: int | None,
        by_state: bool = False,
        live: bool | None = None,
    ) -> _view.Taken:
        run, state = self._run, self._life.state
        if live is None:
            live = state in (LifecycleState.RUNNING, LifecycleState.STOPPING)
        return _view.take(
            None if run is None else run.engine,
            self._about,
            live=live,
            clock=self._clock,
            limit=limit,
            sites=sites,
            by_state=by_state,
            state=state,
            started_at=None if run is None else run.started_at,
            events_dropped=0 if run is None else run.events_dropped,
            undelivered=self._bus.dropped,
            incidents=tuple(self._bus.incidents),
            journal=None if run is None else run.journal,
        )

    def get_state(self) -> ServerState:
        """Every live timer and watched worker, the counters and the scope statistics:
        :meth:`snapshot` with nothing cut, so it costs O(timers log timers + sites).

        Raises:
            TimeoutError: see :meth:`snapshot`.
        """
        return ServerState(self.snapshot(None, sites=None))

    def scope_stats(self) -> tuple[ScopeStats, ...]:
        """Duration statistics per scope site of the current (or last) run.

        One :class:`~aiotimer.core._stats.ScopeStats` per site (a default scope id
        ``"file.py:42#17"`` belongs to site ``"file.py:42"``; any other id is its own
        site): ``count``, ``p50``/``p99``/``max`` of the blocks' durations (within 1%),
        ``expirations``, ``longest_expired`` and ``suggested_timeout``. Most expirations
        first. Safe from any thread (taken in the server's loop); costs O(workers + sites).

        Raises:
            TimeoutError: see :meth:`snapshot`.
        """
        return self.snapshot(0, sites=None).document.scopes

    def widen_learned(self, values: Mapping[str, float]) -> None:
        """Take learned timeouts (seconds by scope site) where wider than this server's
        (another node's: :mod:`aiotimer.cluster._learned`). Call it in the server's loop."""
        run = self._run
        if run is not None and run.engine is not None:
            run.engine.learning.timeouts.widen(values)

    async def dump_stacks(self, pid: int, *, timeout: float = 2.0) -> str | None:
        """Ask worker ``pid`` for a stack dump now, through the reaper (an operator's
        request; the worker is not signalled otherwise). ``None`` if none came within
        ``timeout`` seconds. Await it in the server's loop.

        Raises:
            ValueError: ``pid`` is not a worker this server watches.
        """
        run = self._run
        if run is None or not _view.watches(run.engine, pid):
            raise ValueError(f"pid {pid} is not a worker of this server")
        with anyio.move_on_after(timeout + DUMP_SLACK):
            result = await self._reaper.dump_stacks(pid, timeout)
            return result if isinstance(result, str) else None
        return None

    def __repr__(self) -> str:
        if self._life.state is not LifecycleState.RUNNING:
            return f"<TimerServer {self._life.state.value}>"
        doc, nxt = self.snapshot(0, sites=0).document, "no timers"
        if doc.server.next_expiry_in is not None:
            nxt = f"next expiry in {max(0.0, doc.server.next_expiry_in):.1f}s"
        n, workers = doc.timers_total, doc.workers_total
        return f"<TimerServer running: {n:,} timers, {workers:,} workers, {nxt}>"
