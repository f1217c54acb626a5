"""The timer server: lifecycle, thread-safety and observability around the engine.

Three ways to run it:

* structured: ``async with TimerServer(fifo=path) as server: ...``;
* unstructured: ``await server.start()`` ... ``await server.aclose()`` from different
  places of an asyncio program (the server's task group lives in one task the server
  owns, so no cancel scope is ever exited from another task);
* thread mode, for synchronous programs: ``TimerServerThread(server).start()`` /
  ``.stop()`` run the server in its own event loop in a daemon thread.

Lifecycle: ``created -> starting -> running -> stopping -> stopped``; a stopped server
can be started again (with a fresh, empty table). See :class:`Lifecycle`.

The work itself (ingest, expiry, reaping) is in :mod:`aiotimer.server._engine`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
import logging
import os
import signal as _signal
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

import anyio

from aiotimer._edges.clock import Clock, MonotonicClock
from aiotimer._edges.eventlog import EventLog
from aiotimer._edges.limits import raise_open_file_limit
from aiotimer._edges.logs import EventLogger
from aiotimer._version import __version__
from aiotimer.control._paths import default_control_path, fits_socket
from aiotimer.control.snapshot import (
    DEFAULT_LIMIT,
    EventPage,
    ServerInfo,
    StatusSnapshot,
    collect,
    describe_policy,
    worker_states,
)
from aiotimer.core._stats import SiteSummary
from aiotimer.core._table import Timer
from aiotimer.errors import ServerStateError
from aiotimer.events import ControlRefused, Event, ServerStarted, ServerStopped, SourceFailed
from aiotimer.reapers._kill_policy import fifo_mode_warning
from aiotimer.reapers._policy import ReapPolicy
from aiotimer.reapers._signal import Reaper, SignalReaper
from aiotimer.server._engine import (
    DUMP_SLACK,
    LAG_THRESHOLD,
    MAX_TIMERS,
    MAX_TIMERS_PER_WORKER,
    Counters,
    Engine,
    ReapRetry,
)
from aiotimer.server._eventbus import EventBus
from aiotimer.server._handoff import Handoff
from aiotimer.server._journal import Journal, journal_path
from aiotimer.server._statsfile import StatsFile, stats_path_for
from aiotimer.sources._base import Source, serve_source
from aiotimer.sources.fifo import FifoSource
from aiotimer.sources.mpqueue import QueueSource
from aiotimer.sources.socket import SocketSource
from aiotimer.wire import Decoded, Rejection, Request, validate

if TYPE_CHECKING:
    import multiprocessing.queues

    from aiotimer.control._http import PeerCredentials
    from aiotimer.control.metrics import MetricsSample
    from aiotimer.control.server import Route

__all__ = [
    "Counters",
    "Lifecycle",
    "ReapRetry",
    "ServerState",
    "TimerServer",
]

logger = logging.getLogger("aiotimer")

_T = TypeVar("_T")

#: The name in-process API requests are reported under.
API_SOURCE = "api"
#: The name timers restored from the journal are reported under.
JOURNAL_SOURCE = "journal"

#: Seconds another thread waits for the server's loop to take a snapshot.
SNAPSHOT_TIMEOUT = 10.0


class Lifecycle(enum.Enum):
    """Where a :class:`TimerServer` is in its life."""

    CREATED = "created"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class ServerState:
    """A consistent snapshot of a server, from :meth:`TimerServer.get_state`.

    ``timers`` are in deadline order; ``next_deadline`` and ``last_progress`` (when the
    loop last handled input or an expiry) are on the server's monotonic clock, and
    ``next_expiry_in`` is seconds from the snapshot. Counters and ``scopes`` (the
    duration statistics per scope site, see :meth:`TimerServer.scope_stats`) are those
    of the current (or last) run.
    """

    state: Lifecycle
    sources: tuple[str, ...]
    timers: tuple[Timer, ...]
    workers: tuple[int, ...]
    next_deadline: float | None
    next_expiry_in: float | None
    counters: Counters
    last_progress: float | None
    scopes: tuple[SiteSummary, ...] = ()


@dataclass(eq=False)
class _Run:
    """One start..stop of the server."""

    loop: asyncio.AbstractEventLoop
    thread_id: int
    stop: anyio.Event
    handoff: Handoff
    task: asyncio.Task[None] | None = None
    engine: Engine | None = None
    event_log: EventLog | None = None
    journal: Journal | None = None


class TimerServer:
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
        fifo_mode: the FIFO's permission bits (the socket's too).
        socket: also serve the same lines on a Unix socket at this path
            (:class:`~aiotimer.sources.SocketSource`), where the kernel names each
            client, so a client can only register itself; the FIFO's marker names it
            and clients that know it prefer it.
        request_events: also emit an event per acquire and release (off: they are hot).
        reap_retry: how failed signals are retried.
        self_kill_after_reap: torch compatibility only: after a successful reap, send the
            same signal to the server's own process, as torch 2.13's ``FileTimerServer``
            does. Off by default; do not turn it on unless you rely on that behaviour.
        control: the control socket (HTTP/1.1 + JSON, see :mod:`aiotimer.control`): a
            path, ``True`` for the default beside the FIFO (``<fifo>.control/http.sock``;
            none without a FIFO), or ``False`` for none. The FIFO's marker names it.
        control_routes: further :class:`~aiotimer.control.Route` s for the control
            socket, matched before the server's own (a supervisor adds its state and
            actions this way).
        metrics_port: also serve ``GET /metrics`` over TCP on ``127.0.0.1`` at this port,
            for scrapers that cannot read a Unix socket (no peer check there: metrics
            only).
        stats_interval: seconds between saves of the statistics (see ``event_log``).
        lag_threshold: report expiries handled more than this many seconds late (the
            event loop was blocked) as :class:`~aiotimer.events.LoopLagged` events.
        journal: keep a journal of the live timers so that a server restarted after a
            crash still reaps hung workers at their deadlines (see
            ``docs/operations.md``): ``True`` beside the FIFO (``<fifo>.journal``), a
            path, or ``False``. Default: beside the FIFO when there is one and the clock
            is the default one (the journal holds ``CLOCK_MONOTONIC`` deadlines). A
            server stopped on purpose removes its journal.
        max_timers: reject acquires of new timers past this many live timers in all.
        max_timers_per_worker: reject a worker's acquires of new timers past this many.

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
        control: str | os.PathLike[str] | bool = True,
        control_routes: Sequence[Route] = (),
        metrics_port: int | None = None,
        stats_interval: float = 10.0,
        lag_threshold: float = LAG_THRESHOLD,
        journal: bool | str | os.PathLike[str] | None = None,
        max_timers: int = MAX_TIMERS,
        max_timers_per_worker: int = MAX_TIMERS_PER_WORKER,
    ) -> None:
        if max_timers < 1 or max_timers_per_worker < 1:
            raise ValueError("max_timers and max_timers_per_worker must be at least 1")
        own: list[Source] = []
        self._fifo_path = None if fifo is None else Path(fifo)
        self._control_path: Path | None = None
        if isinstance(control, bool):
            if control and fifo is not None:
                self._control_path = default_control_path(fifo)
                if not fits_socket(self._control_path):
                    logger.warning(
                        "no control socket: the default path %s is too long for a Unix "
                        "socket; pass control= a shorter path",
                        self._control_path,
                    )
                    self._control_path = None
        else:
            self._control_path = Path(control)
        if socket is not None:
            own.append(SocketSource(socket, mode=fifo_mode))
        if fifo is not None:
            if (warning := fifo_mode_warning(fifo_mode)) is not None:
                logger.warning("%s: %s", fifo, warning)
            marker: dict[str, object] = {}
            if socket is not None:
                marker["socket"] = os.fspath(socket)
            if self._control_path is not None:
                marker["control"] = str(self._control_path)
            own.append(FifoSource(fifo, mode=fifo_mode, marker=marker))
        if queue is not None:
            own.append(QueueSource(queue))
        self._sources: tuple[Source, ...] = (*own, *sources)
        self._reaper: Reaper = reaper if reaper is not None else SignalReaper()
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._policy = policy if policy is not None else ReapPolicy()
        self._on_event = on_event
        self._async_on_event = inspect.iscoroutinefunction(on_event)
        self._event_log_path = event_log
        self._stats_file = None if event_log is None else StatsFile(stats_path_for(event_log))
        self._stats_interval = stats_interval
        self._control_routes = tuple(control_routes)
        self._metrics_port = metrics_port
        self._lag_threshold = lag_threshold
        self._bus = EventBus()
        self._started_at: float | None = None
        self._request_events = request_events
        self._retry = reap_retry if reap_retry is not None else ReapRetry()
        self._self_kill = self_kill_after_reap
        self._journal_path = journal_path(journal, fifo, default=clock is None)
        self._max_timers = max_timers
        self._max_per_worker = max_timers_per_worker
        self._state = Lifecycle.CREATED
        self._run: _Run | None = None
        self._event_logger = EventLogger()

    # -- lifecycle --------------------------------------------------------------------

    @property
    def state(self) -> Lifecycle:
        """The current lifecycle state."""
        return self._state

    @property
    def fifo_path(self) -> Path | None:
        """The FIFO's path, if the server was given one."""
        return self._fifo_path

    @property
    def control_path(self) -> Path | None:
        """The control socket's path, if the server has one."""
        return self._control_path

    async def start(self) -> None:
        """Start serving; return once every source accepts requests.

        The process's soft ``RLIMIT_NOFILE`` is raised to its hard limit first: the
        server holds a descriptor (pidfd) per watched worker.

        Raises:
            ServerStateError: the server is not ``created`` or ``stopped``.
            SourceError: a source could not be opened (the server is then ``stopped``).
        """
        if self._state not in (Lifecycle.CREATED, Lifecycle.STOPPED):
            raise ServerStateError(f"cannot start a {self._state.value} server")
        self._state = Lifecycle.STARTING
        raise_open_file_limit()
        loop = asyncio.get_running_loop()
        run = self._run = _Run(loop, threading.get_ident(), anyio.Event(), Handoff(loop))
        ready: asyncio.Future[None] = loop.create_future()
        run.task = loop.create_task(self._main(run, ready), name="aiotimer-server")
        try:
            await asyncio.shield(ready)
        except BaseException as exc:
            if ready.done() and not ready.cancelled() and ready.exception() is exc:
                await run.task  # it failed to start and has already cleaned up
                raise _unwrap(exc) from None
            run.stop.set()  # start() itself was cancelled
            await asyncio.shield(run.task)
            raise

    async def aclose(self) -> None:
        """Stop serving and wait until everything is released. Idempotent.

        Must be awaited in the loop the server runs in (from another thread use
        :meth:`TimerServerThread.stop`).
        """
        run = self._run
        if run is None or self._state in (Lifecycle.CREATED, Lifecycle.STOPPED):
            return
        if asyncio.get_running_loop() is not run.loop:
            raise ServerStateError("aclose() must be awaited in the server's own event loop")
        if self._state is not Lifecycle.STOPPING:
            self._state = Lifecycle.STOPPING
        run.stop.set()
        assert run.task is not None
        await asyncio.shield(run.task)

    async def __aenter__(self) -> TimerServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _main(self, run: _Run, ready: asyncio.Future[None]) -> None:
        """The task that owns the server's task groups for one run."""
        started = False
        try:
            async with anyio.create_task_group() as outer:
                if self._event_log_path is not None:
                    run.event_log = EventLog(self._event_log_path)
                    await outer.start(run.event_log.run)
                if self._async_on_event:
                    await outer.start(self._bus.run_callback, self._on_event)
                if self._journal_path is not None:
                    run.journal = Journal(self._journal_path)
                try:
                    async with anyio.create_task_group() as tg:
                        engine = run.engine = Engine(
                            task_group=tg,
                            clock=self._clock,
                            reaper=self._reaper,
                            policy=self._policy,
                            emit=self._emit,
                            retry=self._retry,
                            request_events=self._request_events,
                            self_kill_after_reap=self._self_kill,
                            journal=run.journal,
                            max_timers=self._max_timers,
                            max_timers_per_worker=self._max_per_worker,
                        )
                        engine.lag_threshold = self._lag_threshold
                        await tg.start(run.handoff.run)
                        if self._stats_file is not None:
                            self._stats_file.load_into(engine.stats)
                            tg.start_soon(self._stats_file.run, engine.stats, self._stats_interval)
                        if self._control_path is not None:
                            await tg.start(self._serve_control, self._control_path)
                        if self._metrics_port is not None:
                            await tg.start(self._serve_metrics, self._metrics_port)
                        if run.journal is not None:
                            self._restore(run.journal, engine)
                            tg.start_soon(run.journal.run, engine.table, self._mono_to_wall)
                        for source in self._sources:
                            await tg.start(
                                serve_source, source, engine, self._source_failed(source)
                            )
                        tg.start_soon(engine.run_expiry, name="aiotimer-expiry")
                        if self._state is Lifecycle.STARTING:
                            self._state = Lifecycle.RUNNING
                        started = True
                        self._started_at = self._clock.time()
                        self._emit(
                            ServerStarted(
                                time=self._clock.time(),
                                pid=os.getpid(),
                                sources=tuple(s.name for s in self._sources),
                            )
                        )
                        ready.set_result(None)
                        await run.stop.wait()
                        tg.cancel_scope.cancel()
                finally:
                    if run.journal is not None and run.stop.is_set():
                        run.journal.remove()  # stopped on purpose: its timers go with it
                    if run.engine is not None:
                        run.engine.close()
                    run.handoff.close()  # the engine is still: other threads read it directly
                    if started:
                        self._emit(
                            ServerStopped(
                                time=self._clock.time(),
                                timers=len(run.engine.table) if run.engine else 0,
                                counters=_counter_dict(_counters(run)),
                                scopes=run.engine.scope_stats() if run.engine else (),
                            )
                        )
                    self._event_logger.close()

                    if self._stats_file is not None and run.engine is not None:
                        self._stats_file.save(run.engine.stats)
                    if run.event_log is not None:
                        run.event_log.close()
                    self._bus.close()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
                if isinstance(exc, Exception):
                    return
            elif isinstance(exc, Exception):
                logger.exception("the timer server crashed")
                return
            raise
        finally:
            run.handoff.close()
            self._state = Lifecycle.STOPPED

    def _restore(self, journal: Journal, engine: Engine) -> None:
        restored = journal.load(self._clock.monotonic())
        if restored:
            engine.restore(restored, JOURNAL_SOURCE)
            logger.warning(
                "restored %d timer(s) of hung-or-silent workers from the journal %s; each "
                "is dropped as soon as its worker sends anything",
                len(restored),
                journal.path,
            )

    def _mono_to_wall(self) -> float:
        return self._clock.time() - self._clock.monotonic()

    def _source_failed(self, source: Source) -> Callable[[BaseException], None]:
        def report(exc: BaseException) -> None:
            self._emit(SourceFailed(time=self._clock.time(), source=source.name, error=f"{exc!r}"))

        return report

    # -- events -----------------------------------------------------------------------

    def _emit(self, event: Event) -> None:
        self._event_logger.log(event)
        run = self._run
        if run is not None and run.event_log is not None:
            run.event_log.put(event)
        self._bus.publish(event)
        if self._on_event is not None and not self._async_on_event:
            try:
                self._on_event(event)
            except Exception:
                logger.exception("the on_event callback raised on %s; ignored", event.kind)

    async def events(self) -> AsyncIterator[Event]:
        """Every event from now until the server stops, for ``async for``.

        Iterate in the server's loop. A reader that falls 1,000 events behind misses the
        events that come meanwhile (counted by the ``aiotimer_events_undelivered_total``
        metric); it never holds the server up.
        """
        async for event in self._bus.subscribe():
            yield event

    def recent_events(self, *, since: int = 0, limit: int = 1000) -> EventPage:
        """The last events (up to 1,000 are kept), numbered from 1, above number
        ``since``; in the loop's thread (see :class:`~aiotimer.control.EventPage`)."""
        numbered, missed = self._bus.since(since, limit)
        return EventPage(
            events=tuple({**e.to_dict(), "seq": n} for n, e in numbered),
            last=self._bus.last,
            missed=missed,
        )

    async def _serve_control(
        self, path: Path, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        # Imported here: only a server with a control socket needs the HTTP layer.
        from aiotimer.control.server import ControlServer  # noqa: PLC0415

        def refused(peer: PeerCredentials) -> None:
            self._emit(ControlRefused(time=self._clock.time(), pid=peer.pid, uid=peer.uid))

        control = ControlServer(path, self._routes(), on_refused=refused)
        await control.serve(task_status=task_status)

    async def _serve_metrics(
        self, port: int, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        from aiotimer.control.server import serve_tcp  # noqa: PLC0415

        routes = [r for r in self._routes() if (r.method, r.pattern) == ("GET", "/metrics")]
        await serve_tcp(routes[:1], port, task_status=task_status)

    def _routes(self) -> list[Route]:
        """Every route of the control socket: the owner's first, then the server's."""
        from aiotimer.control._app import server_routes  # noqa: PLC0415

        return [*self._control_routes, *server_routes(self)]

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
        self._dispatch(batch)

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

    def _dispatch(self, batch: Decoded) -> None:
        run = self._run
        if self._state is not Lifecycle.RUNNING or run is None or run.engine is None:
            raise ServerStateError(f"the server is {self._state.value}, not running")
        engine = run.engine
        if threading.get_ident() == run.thread_id and asyncio.current_task() is not None:
            engine.submit(batch, API_SOURCE)
        else:  # another thread, or a plain loop callback: apply it in a task of the loop
            run.handoff.call_soon(lambda: engine.submit(batch, API_SOURCE))

    def _call_in_loop(self, fn: Callable[[], _T], timeout: float) -> _T:
        """Run ``fn()`` in the server's loop, after everything submitted before, and
        return its result (at once when called in the loop's own thread).

        Raises:
            ServerStateError: the server is not running (or stopped before ``fn`` ran).
            TimeoutError: the loop did not run ``fn`` within ``timeout`` seconds.
        """
        run = self._run
        if self._state is not Lifecycle.RUNNING or run is None:
            raise ServerStateError(f"the server is {self._state.value}, not running")
        if threading.get_ident() == run.thread_id:
            return fn()
        return run.handoff.call(fn, timeout)

    def _read(self, fn: Callable[[], _T]) -> _T:
        """``fn()`` on a consistent view of the loop's state, from any thread: in the
        loop while a run is live (another thread waits up to :data:`SNAPSHOT_TIMEOUT`
        seconds for it), directly once the run has ended (nothing changes it then)."""
        run = self._run
        if run is not None and threading.get_ident() != run.thread_id:
            with contextlib.suppress(ServerStateError):  # the run has ended
                return run.handoff.call(fn, SNAPSHOT_TIMEOUT)
        return fn()

    # -- introspection ------------------------------------------------------------------

    def scope_stats(self) -> tuple[SiteSummary, ...]:
        """Duration statistics per scope site of the current (or last) run.

        One :class:`~aiotimer.core._stats.SiteSummary` per site (a default scope id
        ``"file.py:42#17"`` belongs to site ``"file.py:42"``; any other id is its own
        site): ``count``, ``p50``/``p99``/``max`` of the blocks' durations (within 1%),
        ``expirations``, ``longest_expired`` and ``suggested_timeout``. Most expirations
        first. Safe from any thread (taken in the server's loop); costs O(sites).

        Raises:
            TimeoutError: called from another thread, and the server's loop did not
                answer within :data:`SNAPSHOT_TIMEOUT` seconds (it is blocked).
        """
        return self._read(self._scope_stats)

    def _scope_stats(self) -> tuple[SiteSummary, ...]:
        run = self._run
        return () if run is None or run.engine is None else run.engine.scope_stats()

    def status(self, *, limit: int = DEFAULT_LIMIT) -> StatusSnapshot:
        """The whole state as served by the control socket's ``GET /v1/state``.

        Lists are cut at ``limit`` entries (the earliest timers), with exact totals; the
        cost is bounded accordingly (see :mod:`aiotimer.control.snapshot`). From another
        thread it is taken in the server's loop (waiting up to 5 s).
        """
        run = self._run
        in_other_thread = run is not None and threading.get_ident() != run.thread_id
        if in_other_thread and self._state is Lifecycle.RUNNING:
            return self._call_in_loop(lambda: self.status(limit=limit), 5.0)
        engine = None if run is None else run.engine
        running = self._state in (Lifecycle.RUNNING, Lifecycle.STOPPING)
        now = self._clock.time()
        deadline = engine.table.next_deadline() if engine is not None and running else None
        info = ServerInfo(
            pid=os.getpid(),
            version=__version__,
            state=self._state.value,
            started_at=self._started_at if running else None,
            uptime=now - self._started_at if running and self._started_at else None,
            sources=tuple(s.name for s in self._sources),
            policy=describe_policy(self._policy),
            fifo=None if self._fifo_path is None else str(self._fifo_path),
            control=None if self._control_path is None else str(self._control_path),
            next_expiry_in=None if deadline is None else deadline - self._clock.monotonic(),
            idle_for=None
            if engine is None or engine.last_progress is None
            else self._clock.monotonic() - engine.last_progress,
            max_loop_lag=0.0 if engine is None else engine.loop_lag.max,
        )
        return collect(
            engine if running else None,
            server=info,
            counters=_counters(run),
            clock=self._clock,
            limit=limit,
        )

    def metrics_text(self) -> bytes:
        """The Prometheus text exposition of the server's metrics (``GET /metrics``), in
        the loop's thread (see :mod:`aiotimer.control.metrics`)."""
        from aiotimer.control.metrics import render  # noqa: PLC0415 (prometheus_client: lazy)

        return render(self.metrics_sample)

    def metrics_sample(self) -> MetricsSample:
        """The numbers :meth:`metrics_text` renders, read now (in the loop's thread)."""
        from aiotimer.control.metrics import MetricsSample  # noqa: PLC0415

        run = self._run
        engine = None if run is None else run.engine
        counters = asdict(_counters(run))
        if engine is None:
            return MetricsSample(
                live_timers=0, workers={}, counters=counters, undelivered=self._bus.dropped
            )
        return MetricsSample(
            live_timers=len(engine.table),
            workers=worker_states(engine),
            counters=counters,
            reap_latency=engine.reap_latency,
            loop_lag=engine.loop_lag,
            undelivered=self._bus.dropped,
        )

    async def dump_stacks(self, pid: int, *, timeout: float = 2.0) -> str | None:
        """Ask worker ``pid`` for a stack dump now, through the reaper (an operator's
        request; the worker is not signalled otherwise). ``None`` if none came within
        ``timeout`` seconds. Await it in the server's loop.

        Raises:
            ValueError: ``pid`` is not a worker this server watches.
        """
        run = self._run
        engine = None if run is None else run.engine
        if engine is None or pid not in engine.workers():
            raise ValueError(f"pid {pid} is not a worker of this server")
        with anyio.move_on_after(timeout + DUMP_SLACK):
            result = await self._reaper.dump_stacks(pid, timeout)
            return result if isinstance(result, str) else None
        return None

    def get_state(self) -> ServerState:
        """A consistent snapshot of the server; costs O(timers + sites).

        Safe from any thread: another thread's snapshot is taken in the server's loop,
        after every request it submitted before.

        Raises:
            TimeoutError: called from another thread, and the server's loop did not
                answer within :data:`SNAPSHOT_TIMEOUT` seconds (it is blocked).
        """
        return self._read(self._state_now)

    def _state_now(self) -> ServerState:
        run = self._run
        engine = None if run is None else run.engine
        running = self._state in (Lifecycle.RUNNING, Lifecycle.STOPPING)
        timers: tuple[Timer, ...] = ()
        workers: tuple[int, ...] = ()
        if engine is not None and running:
            timers, workers = engine.snapshot()
        next_deadline = timers[0].deadline if timers else None
        now = self._clock.monotonic()
        return ServerState(
            state=self._state,
            sources=tuple(s.name for s in self._sources),
            timers=timers,
            workers=workers,
            next_deadline=next_deadline,
            next_expiry_in=None if next_deadline is None else next_deadline - now,
            counters=_counters(run),
            last_progress=None if engine is None else engine.last_progress,
            scopes=self._scope_stats(),
        )

    def __repr__(self) -> str:
        if self._state is not Lifecycle.RUNNING:
            return f"<TimerServer {self._state.value}>"
        st = self.get_state()
        nxt = (
            "no timers"
            if st.next_expiry_in is None
            else f"next expiry in {max(0.0, st.next_expiry_in):.1f}s"
        )
        return (
            f"<TimerServer running: {len(st.timers):,} timers, {len(st.workers):,} workers, {nxt}>"
        )


def _counters(run: _Run | None) -> Counters:
    if run is None or run.engine is None:
        return Counters()
    dropped = 0 if run.event_log is None else run.event_log.dropped + run.event_log.lost
    return replace(run.engine.counts, events_dropped=dropped)


def _counter_dict(counters: Counters) -> dict[str, int]:
    return asdict(counters)


def _unwrap(exc: BaseException) -> BaseException:
    """The single exception inside (nested) one-exception groups, else ``exc``."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
