"""The engine's expiry: the task that sleeps until the next deadline and acts on it.

How this works
--------------
One task (:meth:`Expiry.run`) waits on an alarm (:func:`~aiotimer._edges.clock.open_alarm`)
set to the table's next deadline (never, when it is empty). There is no polling interval:
an idle engine makes no wake-ups (``ServerCounters.wakeups`` counts them). The alarm never
goes off before its deadline, so the task handles what is due as soon as it wakes. After
every batch the engine applies, :meth:`Expiry.catch_up` handles the deadlines that fell
while the loop was busy (with that batch, say), so that ingesting a burst of input does
not hold up an expiry, and sets the alarm again when the next deadline moved (earlier: an
acquire due sooner; later: the earliest timer was released). With the production clock
that is one ``timerfd_settime`` and wakes nobody, so the task wakes only for a deadline
that is still live.

Before acting on expired timers (:meth:`Expiry.expire_due`) the engine applies what the
sources held for their workers: *the rule* is that before a worker is acted on at
deadline ``D``, everything its transport held for it at ``D`` is applied, so a release
sent before the deadline always wins, even when this loop was stalled (a SIGSTOP, a GC
or VM pause) and wakes up after it: the stall is the server's lateness, not the
worker's. A :class:`~aiotimer.server._decision.Decision` is made at the instant the
expiry is handled; every source's *drain* (the protocol in
:mod:`aiotimer.sources._base`) bounds what it holds at that instant, and the decision
names the workers to look for (:meth:`~aiotimer.core._table.TimerTable.due_pids`, a
peek; anyone when more than :data:`EXPIRE_BUDGET` heap entries are due). The drains
return, a step at a time, what may concern them, and the engine applies it
(:class:`~aiotimer.server._ingest.Ingest`). Only input that names a due worker is
decoded and applied first; a FIFO flooded by other workers costs a byte scan of what the
pipe held, not its decoding (:mod:`aiotimer.wire._mentions`). Applying input may make
more timers due (an acquire that had expired already); their workers are looked for in
turn, within the same bounds. The timers due at the decision's instant are acted on once
every worker due was looked for and the drains are done: never before. The drains' work
is spread over turns of the loop, :data:`DRAIN_SLICE` of CPU time at most per turn: when
a turn's share is spent, :meth:`Expiry.expire_due` returns ``False`` and the next turn
(of the expiry task, or of :meth:`Expiry.catch_up` after a batch) carries the same
decision on. So the reap is late, never wrong, and late by at most what the drains had
to do with the input bounded at the decision, whatever arrives meanwhile: at most one
pipe-full's scan plus the decoding of the lines in it that name a due worker, for a
FIFO; the messages queued on a due worker's own connection, for a socket. Timers that
fall due meanwhile wait for the next decision, with bounds of their own.

Work per loop iteration is bounded: expired timers are popped in slices of
:data:`EXPIRE_BUDGET` heap entries, and the expiry task yields between slices.

Expired timers are handled in deadline order: the policy turns each into a plan
(:mod:`aiotimer.reapers._policy`). An empty plan is "report only". A plan whose first
signal is refused (the kill policy) is that timer's alone: its reap is abandoned and the
worker's other timers stay. Otherwise the worker's
other timers are dropped from the table at once (O(1): their heap entries go stale) and
the plan is carried out by :class:`~aiotimer.reapers._reaps.Reaps`, which takes the first
action right here (a first signal leaves at the deadline, before anything else is done
about the timer; its outcome is reported right after the
:class:`~aiotimer.events.TimerExpired` event) and the rest in one task per worker. Timers
of that worker falling due in the same slice are folded into the same reap: one
:class:`~aiotimer.events.TimerExpired` event for the first, and one
:class:`~aiotimer.events.WorkerReaped` listing the scopes it covers (at most
:data:`~aiotimer.events.MAX_REPORTED_SCOPES`, the rest counted), however many timers.
A worker still unpinned (:mod:`aiotimer.reapers._watch`) is pinned again first; if it
cannot be, its expiry is only reported.

Every slice records how late it was handled (:attr:`Expiry.loop_lag`); a lag above
:attr:`Expiry.lag_threshold` is reported as :class:`~aiotimer.events.LoopLagged`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

import anyio
import anyio.lowlevel

from aiotimer._edges.clock import Alarm, Clock, open_alarm
from aiotimer.core._latency import LatencyHistogram
from aiotimer.core._stats import DurationStats, Overdue
from aiotimer.core._table import Timer, TimerTable
from aiotimer.events import MAX_REPORTED_SCOPES, Event, LoopLagged, ServerCounters, TimerExpired
from aiotimer.reapers._policy import ReapPolicy
from aiotimer.reapers._reaps import Reap, Reaps
from aiotimer.reapers._steps import Step, format_plan
from aiotimer.reapers._watch import Watchlist, WatchState
from aiotimer.server._decision import Decision
from aiotimer.server._ingest import Ingest
from aiotimer.server._journal import Journal
from aiotimer.server._learning import Learning
from aiotimer.sources._base import Drain
from aiotimer.wire import Decoded

__all__ = ["DRAIN_SLICE", "EXPIRE_BUDGET", "LAG_THRESHOLD", "MAX_DRAIN_STEPS", "Expiry"]

logger = logging.getLogger("aiotimer")

#: Default :attr:`Expiry.lag_threshold`: expiries handled later than this (seconds) are
#: reported as :class:`~aiotimer.events.LoopLagged`.
LAG_THRESHOLD = 0.1
#: The most work the sources' drains do in one turn of the loop before an expiry:
#: seconds of the loop thread's CPU time (``time.thread_time``). Once it is spent, the
#: decision is carried on in the next turn, after the loop ran other work (the reap is
#: late, never wrong: nothing is acted on before its input is applied).
DRAIN_SLICE = 0.005
#: The most drain steps in one turn (a bound also where the clock stands still).
MAX_DRAIN_STEPS = 256
#: The most heap entries (expired or stale) one expiry slice handles; the expiry task
#: lets the loop run other work between slices, so however many timers fall due at once,
#: nobody waits for more than one slice (~1-2 ms).
EXPIRE_BUDGET = 1024


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


def _hold(drain: Drain) -> None:
    """``drain.hold()``; logged if it raised (its looks then go by its last bound)."""
    try:
        drain.hold()
    except Exception:
        logger.exception("draining %s before an expiry failed", drain.name)


def _look(drain: Drain, pids: AbstractSet[int] | None) -> bool:
    """``drain.look(pids)``; ``False`` (logged) if it raised: a broken drain skips its turn."""
    try:
        return drain.look(pids)
    except Exception:
        logger.exception("draining %s before an expiry failed", drain.name)
        return False


def _step(drain: Drain) -> Decoded | None:
    """``drain.step()``; ``None`` (logged) if it raised: a broken drain skips its turn."""
    try:
        return drain.step()
    except Exception:
        logger.exception("draining %s before an expiry failed", drain.name)
        return None


class Expiry:
    """One engine's expiry task, its drains and its reaps' start (see the module docs)."""

    def __init__(
        self,
        *,
        table: TimerTable,
        clock: Clock,
        counts: ServerCounters,
        stats: DurationStats,
        overdue: Overdue,
        journal: Journal | None,
        watchlist: Watchlist,
        reaps: Reaps,
        policy: ReapPolicy,
        emit: Callable[[Event], None],
        ingest: Ingest,
        learning: Learning,
    ) -> None:
        self._table = table
        self._clock = clock
        self._counts = counts
        self._stats = stats
        self._overdue = overdue
        self._journal = journal
        self._watchlist = watchlist
        self._reaps = reaps
        self._policy = policy
        self._emit = emit
        self._ingest = ingest
        self._learning = learning
        self._drains: list[Drain] = []
        self._decision: Decision | None = None  # the decision in progress
        self._pending: list[Drain] = []  # drains not done with its last look
        #: True while expired timers are being handled (see :attr:`Engine.busy`).
        self.handling = False
        self._alarm: Alarm | None = None  # while the task runs
        self._armed = math.inf  # the deadline the alarm is set to
        #: How late each slice of expiries was handled (the loop was busy), seconds.
        self.loop_lag = LatencyHistogram()
        #: A lag above this many seconds is reported as a LoopLagged event.
        self.lag_threshold = LAG_THRESHOLD
        #: When the engine last applied a batch or handled its deadlines (monotonic).
        self.last_progress: float | None = None

    def add_drain(self, drain: Drain) -> Callable[[], None]:
        """Ask ``drain`` before every expiry; returns the function that removes it."""
        self._drains.append(drain)
        if self._decision is not None:  # a decision in progress bounds it too
            _hold(drain)

        def remove() -> None:
            self._drains.remove(drain)
            if drain in self._pending:
                self._pending.remove(drain)

        return remove

    async def run(self) -> None:
        """Sleep until the next deadline (re-armed as it moves), then handle what
        expired; forever."""
        table, clock = self._table, self._clock
        with open_alarm(clock) as alarm:
            self._alarm = alarm
            try:
                while True:
                    deadline = table.next_deadline(budget=EXPIRE_BUDGET)
                    now = clock.monotonic()
                    if deadline is not None and deadline <= now:
                        self.expire_due(now)
                        await anyio.lowlevel.checkpoint()  # one slice at a time
                        continue
                    self._arm(math.inf if deadline is None else deadline)
                    await alarm.wait()
                    self._counts.wakeups += 1
                    self.last_progress = clock.monotonic()
            finally:
                self._alarm = None

    def _arm(self, deadline: float) -> None:
        """Set the alarm to ``deadline`` if it moved (see the module docs)."""
        if deadline != self._armed and self._alarm is not None:
            self._armed = deadline
            self._alarm.set(deadline)

    def catch_up(self) -> None:
        """A batch was just applied: handle what has come due meanwhile (one slice), and
        re-arm the alarm if the next deadline moved."""
        now = self.last_progress = self._clock.monotonic()
        deadline = self._table.next_deadline(budget=EXPIRE_BUDGET)
        if deadline is not None and deadline <= now:
            self.expire_due(now)
            deadline = self._table.next_deadline(budget=EXPIRE_BUDGET)
        self._arm(math.inf if deadline is None else deadline)

    def flush(self) -> None:
        """A synchronous round (:meth:`~aiotimer.server.TimerServer.flush`): apply what
        every drain holds now, for any worker, then handle every timer due, and re-arm
        the task."""
        if self.handling:
            return
        self.handling = True
        try:
            drains = tuple(self._drains)
            for drain in drains:
                _hold(drain)
            for drain in drains:
                if _look(drain, None):
                    while (batch := _step(drain)) is not None:
                        if batch.requests or batch.rejections:
                            self._ingest.apply(batch, drain.name)
        finally:
            self.handling = False
        now = self._clock.monotonic()
        while (deadline := self._table.next_deadline(budget=EXPIRE_BUDGET)) is not None:
            if deadline > now or not self.expire_due(now, slice_=math.inf):
                break
        self.catch_up()

    def expire_due(self, now: float, *, slice_: float | None = None) -> bool:
        """Handle the timers due at ``now``, in deadline order (one slice of them), once
        the sources' input that may concern them is applied: a release that reached a
        source before a deadline (written while this loop stalled) wins over it.

        ``False``: the input is not all applied yet (``slice_`` seconds of CPU time,
        :data:`DRAIN_SLICE` by default, were spent on it in this call); nothing was
        acted on, and the next call goes on with the same decision."""
        if self.handling:  # inside this very work (a drained batch's event): it goes on
            return False
        self.handling = True
        try:
            return self._expire_due(now, DRAIN_SLICE if slice_ is None else slice_)
        finally:
            self.handling = False

    def _expire_due(self, now: float, slice_: float) -> bool:
        at = now
        if self._drains or self._decision is not None:
            decision = self._decision
            if decision is None:
                decision = self._decision = Decision(now)
                for drain in tuple(self._drains):
                    _hold(drain)
            if not self._drain(decision, time.thread_time() + slice_):
                return False
            self._decision = None
            at = decision.at
        self.last_progress = now
        begun: dict[int, _Begun] = {}
        journal = self._journal
        expired = self._table.pop_expired(at, budget=EXPIRE_BUDGET)
        for timer in expired:
            if journal is not None:
                journal.released(timer.pid, timer.scope_id)
            started = begun.get(timer.pid)
            if started is not None:  # folded into the reap this slice began
                self._counts.expired += 1
                self._stats.record_expired(timer.scope_id, max(0.0, now - timer.acquired_at))
                if len(started.scopes) < MAX_REPORTED_SCOPES:
                    started.scopes.append(timer.scope_id)
                else:
                    started.folded += 1
                continue
            reap = self._expire(timer, now)
            if reap is not None and reap.refused:  # a refused timer abandons only itself
                self._reaps.proceed(reap, (timer.scope_id,))
            elif reap is not None:
                begun[timer.pid] = _Begun(reap, [timer.scope_id])
        for pid, started in begun.items():
            left = MAX_REPORTED_SCOPES - len(started.scopes)
            count, others = self._table.drop_worker(pid, sample=left)
            self._ingest.forget(pid)
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
        return True

    def drain_for(self, pids: set[int]) -> None:
        """Apply what the drains hold that may concern ``pids`` (workers that have gone:
        the lines they wrote come before their exit, however late a trickle is read),
        for at most :data:`DRAIN_SLICE` of CPU time. Best effort: a gone worker's timers
        are cleared whatever it wrote; this only gets its last releases right. Skipped
        while a decision is in progress (its drains are in the middle of a pass)."""
        if self.handling or self._decision is not None:
            return
        self.handling = True
        try:
            for drain in tuple(self._drains):
                _hold(drain)
            self._pending = [drain for drain in self._drains if _look(drain, pids)]
            self._step_pending(time.thread_time() + DRAIN_SLICE)
            self._pending = []
        finally:
            self.handling = False

    def _step_pending(self, stop_at: float) -> bool:
        """Step the pending drains in turn, applying what they return, until they are
        done (``True``), or this turn's work is spent (``False``): this thread's CPU
        clock reached ``stop_at`` or :data:`MAX_DRAIN_STEPS` steps were taken."""
        pending = self._pending
        steps = 0
        while pending:
            for drain in tuple(pending):
                steps += 1
                batch = _step(drain)
                if batch is None:
                    if drain in pending:
                        pending.remove(drain)
                elif batch.requests or batch.rejections:
                    self._ingest.apply(batch, drain.name)
            if pending and (steps >= MAX_DRAIN_STEPS or time.thread_time() >= stop_at):
                return False
        return True

    def _drain(self, decision: Decision, stop_at: float) -> bool:
        """Carry ``decision`` on (see :mod:`aiotimer.server._decision`): step the drains
        through what they hold for the workers it looks for, applying what they return,
        until it says act (``True``) or this turn's work is spent (``False``)."""
        while True:
            if not self._step_pending(stop_at):
                return False
            look = decision.next(self._table.due_pids(decision.at, limit=EXPIRE_BUDGET))
            if look is None:
                return True
            self._pending = [drain for drain in self._drains if _look(drain, look.pids)]

    def _expire(self, timer: Timer, now: float) -> Reap | None:
        """Report ``timer``'s expiry; the reap it begins, if it begins one."""
        self._counts.expired += 1
        worker = self._watchlist.get(timer.pid)
        if (
            worker is not None
            and worker.state is WatchState.UNPINNED
            and not self._watchlist.pin_again(worker)
        ):
            if not worker.gone:
                self._expire_unpinned(timer, now)
            return None
        policy = self._policy
        plan: Sequence[Step] = () if worker is None else policy.plan(timer)
        reap: Reap | None = None
        if plan and worker is not None and worker.state is WatchState.PINNED:
            # Start the reap first: its first signal leaves right here, at the deadline.
            reap = self._reaps.begin(worker, plan, now, _known_due(timer))
        self._stats.record_expired(timer.scope_id, max(0.0, now - timer.acquired_at))
        if not plan:  # the block runs on: its release will tell how long it took
            self._overdue.add(timer.key, timer.acquired_at)
        if plan:
            action = format_plan(plan)
        elif worker is None and timer.signal > 0:
            action = "nothing: the server never signals its own process"
        elif policy.shadow and timer.signal > 0:
            action = "nothing (shadow mode); would do: " + format_plan(policy.intended(timer))
        else:
            action = format_plan(plan)
        self._report(timer, now, report_only=not plan, action=action)
        return reap  # None: report only, or the reap in progress covers this timer too

    def _expire_unpinned(self, timer: Timer, now: float) -> None:
        """A timer of a worker still unpinned (out of descriptors) expired: report it,
        signal nothing (a pid alone may name another process by now)."""
        self._stats.record_expired(timer.scope_id, max(0.0, now - timer.acquired_at))
        self._report(
            timer,
            now,
            report_only=True,
            action="nothing: the server ran out of file descriptors and cannot prove "
            "the worker's identity (see the log)",
        )

    def _report(self, timer: Timer, now: float, *, report_only: bool, action: str) -> None:
        """Emit the :class:`~aiotimer.events.TimerExpired` event of ``timer``."""
        learned, samples = self._learning.expired(timer) or (None, 0)
        self._emit(
            TimerExpired(
                time=self._clock.time(),
                pid=timer.pid,
                scope_id=timer.scope_id,
                signal=timer.signal,
                late=now - timer.deadline,
                report_only=report_only,
                action=action,
                kill_after=timer.kill_after,
                learned=learned,
                learned_samples=samples,
            )
        )
