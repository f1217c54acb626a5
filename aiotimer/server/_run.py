"""One run of a timer server: what one ``start() .. aclose()`` builds, and its body.

:class:`Run` holds the run's handoff (calls from other threads), engine, event log and
journal. :meth:`Run.serve` is the server's body (the owned task of
:mod:`aiotimer._edges.lifecycle`):

1. the outer task group: the event log's writer and the async ``on_event`` callback's
   task, which must see the run's last event;
2. the inner task group: the engine, then in order the handoff, the statistics file,
   the journal (its timers restored first), every source, and the expiry task;
3. ready: ``ServerStarted``; then it waits for the stop;
4. on the way out: a server stopped on purpose writes its journal complete and keeps it
   while timers that would signal are live (the next server on the FIFO restores them),
   else removes it; the workers are detached, the handoff ends (other threads then read the
   still engine directly), ``ServerStopped`` is emitted, and the statistics file, event
   log and event bus are closed after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.abc
import anyio.to_thread

from aiotimer._edges.clock import Clock
from aiotimer._edges.eventlog import EventLog
from aiotimer._edges.lifecycle import OwnedTask
from aiotimer._edges.logs import EventLogger
from aiotimer.errors import ServerStateError
from aiotimer.events import Event, ServerStarted, SourceFailed
from aiotimer.reapers import Reaper, ReapPolicy
from aiotimer.server._engine import Engine, ReapRetry
from aiotimer.server._eventbus import EventBus
from aiotimer.server._handoff import Handoff
from aiotimer.server._journal import Journal, JournalKept
from aiotimer.server._observed import ObservedSink, RequestObserver
from aiotimer.server._statsfile import StatsFile
from aiotimer.sources import Source, serve_source
from aiotimer.wire import Decoded

__all__ = ["API_SOURCE", "JOURNAL_SOURCE", "Run", "RunSettings"]

logger = logging.getLogger("aiotimer")

_T = TypeVar("_T")

#: The name in-process API requests are reported under.
API_SOURCE = "api"
#: The name timers restored from the journal are reported under.
JOURNAL_SOURCE = "journal"


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSettings:
    """What every run of a server is built from (the server's configuration)."""

    sources: tuple[Source, ...]
    reaper: Reaper
    clock: Clock
    policy: ReapPolicy
    retry: ReapRetry
    request_events: bool
    self_kill: bool
    journal_path: Path | None
    max_timers: int
    max_per_worker: int
    lag_threshold: float
    event_log_path: str | os.PathLike[str] | None
    stats_file: StatsFile | None
    stats_interval: float
    async_on_event: Callable[[Event], Awaitable[object]] | None
    on_requests: RequestObserver | None = None


class Run:
    """One start..stop of a server, created in the server's loop (see the module docs).

    ``emit`` is the server's event pipeline; ``bus`` and ``event_logger`` are the
    server's, closed when the run ends; ``stopped`` builds the run's ``ServerStopped``.
    """

    def __init__(
        self,
        settings: RunSettings,
        *,
        emit: Callable[[Event], None],
        bus: EventBus,
        event_logger: EventLogger,
        stopped: Callable[[JournalKept | None], Event],
    ) -> None:
        self.settings = settings
        self.loop = asyncio.get_running_loop()
        self.thread_id = threading.get_ident()
        self.handoff = Handoff(self.loop)
        self.engine: Engine | None = None
        self.event_log: EventLog | None = None
        self.journal: Journal | None = None
        self.started_at: float | None = None
        self._emit = emit
        self._bus = bus
        self._event_logger = event_logger
        self._stopped = stopped

    def submit(self, batch: Decoded) -> None:
        """Apply ``batch`` as in-process API requests, from any thread: at once in a task
        of the loop's thread, else (another thread, a plain loop callback, where anyio's
        primitives do not work, or an event callback while the engine is busy with a
        batch or an expiry) in the handoff's task, in order.

        Raises:
            ServerStateError: the run has ended.
        """
        engine = self.engine
        assert engine is not None, "the run serves"
        if (
            threading.get_ident() == self.thread_id
            and asyncio.current_task() is not None
            and not engine.busy  # an event callback inside a batch: after it, in order
        ):
            engine.submit(batch, API_SOURCE)
        else:
            self.handoff.call_soon(lambda: engine.submit(batch, API_SOURCE))

    def flush(self, timeout: float) -> None:
        """The engine's synchronous round, from any thread (another thread waits up to
        ``timeout`` seconds for the loop to run it).

        Raises:
            RuntimeError: called inside the engine's own work (an event callback).
            TimeoutError: the loop did not run it in time (it is blocked).
            ServerStateError: the run ended first.
        """
        engine = self.engine
        assert engine is not None, "the run serves"
        if threading.get_ident() != self.thread_id:
            self.handoff.call(engine.flush, timeout)
        elif engine.busy:
            raise RuntimeError("flush() cannot run inside an event callback of the server")
        else:
            engine.flush()

    def read(self, fn: Callable[[], _T], timeout: float) -> _T:
        """``fn()`` on a consistent view of the run, from any thread: in the loop while
        the run is live (after every call handed over before; another thread waits up to
        ``timeout`` seconds), directly once it has ended (nothing changes it then).

        Raises:
            TimeoutError: the loop did not run ``fn`` in time (it is blocked).
        """
        if threading.get_ident() != self.thread_id:
            with contextlib.suppress(ServerStateError):  # the run has ended
                return self.handoff.call(fn, timeout)
        return fn()

    @property
    def events_dropped(self) -> int:
        """Events the event log had no room for (or lost), this run."""
        log = self.event_log
        return 0 if log is None else log.dropped + log.lost

    async def serve(self, ready: Callable[[], None], life: OwnedTask) -> None:
        """The server's body: serve until ``life`` asks for a stop."""
        cfg = self.settings
        started = False
        try:
            async with anyio.create_task_group() as outer:
                if cfg.event_log_path is not None:
                    self.event_log = EventLog(cfg.event_log_path)
                    await outer.start(self.event_log.run)
                if cfg.async_on_event is not None:
                    await outer.start(self._bus.run_callback, cfg.async_on_event)
                if cfg.journal_path is not None:
                    self.journal = Journal(cfg.journal_path)
                try:
                    async with anyio.create_task_group() as tg:
                        await self._start(tg)
                        ready()
                        started = True
                        self.started_at = cfg.clock.time()
                        names = tuple(s.name for s in cfg.sources)
                        self._emit(
                            ServerStarted(time=self.started_at, pid=os.getpid(), sources=names)
                        )
                        await life.wait_stop_requested()
                        tg.cancel_scope.cancel()
                finally:
                    self._close(on_purpose=life.stop_requested, started=started)
        finally:
            self.handoff.close()

    async def _start(self, tg: anyio.abc.TaskGroup) -> None:
        """Build the engine and start, in order, everything that serves with it."""
        cfg = self.settings
        engine = self.engine = Engine(
            task_group=tg,
            clock=cfg.clock,
            reaper=cfg.reaper,
            policy=cfg.policy,
            emit=self._emit,
            retry=cfg.retry,
            request_events=cfg.request_events,
            self_kill_after_reap=cfg.self_kill,
            journal=self.journal,
            max_timers=cfg.max_timers,
            max_timers_per_worker=cfg.max_per_worker,
        )
        engine.lag_threshold = cfg.lag_threshold
        await tg.start(self.handoff.run)
        if cfg.stats_file is not None:
            learned = engine.learning.timeouts
            cfg.stats_file.load_into(engine.stats, learned)
            tg.start_soon(cfg.stats_file.run, engine.stats, cfg.stats_interval, learned)
        if self.journal is not None:
            await self._restore(self.journal, engine)
            tg.start_soon(self.journal.run, engine.table, self._mono_to_wall)
        sink = (
            engine if cfg.on_requests is None else ObservedSink(engine, cfg.on_requests, cfg.clock)
        )
        for source in cfg.sources:
            await tg.start(serve_source, source, sink, self._source_failed(source))
        tg.start_soon(engine.run_expiry, name="aiotimer-expiry")

    def _close(self, *, on_purpose: bool, started: bool) -> None:
        """End the run (its tasks are cancelled): see the module docs, point 4."""
        kept = None
        if self.journal is not None and on_purpose and self.engine is not None:
            kept = self._keep_journal(self.journal, self.engine)
        if self.engine is not None:
            self.engine.close()
        self.handoff.close()  # the engine is still: other threads read it directly
        if started:
            self._emit(self._stopped(kept))
        self._event_logger.close()
        if self.settings.stats_file is not None and self.engine is not None:
            self.settings.stats_file.save(self.engine.stats, self.engine.learning.timeouts)
        if self.event_log is not None:
            self.event_log.close()
        self._bus.close()

    async def _restore(self, journal: Journal, engine: Engine) -> None:
        """Restore the journal's timers before any source serves (the file is read and
        checked in a worker thread: the loop stays free, see
        :mod:`aiotimer.server._restore`)."""
        found = await anyio.to_thread.run_sync(journal.load, self.settings.clock.monotonic())
        restored = engine.restore(found.requests, JOURNAL_SOURCE) if found.requests else 0
        if found.entries:
            logger.warning(
                "restored %d timer(s) of hung-or-silent workers from the %d entries of the "
                "journal %s%s; each is dropped as soon as its worker sends anything",
                restored,
                found.entries,
                journal.path,
                found.describe_dropped(),
            )

    def _keep_journal(self, journal: Journal, engine: Engine) -> JournalKept | None:
        """A planned stop: with live timers that would signal, the journal is written
        complete and kept for the next server on the FIFO (a hung worker is still reaped
        at its deadline after a restart); with none, it is removed."""
        try:
            workers = journal.keep(engine.table, self._mono_to_wall())
        except OSError as exc:
            logger.error("cannot write the journal %s on stop: %s", journal.path, exc)
            return None
        if not workers:
            journal.remove()
            return None
        return JournalKept(str(journal.path), workers)

    def _mono_to_wall(self) -> float:
        clock = self.settings.clock
        return clock.time() - clock.monotonic()

    def _source_failed(self, source: Source) -> Callable[[BaseException], None]:
        clock = self.settings.clock

        def report(exc: BaseException) -> None:
            self._emit(SourceFailed(time=clock.time(), source=source.name, error=f"{exc!r}"))

        return report
