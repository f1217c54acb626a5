"""The server's engine: one run of a :class:`~aiotimer.server.TimerServer`, in its loop.

How this works
--------------
The engine owns one run's pure timer table (:class:`~aiotimer.core._table.TimerTable`),
its counters and statistics, and composes the parts that change them, each in its own
module; the data flows one way, from the sources to the reaper:

* **ingest** (:mod:`aiotimer.server._ingest`): applies a decoded batch to the table
  (fold, caps, journal, statistics) and starts watching the worker of a pid's first
  timer;
* **expiry** (:mod:`aiotimer.server._expiry`): one task sleeps until the next deadline;
  before acting on what expired it asks the sources' *drains* for the input that may
  concern the due workers, which they *return* and the engine applies (a release that
  reached a source before its deadline wins); then it begins the reaps;
* **workers** (:mod:`aiotimer.reapers._watch`): the per-worker state machine (unpinned,
  pinned, reaping, gone) and the watcher task that sees each worker's exit at once;
* **reaps** (:mod:`aiotimer.reapers._reaps`): carry out each reap's plan.

Sources hand their batches to :meth:`Engine.submit` (the engine is their
:class:`~aiotimer.sources.RequestSink`): it applies the batch, then handles the deadlines
that fell meanwhile (:meth:`~aiotimer.server._expiry.Expiry.catch_up`). A drain never
calls ``submit``: it returns what to apply, and the engine is the only caller of its
ingest, so a drained batch never leads back into an expiry.

When a worker goes (it exited, or a signal found it gone), its timers are cleared, with
its journal entry and its overdue blocks, and :class:`~aiotimer.events.WorkerExited` is
emitted. Timers restored from the journal (:meth:`Engine.restore`) are applied like a
batch, then speak for their worker only until it sends anything.

Everything here runs in the event loop's thread; thread-safety is the shell's business.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import anyio.abc

from aiotimer._edges.clock import Clock
from aiotimer.core._latency import LatencyHistogram
from aiotimer.core._stats import DurationStats, Overdue, ScopeStats
from aiotimer.core._table import Timer, TimerTable
from aiotimer.events import MAX_REPORTED_SCOPES, Event, ServerCounters, WorkerExited
from aiotimer.reapers._escalator import ReapRetry
from aiotimer.reapers._policy import ReapPolicy
from aiotimer.reapers._reaps import DUMP_SLACK, Reaps
from aiotimer.reapers._signal import Reaper
from aiotimer.reapers._watch import Watchlist
from aiotimer.server._expiry import EXPIRE_BUDGET, LAG_THRESHOLD, Expiry
from aiotimer.server._ingest import MAX_TIMERS, MAX_TIMERS_PER_WORKER, Ingest
from aiotimer.server._journal import Journal
from aiotimer.server._learning import Learning
from aiotimer.sources._base import Drain
from aiotimer.wire import Decoded, Request

__all__ = [
    "DUMP_SLACK",
    "EXPIRE_BUDGET",
    "LAG_THRESHOLD",
    "MAX_TIMERS",
    "MAX_TIMERS_PER_WORKER",
    "Engine",
    "ReapRetry",
    "ServerCounters",
]


class Engine:
    """One run of the server: table, workers, ingest, expiry and reaps (see the module
    docs)."""

    def __init__(
        self,
        *,
        task_group: anyio.abc.TaskGroup,
        clock: Clock,
        reaper: Reaper,
        policy: ReapPolicy,
        emit: Callable[[Event], None],
        retry: ReapRetry,
        request_events: bool,
        self_kill_after_reap: bool,
        journal: Journal | None = None,
        max_timers: int = MAX_TIMERS,
        max_timers_per_worker: int = MAX_TIMERS_PER_WORKER,
    ) -> None:
        self.table = TimerTable()
        self.counts = ServerCounters()
        self.stats = DurationStats()
        self.overdue = Overdue()
        self.learning = Learning()
        self._clock = clock
        self._emit = emit
        self._journal = journal
        self._watchlist = Watchlist(task_group=task_group, reaper=reaper, on_gone=self._gone)
        reaps = Reaps(
            task_group=task_group,
            clock=clock,
            reaper=reaper,
            emit=emit,
            counts=self.counts,
            retry=retry,
            confirm=policy.unkillable_after,
            self_kill=self_kill_after_reap,
            on_gone=self._watchlist.gone,
        )
        self._applying = False
        self._ingest = Ingest(
            table=self.table,
            counts=self.counts,
            stats=self.stats,
            overdue=self.overdue,
            watchlist=self._watchlist,
            clock=clock,
            emit=emit,
            journal=journal,
            learning=self.learning,
            request_events=request_events,
            max_timers=max_timers,
            max_timers_per_worker=max_timers_per_worker,
        )
        self._expiry = Expiry(
            table=self.table,
            clock=clock,
            counts=self.counts,
            stats=self.stats,
            overdue=self.overdue,
            journal=journal,
            watchlist=self._watchlist,
            reaps=reaps,
            policy=policy,
            emit=emit,
            ingest=self._ingest,
            learning=self.learning,
        )
        #: Deadline -> first delivered signal of each reap, seconds.
        self.reap_latency = reaps.latency
        #: How late each slice of expiries was handled (the loop was busy), seconds.
        self.loop_lag: LatencyHistogram = self._expiry.loop_lag

    # -- input (RequestSink) ----------------------------------------------------------

    def submit(self, batch: Decoded, source: str) -> None:
        """Apply ``batch``: every request in order, then one event per rejection; then
        handle the deadlines that fell meanwhile."""
        self._applying = True
        try:
            self._ingest.apply(batch, source)
            self._expiry.catch_up()
        finally:
            self._applying = False

    @property
    def busy(self) -> bool:
        """Whether the engine is applying a batch or handling expired timers right now:
        an event callback runs inside that work, so a request it submits must wait for
        the work to end (the shell hands it over) rather than cut into it."""
        return self._applying or self._expiry.handling

    def flush(self) -> None:
        """Apply what every source holds now, for any worker, then handle every deadline
        passed (see :meth:`~aiotimer.server.TimerServer.flush`)."""
        self._expiry.flush()

    def restore(self, requests: Sequence[Request], source: str) -> int:
        """Apply acquires restored from the journal (see the module docs); return how
        many timers they set (a worker that cannot be pinned, or a cap, drops some)."""
        self.submit(Decoded(requests=list(requests)), source)
        return self._ingest.mark_restored(requests)

    def add_drain(self, drain: Drain) -> Callable[[], None]:
        """Ask ``drain`` before every expiry (see :mod:`aiotimer.sources._base`); returns
        the function that removes it."""
        return self._expiry.add_drain(drain)

    # -- the run ----------------------------------------------------------------------

    async def run_expiry(self) -> None:
        """The expiry task: sleep until the next deadline, handle what expired; forever."""
        await self._expiry.run()

    def close(self) -> None:
        """Detach every remaining worker (the run is over; its tasks are cancelled)."""
        self._watchlist.close()

    def _gone(self, pid: int, reason: str) -> None:
        """Worker ``pid`` has gone (the watchlist has forgotten it): apply what it wrote
        that the sources still hold, then clear its timers."""
        if not self.busy:  # not inside the work that found it gone
            self._expiry.drain_for({pid})
        self.counts.workers_exited += 1
        count, cleared = self.table.drop_worker(pid, sample=MAX_REPORTED_SCOPES)
        self._ingest.forget(pid)
        if self._journal is not None:
            self._journal.forget(pid)
        if self.overdue:
            self.overdue.clear_worker(pid)
        self._emit(
            WorkerExited(
                time=self._clock.time(),
                pid=pid,
                cleared=tuple(cleared),
                reason=reason,
                omitted=count - len(cleared),
            )
        )

    # -- reads ------------------------------------------------------------------------

    @property
    def last_progress(self) -> float | None:
        """When the engine last applied a batch or handled its deadlines (monotonic)."""
        return self._expiry.last_progress

    @property
    def lag_threshold(self) -> float:
        """Expiries handled later than this (seconds) are reported as
        :class:`~aiotimer.events.LoopLagged`."""
        return self._expiry.lag_threshold

    @lag_threshold.setter
    def lag_threshold(self, seconds: float) -> None:
        self._expiry.lag_threshold = seconds

    def workers(self) -> tuple[int, ...]:
        """The pids of the watched workers."""
        return self._watchlist.pids()

    def is_reaping(self, pid: int) -> bool:
        """Whether a reap of worker ``pid`` is in progress."""
        return self._watchlist.is_reaping(pid)

    def snapshot(self) -> tuple[tuple[Timer, ...], tuple[int, ...]]:
        """The live timers (in deadline order) and the watched workers' pids."""
        return self.table.snapshot(), self._watchlist.pids()

    def scope_stats(self) -> tuple[ScopeStats, ...]:
        """The duration statistics of every scope site (see :mod:`aiotimer.core._stats`)."""
        return tuple(self.stats.summaries())
