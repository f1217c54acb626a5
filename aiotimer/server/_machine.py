"""The server's engine as one pure machine: inputs in, effects out. No I/O, no clock.

How this works
--------------
The :class:`Machine` owns one run's timer table (:class:`~aiotimer.core._table.TimerTable`),
its quota (:mod:`aiotimer.server._quota`), counters and statistics, and its mirror of
the workers pinned. Every input is a method; each returns the effects to carry out, in
order (:mod:`aiotimer.server._effects`): events to emit, journal changes, reaps to
carry on, the alarm to set, and at most one *question*, last, which must be answered
before the machine takes anything but the input it asks for. The shell
(:class:`~aiotimer.server._engine.Engine`) carries the effects out and feeds the
answers back, in a loop like the one that drives
:class:`~aiotimer.reapers._escalator.Escalator`.

Inputs (``now`` is the monotonic clock, ``wall`` the wall clock, both read by the shell):

=================================  ======================================================
input                              what the machine does, and the effects it returns
=================================  ======================================================
:meth:`~Machine.submit` (batch)    prepares it (:mod:`aiotimer.server._ingest`); asks
                                   :class:`Pin` for each worker it names first, then
                                   applies it: events, journal changes
:meth:`~Machine.mark_restored`     the batch came from the journal: its timers speak
                                   for their worker until it sends anything
:meth:`~Machine.pinned` (uid)      answer to :class:`Pin`: the worker is watched, its
                                   user owns its timers; next pin, or the batch applied
:meth:`~Machine.unattached`        answer to :class:`Pin`: its acquires are reported
                                   (:class:`~aiotimer.events.WorkerUnknown`)
:meth:`~Machine.tick` (now)        timers due at ``now``: without drains, acted on (one
                                   slice); with drains, a decision at ``now`` asks
                                   :class:`NeedInput` for the due workers (``hold``);
                                   then :class:`Arm` if the next deadline moved
:meth:`~Machine.input_taken`       answer to :class:`NeedInput`: the drains are done
                                   with it (their batches were submitted meanwhile);
                                   another :class:`NeedInput` for workers due since,
                                   or the due timers acted on
(acting on a slice)                per due timer, in deadline order: a watched worker's
                                   is asked :class:`ActOn` (its plan; with an empty
                                   plan only if unpinned: to pin it again); the report
                                   (:class:`~aiotimer.events.TimerExpired`) follows the
                                   answer; then :class:`ProceedReap` per reap begun,
                                   :class:`~aiotimer.events.LoopLagged` if late,
                                   :class:`Arm`
:meth:`~Machine.acted` (how)       answer to :class:`ActOn` (:class:`Acted`)
:meth:`~Machine.woke` (now)        the alarm rang: counted (``wakeups``)
:meth:`~Machine.gone` (pid)        the worker's timers cleared, its journal entry
                                   forgotten, :class:`~aiotimer.events.WorkerExited`
=================================  ======================================================

*The rule*: before a worker is acted on at deadline ``D``, everything its transport
held for it at ``D`` is applied, so a release sent before the deadline always wins,
even when the loop was stalled (a SIGSTOP, a GC or VM pause) and wakes up after it: the
stall is the server's lateness, not the worker's. It is a property of this machine: a
:class:`~aiotimer.server._decision.Decision` made at ``now`` names the workers due
(:meth:`~aiotimer.core._table.TimerTable.due_pids`, a peek; anyone when more than
:data:`EXPIRE_BUDGET` heap entries are due) in a :class:`NeedInput`, and no
:class:`ActOn` leaves the machine while a :class:`NeedInput` is open: it acts only on
:meth:`~Machine.input_taken`, once no worker due at the decision's instant is left to
look for. Applying input may make more timers due (an acquire that had expired
already); their workers are asked for in turn. The shell spreads the drains' work over
turns of the loop (the reap is late, never wrong). Timers that fall due meanwhile wait
for the next decision.

Acting on a slice: at most :data:`EXPIRE_BUDGET` heap entries are popped at a time, in
deadline order; the policy (:mod:`aiotimer.reapers._policy`) turns each timer into a
plan. An empty plan is "report only" (the block runs on: remembered as overdue). A
plan whose first signal is refused is that timer's alone: the worker's other timers
stay. Otherwise the reap covers the worker: its other timers are dropped at once, and
its timers falling due in the same slice are folded into it (one
:class:`~aiotimer.events.TimerExpired` for the first; the
:class:`~aiotimer.events.WorkerReaped` lists at most
:data:`~aiotimer.events.MAX_REPORTED_SCOPES` scopes, the rest counted). A worker still
unpinned is pinned again first; if it cannot be, its expiry is only reported (what
each report says: :mod:`aiotimer.server._slice`). Every
slice records how late it was handled (:attr:`Machine.loop_lag`); a lag above
:attr:`Machine.lag_threshold` is reported as :class:`~aiotimer.events.LoopLagged`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiotimer.core import DurationStats, Fold, LatencyHistogram, Overdue, Timer, TimerTable
from aiotimer.events import (
    MAX_REPORTED_SCOPES,
    LoopLagged,
    ServerCounters,
    WorkerExited,
)
from aiotimer.reapers import ReapPolicy, Step
from aiotimer.server._decision import Decision
from aiotimer.server._effects import (
    Acted,
    ActOn,
    Arm,
    JournalCleared,
    JournalForgot,
    JournalReleased,
    MachineError,
    NeedInput,
    Pin,
    ProceedReap,
    Question,
)
from aiotimer.server._ingest import MAX_TIMERS, MAX_TIMERS_PER_WORKER, Ingest
from aiotimer.server._learning import Learning
from aiotimer.server._quota import Quota
from aiotimer.server._slice import Begun, Slice, expiry, known_due
from aiotimer.wire import Decoded, Request

if TYPE_CHECKING:
    from aiotimer.server._effects import Effect


__all__ = ["EXPIRE_BUDGET", "LAG_THRESHOLD", "Machine"]

#: Default :attr:`Machine.lag_threshold`: expiries handled later than this (seconds) are
#: reported as :class:`~aiotimer.events.LoopLagged`.
LAG_THRESHOLD = 0.1
#: The most heap entries (expired or stale) one expiry slice handles; the shell lets the
#: loop run other work between slices, so however many timers fall due at once,
#: nobody waits for more than one slice (~1-2 ms).
EXPIRE_BUDGET = 1024


@dataclass(slots=True, eq=False)
class _Batch:
    """A batch waiting for its workers to be pinned."""

    batch: Decoded
    folded: Fold | None
    source: str
    mono: float
    wall: float
    pins: list[tuple[int, int | None]]


class Machine:
    """One run's engine, pure (see the module docs).

    Args:
        policy: turns an expired timer into its plan.
        own_pid, own_uid: the server's process, never signalled, and its user.
        journal: whether journal changes are effects (the run keeps a journal).
        request_events: also emit an event per acquire and release.
        max_timers, max_timers_per_worker: the caps.
    """

    def __init__(
        self,
        *,
        policy: ReapPolicy,
        own_pid: int,
        own_uid: int | None,
        journal: bool = False,
        request_events: bool = False,
        max_timers: int = MAX_TIMERS,
        max_timers_per_worker: int = MAX_TIMERS_PER_WORKER,
    ) -> None:
        self.table = TimerTable()
        self.counts = ServerCounters()
        self.stats = DurationStats()
        self.overdue = Overdue()
        self.learning = Learning()
        self._policy = policy
        self._own_pid = own_pid
        self._journal = journal
        self._watched: set[int] = set()
        self._unpinned: set[int] = set()  # watched, but not pinned (out of descriptors)
        self._quota = Quota(self.table, max_timers, max_timers_per_worker)
        self._quota.own(own_pid, own_uid)
        self._ingest = Ingest(
            table=self.table,
            counts=self.counts,
            stats=self.stats,
            overdue=self.overdue,
            learning=self.learning,
            quota=self._quota,
            watched=self._watched,
            own_pid=own_pid,
            journal=journal,
            request_events=request_events,
            max_timers=max_timers,
            max_timers_per_worker=max_timers_per_worker,
        )
        self._out: list[Effect] = []
        self._question: Pin | ActOn | None = None  # answered before any other input
        self._need: NeedInput | None = None  # answered turns later; batches come meanwhile
        self._batch: _Batch | None = None
        self._decision: Decision | None = None
        self._slice: Slice | None = None
        self._drains = 0
        self._armed = math.inf  # the deadline the alarm is set to
        #: How late each slice of expiries was handled (the loop was busy), seconds.
        self.loop_lag = LatencyHistogram()
        #: A lag above this many seconds is reported as a LoopLagged event.
        self.lag_threshold = LAG_THRESHOLD
        #: When the machine last applied a batch or handled its deadlines (monotonic).
        self.last_progress: float | None = None

    # -- reads --------------------------------------------------------------------------

    @property
    def question(self) -> Question | None:
        """The question open, if any (see the module docs)."""
        return self._question if self._question is not None else self._need

    @property
    def deciding(self) -> bool:
        """Whether a decision is in progress (its :class:`NeedInput` is open)."""
        return self._need is not None

    def watched(self, pid: int) -> bool:
        """Whether worker ``pid`` is pinned (or kept unpinned) as the machine knows."""
        return pid in self._watched

    def due(self, now: float) -> bool:
        """Whether a timer (or a stale heap entry) is due at ``now``."""
        deadline = self.table.next_deadline(budget=EXPIRE_BUDGET)
        return deadline is not None and deadline <= now

    def set_drains(self, count: int) -> None:
        """The sources have ``count`` drains: with none, a decision needs no input."""
        self._drains = count

    # -- batches ------------------------------------------------------------------------

    def submit(self, batch: Decoded, source: str, mono: float, wall: float) -> list[Effect]:
        """A batch from ``source`` (a read, or a drain's step), decoded at ``mono``."""
        if self._question is not None:
            raise MachineError(f"a batch while {self._question!r} is open")
        if self._batch is not None:
            raise MachineError("a batch while another waits for its workers")
        self.last_progress = mono
        folded, pins = self._ingest.prepare(batch)
        if pins is None:  # every worker it names is known: apply it now
            out = self._out = self._ingest.out = []
            self._ingest.apply(batch, folded, source, mono, wall)
            return out
        order = list(pins.items())[::-1]  # taken from the end: in order
        self._batch = _Batch(batch, folded, source, mono, wall, order)
        return self._pin_next()

    def mark_restored(self, requests: Sequence[Request]) -> int:
        """The acquires ``requests``, submitted, came from the journal: they speak for
        their worker only until it sends anything. How many of them are in the table."""
        return self._ingest.mark_restored(requests)

    def pinned(self, pid: int, uid: int | None, *, unpinned: bool = False) -> list[Effect]:
        """Answer to :class:`Pin`: worker ``pid`` is watched, run by user ``uid``
        (``unpinned``: kept without its identity, for lack of file descriptors; it is
        pinned again when one of its timers expires)."""
        self._answer_pin(pid)
        self._watched.add(pid)
        if unpinned:
            self._unpinned.add(pid)
        self._quota.own(pid, uid)
        return self._pin_next()

    def unattached(self, pid: int) -> list[Effect]:
        """Answer to :class:`Pin`: worker ``pid`` cannot be attached (it is unknown)."""
        self._answer_pin(pid)
        return self._pin_next()

    def _answer_pin(self, pid: int) -> None:
        question = self._question
        if not isinstance(question, Pin) or question.pid != pid:
            raise MachineError(f"an answer for pin {pid} while {question!r} is open")
        self._question = None

    def _pin_next(self) -> list[Effect]:
        """Ask the next pin of the batch waiting, or apply it."""
        out = self._start()
        batch = self._batch
        assert batch is not None
        if batch.pins:
            self._ask(Pin(*batch.pins.pop()))
            return out
        self._batch = None
        self._ingest.apply(batch.batch, batch.folded, batch.source, batch.mono, batch.wall)
        return out

    # -- the clock ----------------------------------------------------------------------

    def woke(self, now: float) -> None:
        """The alarm rang at ``now``."""
        self.counts.wakeups += 1
        self.last_progress = now

    def tick(self, now: float, wall: float) -> list[Effect]:
        """Handle the timers due at ``now`` (one slice), or begin the decision that asks
        for their input first; then set the alarm if the next deadline moved."""
        if self._question is not None or self._need is not None or self._batch is not None:
            raise MachineError(f"a tick while {self.question!r} is open")
        out = self._out = self._ingest.out = []
        deadline = self.table.next_deadline(budget=EXPIRE_BUDGET)
        if deadline is not None and deadline <= now:
            if self._drains:
                self._decision = Decision(now)
                self._look(now, wall, hold=True)
            else:
                self._act(now, now, wall)
            if self.question is None:
                self._arm()
        elif (math.inf if deadline is None else deadline) != self._armed:
            self._armed = math.inf if deadline is None else deadline
            out.append(Arm(self._armed))
        return out

    def input_taken(self, now: float, wall: float) -> list[Effect]:
        """Answer to :class:`NeedInput`: the drains are done with it (at ``now``)."""
        if self._need is None or self._question is not None or self._batch is not None:
            raise MachineError(f"input taken while {self.question!r} is open")
        self._need = None
        out = self._start()
        self._look(now, wall, hold=False)
        if self.question is None:
            self._arm()
        return out

    def _look(self, now: float, wall: float, *, hold: bool) -> None:
        """Ask for the input of the workers due at the decision's instant not looked
        for yet, or act once none is left."""
        decision = self._decision
        assert decision is not None
        look = decision.next(self.table.due_pids(decision.at, limit=EXPIRE_BUDGET))
        if look is not None:
            self._need = NeedInput(look.pids, hold)
            self._out.append(self._need)
            return
        self._decision = None
        self._act(now, decision.at, wall)

    def _arm(self) -> None:
        deadline = self.table.next_deadline(budget=EXPIRE_BUDGET)
        at = math.inf if deadline is None else deadline
        if at != self._armed:
            self._armed = at
            self._out.append(Arm(at))

    # -- acting -------------------------------------------------------------------------

    def acted(self, how: Acted) -> list[Effect]:
        """Answer to :class:`ActOn`: what became of it."""
        work = self._slice
        if not isinstance(self._question, ActOn) or work is None or work.asked is None:
            raise MachineError(f"an act answered while {self._question!r} is open")
        self._question = None
        out = self._start()
        timer, plan = work.asked
        work.asked = None
        if how is not Acted.UNPINNED:  # pinned again (or gone)
            self._unpinned.discard(timer.pid)
        self._acted(timer, plan, how, work)
        self._go_on(work)
        if self._question is None:
            self._arm()
        return out

    def _acted(self, timer: Timer, plan: tuple[Step, ...], how: Acted, work: Slice) -> None:
        """Report ``timer``'s expiry, now that acting on it went ``how``."""
        if how is Acted.GONE:  # a gone worker's exit is reported on its own
            return
        self.stats.record_expired(timer.scope_id, max(0.0, work.now - timer.acquired_at))
        if not plan and how is not Acted.UNPINNED:  # the block runs on: its release
            self.overdue.add(timer.key, timer.acquired_at)  # will tell how long it took
        self._out.append(
            expiry(timer, plan, how, work, policy=self._policy, learning=self.learning)
        )
        if how is Acted.REFUSED:  # a refused timer abandons only itself
            self._out.append(ProceedReap(timer.pid, (timer.scope_id,), 0))
        elif how is Acted.BEGUN:
            work.begun[timer.pid] = Begun([timer.scope_id])

    def _act(self, now: float, at: float, wall: float) -> None:
        """Act on the timers due at ``at`` (one slice), at ``now``."""
        self.last_progress = now
        expired = self.table.pop_expired(at, budget=EXPIRE_BUDGET)
        self._go_on(Slice(now, wall, expired))

    def _go_on(self, work: Slice) -> None:
        """Act on the slice's timers from where it stands, until a question or its end."""
        self._slice = work
        expired, begun, now, journal = work.expired, work.begun, work.now, self._journal
        out, counts = self._out, self.counts
        while work.index < len(expired):
            timer = expired[work.index]
            work.index += 1
            if journal:
                out.append(JournalReleased(timer.pid, timer.scope_id))
            counts.expired += 1
            started = begun.get(timer.pid)
            if started is not None:  # folded into the reap this slice began
                self.stats.record_expired(timer.scope_id, max(0.0, now - timer.acquired_at))
                if len(started.scopes) < MAX_REPORTED_SCOPES:
                    started.scopes.append(timer.scope_id)
                else:
                    started.folded += 1
                continue
            if timer.pid not in self._watched:  # the server's own process
                self._acted(timer, (), Acted.UNWATCHED, work)
                continue
            plan = tuple(self._policy.plan(timer))
            if not plan and timer.pid not in self._unpinned:  # report only: nothing to do
                self._acted(timer, plan, Acted.NOT_BEGUN, work)
                continue
            work.asked = (timer, plan)
            self._ask(ActOn(timer, plan, now, known_due(timer)))
            return
        self._slice = None
        for pid, started in begun.items():
            scopes = started.scopes
            left = MAX_REPORTED_SCOPES - len(scopes)
            count, others = self.table.drop_worker(pid, sample=left)
            self._ingest.forget(pid)
            if journal:
                out.append(JournalCleared(pid))
            omitted = started.folded + count - len(others)
            out.append(ProceedReap(pid, (*scopes, *others), omitted))
        if expired:
            lag = now - known_due(expired[0])
            self.loop_lag.observe(lag)
            if lag > self.lag_threshold:
                out.append(LoopLagged(time=work.wall, lag=lag, expired=len(expired)))

    # -- workers ------------------------------------------------------------------------

    def gone(self, pid: int, reason: str, wall: float) -> list[Effect]:
        """Worker ``pid`` has gone (``reason`` says how): clear its timers. Taken at any
        time, also while a question is open (a signal or a pinning found it gone)."""
        self._watched.discard(pid)
        self._unpinned.discard(pid)
        self.counts.workers_exited += 1
        count, cleared = self.table.drop_worker(pid, sample=MAX_REPORTED_SCOPES)
        self._ingest.forget(pid)
        effects: list[Effect] = []
        if self._journal:
            effects.append(JournalForgot(pid))
        if self.overdue:
            self.overdue.clear_worker(pid)
        effects.append(
            WorkerExited(
                time=wall,
                pid=pid,
                cleared=tuple(cleared),
                reason=reason,
                omitted=count - len(cleared),
            )
        )
        return effects

    # -- the step's output --------------------------------------------------------------

    def _start(self) -> list[Effect]:
        out = self._out = []
        self._ingest.out = out
        return out

    def _ask(self, question: Pin | ActOn) -> None:
        self._question = question
        self._out.append(question)

    def __repr__(self) -> str:
        asking = "" if self.question is None else f", asking {self.question!r}"
        return f"<Machine {len(self.table):,} timers, {len(self._watched):,} workers{asking}>"
