"""The server's engine: one run of a :class:`~aiotimer.server.TimerServer`, in its loop.

How this works
--------------
The engine is the shell around one pure machine (:mod:`aiotimer.server._machine`), which
owns the run's timer table, quota, counters and statistics and decides everything: the
engine feeds it its inputs (batches, the clock, workers pinned or gone, the drains'
input) and carries out the effects it returns (:mod:`aiotimer.server._effects`), in
order, answering its questions as it goes:

* *pin* a worker: the watchlist (:mod:`aiotimer.reapers._watch`) attaches it, and its
  user is read from ``/proc``;
* *act on* an expired timer: pin its worker again if it is unpinned, begin its reap
  (:mod:`aiotimer.reapers._reaps`: a first signal leaves right here), and say how it
  went; *proceed* with a reap once its expiry is reported;
* *need input*: the sources' drains (:mod:`aiotimer.server._drains`) are stepped through
  what they hold for the workers named, a few milliseconds of CPU per turn of the loop,
  each batch handed to the machine; the answer follows once they are done;
* journal changes go to the journal (:mod:`aiotimer.server._journal`), events to
  ``emit``, the alarm's deadline to the alarm.

Sources hand their batches to :meth:`Engine.submit` (the engine is their
:class:`~aiotimer.sources.RequestSink`): the machine applies the batch, then the engine
ticks it, so that the deadlines that fell meanwhile are handled (:meth:`Engine.catch_up`).
A drain never calls ``submit``: it returns what to apply, and the engine hands it to the
machine, so a drained batch never leads back into an expiry. One task
(:meth:`Engine.run_expiry`) waits on an alarm (:func:`~aiotimer._edges.clock.open_alarm`)
set to the next deadline (never, when there is none). There is no polling interval: an
idle engine makes no wake-ups (``ServerCounters.wakeups`` counts them). The alarm never
goes off before its deadline. With the production clock, re-setting it is one
``timerfd_settime`` and wakes nobody.

When a worker goes (it exited, or a signal found it gone), the engine first applies
what the drains hold for it (its last releases come before its exit, however late a
trickle is read; best effort, for :data:`~aiotimer.server._drains.DRAIN_SLICE` of CPU
time, skipped while a decision is in progress), then tells the machine, which clears
its timers. Timers restored from the journal (:meth:`Engine.restore`) are applied like
a batch, then speak for their worker only until it sends anything.

Everything here runs in the event loop's thread; thread-safety is the shell's business.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import anyio.abc
import anyio.lowlevel

from aiotimer._edges.clock import Alarm, Clock, open_alarm
from aiotimer._edges.procfs import read_status
from aiotimer.core import DurationStats, LatencyHistogram, Overdue, ScopeStats, Timer, TimerTable
from aiotimer.events import Event, ServerCounters
from aiotimer.reapers import (
    DUMP_SLACK,
    Reap,
    Reaper,
    ReapPolicy,
    ReapRetry,
    Reaps,
    Watchlist,
    WatchState,
)
from aiotimer.server._drains import Drains, stop_at
from aiotimer.server._effects import (
    Acted,
    ActOn,
    Arm,
    JournalAcquired,
    JournalCleared,
    JournalForgot,
    JournalReleased,
    NeedInput,
    Pin,
    ProceedReap,
)
from aiotimer.server._ingest import MAX_TIMERS, MAX_TIMERS_PER_WORKER
from aiotimer.server._journal import Journal
from aiotimer.server._learning import Learning
from aiotimer.server._machine import EXPIRE_BUDGET, LAG_THRESHOLD, Machine
from aiotimer.sources import Drain
from aiotimer.wire import Decoded, Request

if TYPE_CHECKING:
    from aiotimer.server._effects import Effect


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


def _uid_of(pid: int) -> int | None:
    """The real uid of process ``pid``, whose timers count against that user's share
    (see :mod:`aiotimer.server._quota`); ``None`` when ``/proc`` cannot tell."""
    try:
        status = read_status(pid)
    except OSError:
        return None
    return None if status is None else status.uid


class Engine:
    """One run of the server: the machine and what carries out its effects (see the
    module docs)."""

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
        self._machine = machine = Machine(
            policy=policy,
            own_pid=os.getpid(),
            own_uid=os.getuid(),
            journal=journal is not None,
            request_events=request_events,
            max_timers=max_timers,
            max_timers_per_worker=max_timers_per_worker,
        )
        self.table: TimerTable = machine.table
        self.counts: ServerCounters = machine.counts
        self.stats: DurationStats = machine.stats
        self.overdue: Overdue = machine.overdue
        self.learning: Learning = machine.learning
        #: How late each slice of expiries was handled (the loop was busy), seconds.
        self.loop_lag: LatencyHistogram = machine.loop_lag
        self._clock = clock
        self._emit = emit
        self._journal = journal
        self._watchlist = Watchlist(task_group=task_group, reaper=reaper, on_gone=self._gone)
        self._reaps = Reaps(
            task_group=task_group,
            clock=clock,
            reaper=reaper,
            emit=emit,
            counts=machine.counts,
            retry=retry,
            confirm=policy.unkillable_after,
            self_kill=self_kill_after_reap,
            on_gone=self._watchlist.gone,
        )
        #: Deadline -> first delivered signal of each reap, seconds.
        self.reap_latency = self._reaps.latency
        self._begun: dict[int, Reap] = {}  # reaps begun, until they proceed
        self._drains = Drains()
        self._alarm: Alarm | None = None  # while the expiry task runs
        self._deadline = math.inf  # the alarm's deadline, as the machine last set it
        self._applying = False
        self._handling = False

    # -- input (RequestSink) ----------------------------------------------------------

    def submit(self, batch: Decoded, source: str) -> None:
        """Apply ``batch``: every request in order, then one event per rejection; then
        handle the deadlines that fell meanwhile."""
        self._applying = True
        try:
            clock = self._clock
            effects = self._machine.submit(batch, source, clock.monotonic(), clock.time())
            if effects:
                self._carry(effects)
            self._expire(clock.monotonic())
        finally:
            self._applying = False

    @property
    def busy(self) -> bool:
        """Whether the engine is applying a batch or handling expired timers right now:
        an event callback runs inside that work, so a request it submits must wait for
        the work to end (the shell hands it over) rather than cut into it."""
        return self._applying or self._handling

    def catch_up(self) -> None:
        """A batch was just applied: handle what has come due meanwhile (one slice, or
        a turn's share of a decision's input), and re-arm the alarm if the next
        deadline moved."""
        self._expire(self._clock.monotonic())

    def flush(self) -> None:
        """Apply what every source holds now, for any worker, then handle every deadline
        passed (see :meth:`~aiotimer.server.TimerServer.flush`)."""
        if self._handling:
            return
        self._handling = True
        try:
            self._drains.drain_all(self._apply)
        finally:
            self._handling = False
        now = self._clock.monotonic()
        while self._drains.passing or self._machine.due(now):
            if not self._expire(now, math.inf):
                break
        self.catch_up()

    def restore(self, requests: Sequence[Request], source: str) -> int:
        """Apply acquires restored from the journal (see the module docs); return how
        many timers they set (a worker that cannot be pinned, or a cap, drops some)."""
        self.submit(Decoded(requests=list(requests)), source)
        return self._machine.mark_restored(requests)

    def add_drain(self, drain: Drain) -> Callable[[], None]:
        """Ask ``drain`` before every expiry (see :mod:`aiotimer.sources._base`); returns
        the function that removes it."""
        remove = self._drains.add(drain, hold=self._machine.deciding)
        self._machine.set_drains(len(self._drains))

        def removed() -> None:
            remove()
            self._machine.set_drains(len(self._drains))

        return removed

    # -- the run ----------------------------------------------------------------------

    async def run_expiry(self) -> None:
        """The expiry task: sleep until the next deadline, handle what expired; forever."""
        clock, machine = self._clock, self._machine
        with open_alarm(clock) as alarm:
            self._alarm = alarm
            if self._deadline != math.inf:
                alarm.set(self._deadline)
            try:
                while True:
                    now = clock.monotonic()
                    if not self._expire(now) or machine.due(now):
                        await anyio.lowlevel.checkpoint()  # one slice at a time
                        continue
                    await alarm.wait()
                    machine.woke(clock.monotonic())
            finally:
                self._alarm = None

    def close(self) -> None:
        """Detach every remaining worker (the run is over; its tasks are cancelled)."""
        self._watchlist.close()

    # -- carrying the machine's effects out -------------------------------------------

    def _apply(self, batch: Decoded, source: str) -> None:
        clock = self._clock
        self._carry(self._machine.submit(batch, source, clock.monotonic(), clock.time()))

    def _expire(self, now: float, slice_: float | None = None) -> bool:
        """Tick the machine at ``now`` and carry its decision on: ``False`` if its input
        is not all applied yet (``slice_`` seconds of CPU time, by default
        :data:`~aiotimer.server._drains.DRAIN_SLICE`, were spent on it in this call; the
        next call goes on with it) or this is inside that very work."""
        if self._handling:
            return False
        self._handling = True
        try:
            clock, machine, drains = self._clock, self._machine, self._drains
            if not drains.passing:
                effects = machine.tick(now, clock.time())
                if effects:
                    self._carry(effects)
                if not drains.passing:
                    return True
            until = stop_at(slice_)
            while drains.passing:
                if not drains.step(until, self._apply):
                    return False
                self._carry(machine.input_taken(now, clock.time()))
            return True
        finally:
            self._handling = False

    def _carry(self, effects: list[Effect]) -> None:
        """Carry ``effects`` out in order; a question (always last) is answered, and the
        effects of the answer carried out in turn."""
        journal = self._journal
        while effects:
            answer: list[Effect] = []
            for effect in effects:
                if isinstance(effect, JournalAcquired):
                    assert journal is not None
                    journal.acquired(effect.timer)
                elif isinstance(effect, JournalReleased):
                    assert journal is not None
                    journal.released(effect.pid, effect.scope_id)
                elif isinstance(effect, Arm):
                    self._deadline = effect.deadline
                    if self._alarm is not None:
                        self._alarm.set(effect.deadline)
                elif isinstance(effect, Pin):
                    answer = self._pin(effect)
                elif isinstance(effect, ActOn):
                    answer = self._act_on(effect)
                elif isinstance(effect, ProceedReap):
                    reap = self._begun.pop(effect.pid)
                    self._reaps.proceed(reap, effect.scopes, effect.omitted)
                elif isinstance(effect, NeedInput):
                    if effect.hold:
                        self._drains.hold()
                    self._drains.look(effect.pids)
                elif isinstance(effect, JournalCleared):
                    assert journal is not None
                    journal.cleared(effect.pid)
                elif isinstance(effect, JournalForgot):
                    assert journal is not None
                    journal.forget(effect.pid)
                else:
                    self._emit(effect)
            effects = answer

    def _pin(self, pin: Pin) -> list[Effect]:
        watchlist = self._watchlist
        if watchlist.attach(pin.pid, pin.start_time):
            worker = watchlist.get(pin.pid)
            unpinned = worker is not None and worker.state is WatchState.UNPINNED
            return self._machine.pinned(pin.pid, _uid_of(pin.pid), unpinned=unpinned)
        return self._machine.unattached(pin.pid)

    def _act_on(self, act: ActOn) -> list[Effect]:
        watchlist = self._watchlist
        worker = watchlist.get(act.timer.pid)
        if worker is None:
            how = Acted.UNWATCHED
        elif worker.state is WatchState.UNPINNED and not watchlist.pin_again(worker):
            how = Acted.GONE if worker.gone else Acted.UNPINNED
        elif act.plan and worker.state is WatchState.PINNED:
            # The reap begins first: its first signal leaves right here, at the deadline.
            reap = self._begun[worker.pid] = self._reaps.begin(worker, act.plan, act.now, act.due)
            how = Acted.REFUSED if reap.refused else Acted.BEGUN
        else:
            how = Acted.NOT_BEGUN
        return self._machine.acted(how)

    def _gone(self, pid: int, reason: str) -> None:
        """Worker ``pid`` has gone (the watchlist has forgotten it): apply what it wrote
        that the sources still hold, then tell the machine."""
        if not self.busy and not self._drains.passing:  # not inside the work that found it
            self._handling = True
            try:
                self._drains.hold()
                self._drains.look({pid})
                self._drains.step(stop_at(), self._apply)
                self._drains.end()
            finally:
                self._handling = False
        self._carry(self._machine.gone(pid, reason, self._clock.time()))

    # -- reads ------------------------------------------------------------------------

    @property
    def last_progress(self) -> float | None:
        """When the engine last applied a batch or handled its deadlines (monotonic)."""
        return self._machine.last_progress

    @property
    def lag_threshold(self) -> float:
        """Expiries handled later than this (seconds) are reported as
        :class:`~aiotimer.events.LoopLagged`."""
        return self._machine.lag_threshold

    @lag_threshold.setter
    def lag_threshold(self, seconds: float) -> None:
        self._machine.lag_threshold = seconds

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
