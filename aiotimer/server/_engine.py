"""The server's engine: one run of a :class:`~aiotimer.server.TimerServer`, in its loop.

How this works
--------------
Sources hand decoded batches to :meth:`Engine.submit` (the engine is their
:class:`~aiotimer.sources.RequestSink`). Each request updates the pure
:class:`~aiotimer.core._table.TimerTable`; the first timer of a pid attaches the worker in
the reaper and starts one *watcher* task that clears the worker's timers as soon as it
exits.

One *expiry* task sleeps until the table's next deadline (forever when it is empty)
inside a cancel scope. When a request brings a deadline earlier than the one being slept
on, ``submit`` cancels that scope and the task re-arms at once. There is no polling
interval: an idle engine makes no wake-ups (``Counters.wakeups`` counts them). The
clock's ``sleep_until`` never returns before the deadline, so the task handles what is
due as soon as it wakes. Deadlines that fall while the loop is busy elsewhere are caught
by ``submit`` too: after applying a batch it handles whatever has come due, so that
ingesting a burst of input does not hold up an expiry.

Before acting on expired timers the engine asks the sources' *drains*
(:meth:`Engine.add_drain`, the protocol in :mod:`aiotimer.sources._base`) about the
workers whose timers are due (:meth:`~aiotimer.core._table.TimerTable.due_pids`, a peek;
about anyone when more than :data:`EXPIRE_BUDGET` heap entries are due):
each takes in what its transport holds right now, so a release that reached the FIFO
before the deadline wins, even when this loop was stalled (a SIGSTOP, a GC or VM
pause) and wakes up after it: the stall is the server's lateness, not the worker's.
Only input that may name a due worker is decoded and applied first (with whatever
precedes it); a FIFO flooded by other workers costs a byte scan of the pipe's
contents, not their decoding (:mod:`aiotimer.wire._mentions`). Applying input may make more
timers due; their workers are looked for in turn. A timer is acted on once its worker
was looked for, or once the drains have spent :data:`DRAIN_BUDGET` applying input that
may concern the due workers.

Work per loop iteration is bounded: expired timers are popped in slices of
:data:`EXPIRE_BUDGET` heap entries, and the expiry task yields between slices.

Expired timers are handled in deadline order: the policy turns each into a plan
(:mod:`aiotimer.reapers._policy`). An empty plan is "report only". Otherwise the worker's other
timers are dropped from the table at once (O(1): their heap entries go stale) and the
plan is carried out by :class:`~aiotimer.reapers._reaps.Reaps`,
which takes the first action right in the expiry handler (a first signal leaves at the
deadline, before anything else is done about the timer; its outcome is reported right
after the :class:`~aiotimer.events.TimerExpired` event) and the rest in one task per
worker. Timers of that worker falling due in the same slice are folded into the same
reap: one :class:`~aiotimer.events.TimerExpired` event for the first, and one
:class:`~aiotimer.events.WorkerReaped` listing the scopes it covers (at most
:data:`~aiotimer.events.MAX_REPORTED_SCOPES`, the rest counted), however many timers.

Caps: an acquire of a new key is rejected (a counted
:class:`~aiotimer.events.RequestRejected`) when the table holds ``max_timers`` timers,
or its worker ``max_timers_per_worker``.

The journal (:mod:`aiotimer.server._journal`), when there is one, is told every change of a
timer. Timers restored from it (:meth:`Engine.restore`) speak for a worker only until
that worker sends anything: its client re-sends the blocks it still has open, so the
restored ones are dropped first.

Statistics (:mod:`aiotimer.core._stats`): a timer released in time records its duration
(release time - acquire time) for its scope's site; an expiry records the time the timer
had run. An expired timer that is not reaped (report only, shadow mode) is remembered in
an :class:`~aiotimer.core._stats.Overdue` so that its late release still records the block's
real duration; a worker's exit forgets its overdue timers.

Everything here runs in the event loop's thread; thread-safety is the shell's business.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import anyio
import anyio.abc
import anyio.lowlevel

from aiotimer._edges.clock import Clock
from aiotimer.core._fold import fold
from aiotimer.core._latency import LatencyHistogram
from aiotimer.core._stats import DurationStats, Overdue, SiteSummary
from aiotimer.core._table import ReapOptions, Timer, TimerTable
from aiotimer.events import (
    MAX_REPORTED_SCOPES,
    Counters,
    Event,
    LoopLagged,
    RequestRejected,
    TimerAcquired,
    TimerExpired,
    TimerReleased,
    WorkerExited,
    WorkerUnknown,
)
from aiotimer.reapers._escalator import ReapRetry
from aiotimer.reapers._policy import ReapPolicy
from aiotimer.reapers._reaps import DUMP_SLACK, Reap, Reaps, Worker
from aiotimer.reapers._signal import Reaper
from aiotimer.reapers._steps import Step, format_plan
from aiotimer.server._journal import Journal
from aiotimer.sources._base import Drain
from aiotimer.wire import Decoded, Request

__all__ = [
    "DUMP_SLACK",
    "EXPIRE_BUDGET",
    "LAG_THRESHOLD",
    "MAX_TIMERS",
    "MAX_TIMERS_PER_WORKER",
    "Counters",
    "Engine",
    "ReapRetry",
]

logger = logging.getLogger("aiotimer")

#: Default :attr:`Engine.lag_threshold`: expiries handled later than this (seconds) are
#: reported as :class:`~aiotimer.events.LoopLagged`.
LAG_THRESHOLD = 0.1
#: The most work the sources' drains may do applying input that may concern the workers
#: due before their expiry is acted on: seconds of the loop thread's CPU time
#: (``time.thread_time``), not of wall time, so a server starved of CPU (a loaded host)
#: still applies the releases already written before it kills. Input that names none of
#: them costs only the drains' scan, never this budget.
DRAIN_BUDGET = 0.005
#: The most drain steps before one expiry (a bound also where the clock stands still).
MAX_DRAIN_CALLS = 256

#: The most heap entries (expired or stale) one expiry slice handles; the expiry task
#: lets the loop run other work between slices, so however many timers fall due at once,
#: nobody waits for more than one slice (~1-2 ms).
EXPIRE_BUDGET = 1024
#: Default cap on live timers in all; acquires past it are rejected.
MAX_TIMERS = 1_000_000
#: Default cap on one worker's live timers; its acquires past it are rejected.
MAX_TIMERS_PER_WORKER = 100_000


def _safely(call: Callable[..., bool], *args: object) -> bool:
    """``call(*args)``; ``False`` (logged) if it raised: a broken drain skips its turn."""
    try:
        return call(*args)
    except Exception:
        logger.exception("draining a source before an expiry failed")
        return False


@dataclass(slots=True, eq=False)
class _Begun:
    """A reap begun in the current expiry slice, and the timers it covers so far."""

    reap: Reap
    scopes: list[str]
    folded: int = 0  # timers of the same slice beyond those listed


def _known_due(timer: Timer) -> float:
    """When the server could first act on ``timer``: its deadline, or its arrival when
    it arrived already past its deadline (the loop is not late for a request that was).
    Loop lag and reap latency run from here; :attr:`TimerExpired.late` from the deadline.
    """
    return max(timer.deadline, timer.acquired_at)


class Engine:
    """One run of the server: table, workers, expiry and reaps (see the module docs)."""

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
        self.counts = Counters()
        self.stats = DurationStats()
        self.overdue = Overdue()
        self.last_progress: float | None = None
        self._tg = task_group
        self._clock = clock
        self._reaper = reaper
        self._policy = policy
        self._emit = emit
        self._request_events = request_events
        self._own_pid = os.getpid()
        self._workers: dict[int, Worker] = {}
        self._reaps = Reaps(
            task_group=task_group,
            clock=clock,
            reaper=reaper,
            emit=emit,
            counts=self.counts,
            retry=retry,
            confirm=policy.unkillable_after,
            self_kill=self_kill_after_reap,
            on_gone=self._worker_gone,
        )
        #: Deadline -> first delivered signal of each reap, seconds.
        self.reap_latency = self._reaps.latency
        #: How late each batch of expiries was handled (the loop was busy), seconds.
        self.loop_lag = LatencyHistogram()
        #: A lag above this many seconds is reported as a LoopLagged event.
        self.lag_threshold = LAG_THRESHOLD
        self._armed = -math.inf  # the deadline the expiry task sleeps until
        self._sleep_scope: anyio.CancelScope | None = None
        self._journal = journal
        self._max_timers = max_timers
        self._max_per_worker = max_timers_per_worker
        self._restored: dict[int, set[str]] = {}  # journal timers, until the worker speaks
        self._drains: list[Drain] = []
        self._draining = False

    # -- ingest (RequestSink) ----------------------------------------------------------

    def submit(self, batch: Decoded, source: str) -> None:
        """Apply ``batch``: every request in order, then one event per rejection."""
        clock = self._clock
        mono, wall = clock.monotonic(), clock.time()
        self.last_progress = mono
        requests = batch.requests
        self.counts.requests += len(requests)
        if len(requests) > 1 and not self._request_events:
            self._apply_folded(requests, source, mono, wall)
        else:
            for req in requests:
                self._apply(req, source, mono, wall)
        for rej in batch.rejections:
            self.counts.rejected += 1
            text = rej.line.decode("ascii", "backslashreplace")
            self._emit(RequestRejected(time=wall, reason=rej.reason, line=text, source=source))
        deadline = self.table.next_deadline(budget=EXPIRE_BUDGET)
        if deadline is not None and deadline <= (now := clock.monotonic()):
            self._expire_due(now)  # it fell while the loop was busy (with this batch, say)

    def restore(self, requests: Sequence[Request], source: str) -> None:
        """Apply acquires restored from the journal (see the module docs)."""
        batch = Decoded(requests=list(requests))
        self.submit(batch, source)
        for req in requests:
            if self.table.get(req.pid, req.scope_id) is not None:
                self._restored.setdefault(req.pid, set()).add(req.scope_id)

    def _apply_folded(
        self, requests: Sequence[Request], source: str, mono: float, wall: float
    ) -> None:
        """Apply a batch as its requests one by one; a block whose acquire and release
        are both in it never reaches the table (see :mod:`aiotimer.core._fold`): it is
        counted, and its duration (zero: both arrived now) recorded once per scope.
        Near a cap, where the order of the table's changes matters, the requests are
        applied one by one."""
        folded = fold(requests)
        table = self.table
        if not self._far_from_caps(folded.pids(), len(requests)):
            for req in requests:
                self._apply(req, source, mono, wall)
            return
        pairs = folded.pairs
        counts = self.counts
        counts.released += pairs
        counts.acquired += pairs + folded.superseded
        # What the folded requests do to the state before the batch, before the applied
        # requests: nothing of those keys comes first (see aiotimer.core._fold), and far
        # from the caps nothing else can tell the order.
        restored, overdue, journal = self._restored, self.overdue, self._journal
        for pid in folded.pids():
            if restored and pid in restored:
                self._drop_restored(pid)
            live = table.worker_size(pid)
            if not (live or overdue):
                continue
            scopes = folded.scopes(pid)
            if live < len(scopes) and not overdue:
                scopes = table.live_scopes(pid)  # fewer to look at
            for scope_id in [s for s in scopes if folded.ends(pid, s)]:
                if overdue:
                    overdue.pop((pid, scope_id))
                if table.release(pid, scope_id) is not None and journal is not None:
                    journal.released(pid, scope_id)
        for i in folded.apply:
            self._apply(requests[i], source, mono, wall)
        self.stats.record_many(folded.paired, 0.0)

    def _far_from_caps(self, pids: Iterable[int], size: int) -> bool:
        """Whether no acquire of a batch of ``size`` requests naming ``pids`` can meet
        a cap, however the batch is applied (each acquire adds at most one timer)."""
        table = self.table
        return len(table) + size <= self._max_timers and all(
            table.worker_size(pid) + size <= self._max_per_worker for pid in pids
        )

    def _apply(self, req: Request, source: str, mono: float, wall: float) -> None:
        if self._restored and req.pid in self._restored:
            self._drop_restored(req.pid)
        if req.is_release:
            released = self.table.release(req.pid, req.scope_id)
            if released is not None:
                if self._journal is not None:
                    self._journal.released(req.pid, req.scope_id)
                self.counts.released += 1
                self.stats.record(req.scope_id, max(0.0, mono - released.acquired_at))
                if self._request_events:
                    self._emit(
                        TimerReleased(time=wall, pid=req.pid, scope_id=req.scope_id, source=source)
                    )
            elif self.overdue:
                acquired_at = self.overdue.pop((req.pid, req.scope_id))
                if acquired_at is not None:  # the late end of an expired, unreaped block
                    self.stats.record(req.scope_id, max(0.0, mono - acquired_at))
            return
        pid = req.pid
        if self.overdue:
            self.overdue.pop((pid, req.scope_id))  # re-acquired: that block's end is unknown
        if (
            pid not in self._workers
            and pid != self._own_pid
            and not self._attach(pid, req.start_time)
        ):
            self._emit(WorkerUnknown(time=wall, pid=pid, scope_id=req.scope_id, source=source))
            return
        if (
            len(self.table) >= self._max_timers
            or self.table.worker_size(pid) >= self._max_per_worker
        ) and self.table.get(pid, req.scope_id) is None:
            self._reject_over_cap(req, source, wall)
            return
        deadline = req.deadline(mono, wall)
        options = None
        if req.grace is not None or req.group or req.dump:
            options = ReapOptions(req.grace, req.group, req.dump)
        timer = Timer(pid, req.scope_id, deadline, req.signal, mono, options)
        self.table.acquire(timer)
        if self._journal is not None:
            self._journal.acquired(timer)
        self.counts.acquired += 1
        if deadline < self._armed and self._sleep_scope is not None:
            self._armed = -math.inf
            self._sleep_scope.cancel()
        if self._request_events:
            self._emit(
                TimerAcquired(
                    time=wall,
                    pid=pid,
                    scope_id=req.scope_id,
                    expires_in=deadline - mono,
                    signal=req.signal,
                    source=source,
                )
            )

    def _reject_over_cap(self, req: Request, source: str, wall: float) -> None:
        if len(self.table) >= self._max_timers:
            reason = (
                f"timer cap reached: the server holds {len(self.table):,} timers "
                f"(max_timers={self._max_timers:,}); release timers or raise the cap"
            )
        else:
            reason = (
                f"timer cap reached: worker {req.pid} holds {self.table.worker_size(req.pid):,} "
                f"timers (max_timers_per_worker={self._max_per_worker:,}); it leaks timers, "
                "or raise the cap"
            )
        self.counts.rejected += 1
        line = f"acquire {req.scope_id!r} of pid {req.pid}"[:200]
        self._emit(RequestRejected(time=wall, reason=reason, line=line, source=source))

    def _drop_restored(self, pid: int) -> None:
        """Worker ``pid`` spoke: drop the timers the journal restored for it."""
        for scope_id in self._restored.pop(pid, ()):
            if self.table.release(pid, scope_id) is not None and self._journal is not None:
                self._journal.released(pid, scope_id)

    # -- workers ----------------------------------------------------------------------

    def _attach(self, pid: int, start_time: int | None) -> bool:
        try:
            attached = self._pin(pid, start_time)
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                logger.exception("reaper.attach(%d) raised; treating the worker as unknown", pid)
                return False
            # Out of descriptors is the server's failure, not the worker's: keep its
            # timers, say so loudly, and pin it again when one expires.
            self._out_of_descriptors(pid, exc)
            self._workers[pid] = Worker(pid, pinned=False, start_time=start_time)
            return True
        except Exception:
            logger.exception("reaper.attach(%d) raised; treating the worker as unknown", pid)
            return False
        if attached:
            worker = self._workers[pid] = Worker(pid)
            self._tg.start_soon(self._watch, worker, name=f"aiotimer-watch-{pid}")
        return attached

    def _pin(self, pid: int, start_time: int | None) -> bool:
        # start_time only when the request has one: older reapers lack the keyword.
        if start_time is None:
            return self._reaper.attach(pid)
        return self._reaper.attach(pid, start_time=start_time)

    def _repin(self, worker: Worker) -> bool:
        """Pin a worker whose attach ran out of descriptors; ``True`` if it now is."""
        try:
            attached = self._pin(worker.pid, worker.start_time)
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                self._out_of_descriptors(worker.pid, exc)
            else:
                logger.exception("reaper.attach(%d) raised", worker.pid)
            return False
        except Exception:
            logger.exception("reaper.attach(%d) raised", worker.pid)
            return False
        if not attached:  # it has gone meanwhile
            self._worker_gone(worker, "gone before signal")
            return False
        worker.pinned = True
        self._tg.start_soon(self._watch, worker, name=f"aiotimer-watch-{worker.pid}")
        return True

    @staticmethod
    def _out_of_descriptors(pid: int, exc: OSError) -> None:
        logger.critical(
            "out of file descriptors (%s) pinning worker %d: its identity cannot be "
            "proven, so it cannot be signalled until a descriptor is free. Raise the "
            "open-file limit (ulimit -n; the server raises the soft limit to the "
            "hard one) or run fewer workers per server",
            exc.strerror,
            pid,
        )

    async def _watch(self, worker: Worker) -> None:
        if worker.gone:
            return
        with anyio.CancelScope() as worker.watch:
            try:
                await self._reaper.wait_exit(worker.pid)
            except Exception:
                logger.exception("reaper.wait_exit(%d) raised; worker exit unwatched", worker.pid)
                return
            self._worker_gone(worker, "exited")

    def _worker_gone(self, worker: Worker, reason: str) -> None:
        if worker.gone:
            return
        worker.gone = True
        if worker.exited is not None:
            worker.exited.set()
        if worker.watch is not None:
            worker.watch.cancel()
        if self._workers.get(worker.pid) is worker:
            del self._workers[worker.pid]
        self._detach(worker.pid)
        self.counts.workers_exited += 1
        count, cleared = self.table.drop_worker(worker.pid, sample=MAX_REPORTED_SCOPES)
        self._restored.pop(worker.pid, None)
        if self._journal is not None:
            self._journal.forget(worker.pid)
        if self.overdue:
            self.overdue.clear_worker(worker.pid)
        self._emit(
            WorkerExited(
                time=self._clock.time(),
                pid=worker.pid,
                cleared=tuple(cleared),
                reason=reason,
                omitted=count - len(cleared),
            )
        )

    def _detach(self, pid: int) -> None:
        try:
            self._reaper.detach(pid)
        except Exception:
            logger.exception("reaper.detach(%d) raised", pid)

    def close(self) -> None:
        """Detach every remaining worker (the run is over; its tasks are cancelled)."""
        for pid in list(self._workers):
            del self._workers[pid]
            self._detach(pid)

    def workers(self) -> tuple[int, ...]:
        """The pids of the watched workers."""
        return tuple(self._workers)

    def is_reaping(self, pid: int) -> bool:
        """Whether a reap of worker ``pid`` is in progress."""
        worker = self._workers.get(pid)
        return worker is not None and worker.reaping

    def snapshot(self) -> tuple[tuple[Timer, ...], tuple[int, ...]]:
        """The live timers (in deadline order) and the watched workers' pids."""
        return self.table.snapshot(), tuple(self._workers)

    def scope_stats(self) -> tuple[SiteSummary, ...]:
        """The duration statistics of every scope site (see :mod:`aiotimer.core._stats`)."""
        return tuple(self.stats.summaries())

    def _expire_unpinned(self, timer: Timer, now: float) -> None:
        """A timer of a worker still unpinned (out of descriptors) expired: report it,
        signal nothing (a pid alone may name another process by now)."""
        self.stats.record_expired(timer.scope_id, max(0.0, now - timer.acquired_at))
        self._report_expiry(
            timer,
            now,
            report_only=True,
            action="nothing: the server ran out of file descriptors and cannot prove "
            "the worker's identity (see the log)",
        )

    def _report_expiry(self, timer: Timer, now: float, *, report_only: bool, action: str) -> None:
        """Emit the :class:`~aiotimer.events.TimerExpired` event of ``timer``."""
        self._emit(
            TimerExpired(
                time=self._clock.time(),
                pid=timer.pid,
                scope_id=timer.scope_id,
                signal=timer.signal,
                late=now - timer.deadline,
                report_only=report_only,
                action=action,
            )
        )

    # -- expiry -----------------------------------------------------------------------

    async def run_expiry(self) -> None:
        """Sleep until the next deadline (or a re-arm), then handle what expired; forever."""
        table, clock = self.table, self._clock
        while True:
            deadline = table.next_deadline(budget=EXPIRE_BUDGET)
            now = clock.monotonic()
            if deadline is not None and deadline <= now:
                self._expire_due(now)
                await anyio.lowlevel.checkpoint()  # one slice at a time
                continue
            with anyio.CancelScope() as scope:
                self._sleep_scope = scope
                if deadline is None:
                    self._armed = math.inf
                    await anyio.sleep_forever()
                else:
                    self._armed = deadline
                    await clock.sleep_until(deadline)
            self._sleep_scope = None
            self._armed = -math.inf
            self.counts.wakeups += 1
            self.last_progress = clock.monotonic()

    def _drain_sources(self, now: float) -> None:
        """Apply what the sources hold that may concern the workers due at ``now`` (see
        the module docs), the drains a step at a time in turn, for at most
        ``DRAIN_BUDGET`` seconds of this thread's CPU time (a flood of input must not
        hold up the reaps; wall time would run out while the host runs other processes,
        and leave releases written before the deadline unread)."""
        if not self._drains:
            return
        looked: set[int] | None = set()  # None: looked for anyone
        stop_at = time.thread_time() + DRAIN_BUDGET
        calls = 0
        while looked is not None and calls < MAX_DRAIN_CALLS:
            due = self.table.due_pids(now, limit=EXPIRE_BUDGET)
            if due is None:  # too many due to name: look for anyone, once
                looked = None
            else:
                due -= looked
                if not due:
                    return
                looked |= due
            pending = [drain for drain in self._drains if _safely(drain.look, due)]
            while pending and calls < MAX_DRAIN_CALLS:
                for drain in tuple(pending):
                    calls += 1
                    if not _safely(drain.step):
                        pending.remove(drain)
                if time.thread_time() >= stop_at:
                    return

    def add_drain(self, drain: Drain) -> Callable[[], None]:
        """Run ``drain`` before every expiry (see :mod:`aiotimer.sources._base`); returns
        the function that removes it."""
        self._drains.append(drain)
        return lambda: self._drains.remove(drain)

    def _expire_due(self, now: float) -> None:
        """Handle the timers due at ``now``, in deadline order (one slice of them), once
        the sources' input that may concern them is applied: a release that arrived
        before a deadline (written while this loop stalled) wins over it."""
        if self._draining:
            return  # a drain submitted a batch: the outer call expires once all are drained
        self._draining = True
        try:
            self._drain_sources(now)
        finally:
            self._draining = False
        self.last_progress = now
        begun: dict[int, _Begun] = {}
        journal = self._journal
        expired = self.table.pop_expired(now, budget=EXPIRE_BUDGET)
        for timer in expired:
            if journal is not None:
                journal.released(timer.pid, timer.scope_id)
            started = begun.get(timer.pid)
            if started is not None:  # folded into the reap this slice began
                self.counts.expired += 1
                self.stats.record_expired(timer.scope_id, max(0.0, now - timer.acquired_at))
                if len(started.scopes) < MAX_REPORTED_SCOPES:
                    started.scopes.append(timer.scope_id)
                else:
                    started.folded += 1
                continue
            reap = self._expire(timer, now)
            if reap is not None:
                begun[timer.pid] = _Begun(reap, [timer.scope_id])
        for pid, started in begun.items():
            left = MAX_REPORTED_SCOPES - len(started.scopes)
            count, others = self.table.drop_worker(pid, sample=left)
            self._restored.pop(pid, None)
            if journal is not None:
                journal.cleared(pid)
            scopes = (*started.scopes, *others)
            omitted = started.folded + count - len(others)
            self._reaps.proceed(started.reap, scopes, omitted)
        if expired:
            lag = now - _known_due(expired[0])
            self.loop_lag.observe(lag)
            if lag > self.lag_threshold:
                self._emit(LoopLagged(time=self._clock.time(), lag=lag, expired=len(expired)))

    def _expire(self, timer: Timer, now: float) -> Reap | None:
        """Report ``timer``'s expiry; the reap it begins, if it begins one."""
        self.counts.expired += 1
        worker = self._workers.get(timer.pid)
        if worker is not None and not worker.pinned and not self._repin(worker):
            if not worker.gone:
                self._expire_unpinned(timer, now)
            return None
        policy = self._policy
        plan: Sequence[Step] = () if worker is None else policy.plan(timer)
        reap: Reap | None = None
        if plan and worker is not None and not worker.reaping:
            # Start the reap first: its first signal leaves right here, at the deadline.
            reap = self._reaps.begin(worker, plan, now, _known_due(timer))
        self.stats.record_expired(timer.scope_id, max(0.0, now - timer.acquired_at))
        if not plan:  # the block runs on: its release will tell how long it took
            self.overdue.add(timer.key, timer.acquired_at)
        if plan:
            action = format_plan(plan)
        elif worker is None and timer.signal > 0:
            action = "nothing: the server never signals its own process"
        elif policy.shadow and timer.signal > 0:
            action = "nothing (shadow mode); would do: " + format_plan(policy.intended(timer))
        else:
            action = format_plan(plan)
        self._report_expiry(timer, now, report_only=not plan, action=action)
        return reap  # None: report only, or the reap in progress covers this timer too
