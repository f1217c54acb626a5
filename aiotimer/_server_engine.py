"""The server's engine: one run of a :class:`~aiotimer.server.TimerServer`, in its loop.

How this works
--------------
Sources hand decoded batches to :meth:`Engine.submit` (the engine is their
:class:`~aiotimer.sources.RequestSink`). Each request updates the pure
:class:`~aiotimer._table.TimerTable`; the first timer of a pid attaches the worker in
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

Expired timers are handled in deadline order: the policy turns each into a plan
(:mod:`aiotimer._policy`). An empty plan is "report only". Otherwise the worker's other
timers are cleared and the plan is carried out through the policy's
:class:`~aiotimer._policy.Escalator`: the engine performs the action it hands out, tells
it the :class:`~aiotimer._policy.Result` and gets the next, in one short loop. The first
action is taken right in the expiry handler, so a first signal leaves at the deadline,
before anything else is done about the timer (its outcome is reported right after the
:class:`~aiotimer.events.TimerExpired` event); the rest runs in one *reap* task per
worker, so a slow reap (a grace wait, a retry back-off) never delays another expiry.
Signals never block (``kill(2)``, ``pidfd_send_signal(2)``): :meth:`Reaper.signal` is
synchronous. A failed signal is reported and retried with back-off, and finally
reported as abandoned; it is never reported as success. A
:class:`~aiotimer._policy.DumpStacks` step's text rides on the
:class:`~aiotimer.events.StacksDumped` event and on every later
:class:`~aiotimer.events.WorkerReaped` of the same reap.

Statistics (:mod:`aiotimer._stats`): a timer released in time records its duration
(release time - acquire time) for its scope's site; an expiry records the time the timer
had run. An expired timer that is not reaped (report only, shadow mode) is remembered in
an :class:`~aiotimer._stats.Overdue` so that its late release still records the block's
real duration; a worker's exit forgets its overdue timers.

Everything here runs in the event loop's thread; thread-safety is the shell's business.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import anyio
import anyio.abc

from aiotimer._clock import Clock
from aiotimer._policy import (
    Action,
    DumpStacks,
    Escalator,
    Outcome,
    ReapPolicy,
    ReapRetry,
    Result,
    SendSignal,
    Step,
    Wait,
    format_plan,
)
from aiotimer._protocol import Decoded, Request
from aiotimer._stats import DurationStats, Overdue, SiteSummary
from aiotimer._table import ReapOptions, Timer, TimerTable
from aiotimer.errors import ProcessGoneError, RefusedTargetError
from aiotimer.events import (
    Counters,
    Event,
    ReapAbandoned,
    ReapFailed,
    RequestRejected,
    StacksDumped,
    TimerAcquired,
    TimerExpired,
    TimerReleased,
    WorkerExited,
    WorkerReaped,
    WorkerSurvived,
    WorkerUnknown,
)
from aiotimer.reapers import Reaper
from aiotimer.sources._base import Source

__all__ = ["DUMP_SLACK", "Counters", "Engine", "ReapRetry", "serve_source"]

logger = logging.getLogger("aiotimer")

#: Seconds a reaper's ``dump_stacks`` may overrun its timeout before the engine cuts it off.
DUMP_SLACK = 1.0


@dataclass(slots=True, eq=False)
class _Worker:
    """A watched worker. Its anyio primitives are made in its watcher task (``submit``
    may run outside any task, where anyio cannot make them)."""

    pid: int
    exited: anyio.Event | None = None  # set when it is gone; made by the first waiter
    watch: anyio.CancelScope | None = None  # the watcher's, once it runs
    reaping: bool = False
    gone: bool = False


@dataclass(slots=True, eq=False)
class _Reap:
    """One reap of a worker: its escalator, and what its events report."""

    worker: _Worker
    escalator: Escalator
    steps: int  # the plan's signal and dump steps
    scopes: tuple[str, ...] = ()  # the worker's timers this reap clears
    stacks: str | None = None  # the dump's text, once a DumpStacks step ran
    error: str = ""  # the last failed signal's error, until it is reported


class _StartedProxy:
    """A task status that remembers whether ``started()`` was called."""

    __slots__ = ("_inner", "called")

    def __init__(self, inner: anyio.abc.TaskStatus[None]) -> None:
        self._inner = inner
        self.called = False

    def started(self, value: None = None) -> None:
        self.called = True
        self._inner.started()


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
        self._retry = retry
        self._request_events = request_events
        self._self_kill = self_kill_after_reap
        self._own_pid = os.getpid()
        self._workers: dict[int, _Worker] = {}
        self._armed = -math.inf  # the deadline the expiry task sleeps until
        self._sleep_scope: anyio.CancelScope | None = None

    # -- ingest (RequestSink) ----------------------------------------------------------

    def submit(self, batch: Decoded, source: str) -> None:
        """Apply ``batch``: every request in order, then one event per rejection."""
        clock = self._clock
        mono, wall = clock.monotonic(), clock.time()
        self.last_progress = mono
        for req in batch.requests:
            self._apply(req, source, mono, wall)
        for rej in batch.rejections:
            self.counts.rejected += 1
            text = rej.line.decode("ascii", "backslashreplace")
            self._emit(RequestRejected(time=wall, reason=rej.reason, line=text, source=source))
        deadline = self.table.next_deadline()
        if deadline is not None and deadline <= (now := clock.monotonic()):
            self._expire_due(now)  # it fell while the loop was busy (with this batch, say)

    def _apply(self, req: Request, source: str, mono: float, wall: float) -> None:
        self.counts.requests += 1
        if req.is_release:
            released = self.table.release(req.pid, req.scope_id)
            if released is not None:
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
        if pid not in self._workers and pid != self._own_pid and not self._attach(pid):
            self._emit(WorkerUnknown(time=wall, pid=pid, scope_id=req.scope_id, source=source))
            return
        deadline = req.deadline(mono, wall)
        options = None
        if req.grace is not None or req.group or req.dump:
            options = ReapOptions(req.grace, req.group, req.dump)
        timer = Timer(pid, req.scope_id, deadline, req.signal, mono, options)
        self.table.acquire(timer)
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

    # -- workers ----------------------------------------------------------------------

    def _attach(self, pid: int) -> bool:
        try:
            attached = self._reaper.attach(pid)
        except Exception:
            logger.exception("reaper.attach(%d) raised; treating the worker as unknown", pid)
            return False
        if attached:
            worker = self._workers[pid] = _Worker(pid)
            self._tg.start_soon(self._watch, worker, name=f"aiotimer-watch-{pid}")
        return attached

    async def _watch(self, worker: _Worker) -> None:
        if worker.gone:
            return
        with anyio.CancelScope() as worker.watch:
            try:
                await self._reaper.wait_exit(worker.pid)
            except Exception:
                logger.exception("reaper.wait_exit(%d) raised; worker exit unwatched", worker.pid)
                return
            self._worker_gone(worker, "exited")

    def _worker_gone(self, worker: _Worker, reason: str) -> None:
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
        cleared = tuple(t.scope_id for t in self.table.clear_worker(worker.pid))
        if self.overdue:
            self.overdue.clear_worker(worker.pid)
        self._emit(
            WorkerExited(time=self._clock.time(), pid=worker.pid, cleared=cleared, reason=reason)
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

    def snapshot(self) -> tuple[tuple[Timer, ...], tuple[int, ...]]:
        """The live timers (in deadline order) and the watched workers' pids."""
        return self.table.snapshot(), tuple(self._workers)

    def scope_stats(self) -> tuple[SiteSummary, ...]:
        """The duration statistics of every scope site (see :mod:`aiotimer._stats`)."""
        return tuple(self.stats.summaries())

    # -- expiry -----------------------------------------------------------------------

    async def run_expiry(self) -> None:
        """Sleep until the next deadline (or a re-arm), then handle what expired; forever."""
        table, clock = self.table, self._clock
        while True:
            deadline = table.next_deadline()
            now = clock.monotonic()
            if deadline is not None and deadline <= now:
                self._expire_due(now)
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

    def _expire_due(self, now: float) -> None:
        """Handle every timer due at ``now``, in deadline order."""
        self.last_progress = now
        for timer in self.table.pop_expired(now):
            self._expire(timer, now)

    def _expire(self, timer: Timer, now: float) -> None:
        self.counts.expired += 1
        worker = self._workers.get(timer.pid)
        policy = self._policy
        plan: Sequence[Step] = () if worker is None else policy.plan(timer)
        reap: _Reap | None = None
        first: Action | None = None
        error: Exception | None = None
        if plan and worker is not None and not worker.reaping:
            # Start the reap first: its first signal leaves right here, at the deadline.
            worker.reaping = True
            escalator = Escalator(plan, confirm=policy.unkillable_after, retry=self._retry)
            reap = _Reap(worker, escalator, sum(not isinstance(s, Wait) for s in plan))
            first = escalator.next(now)
            if isinstance(first, SendSignal):
                error = self._signal(worker.pid, first)
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
        self._emit(
            TimerExpired(
                time=self._clock.time(),
                pid=timer.pid,
                scope_id=timer.scope_id,
                signal=timer.signal,
                late=now - timer.deadline,
                report_only=not plan,
                action=action,
            )
        )
        if reap is None:
            return  # report only, or the reap in progress covers this timer too
        others = self.table.clear_worker(timer.pid)
        reap.scopes = (timer.scope_id, *(t.scope_id for t in others))
        if isinstance(first, SendSignal):
            first = self._next(reap, self._sent(reap, first, error))
        if first is None:
            reap.worker.reaping = False
        else:
            self._tg.start_soon(self._reap, reap, first, name=f"aiotimer-reap-{timer.pid}")

    # -- reaping ----------------------------------------------------------------------

    async def _reap(self, reap: _Reap, action: Action | None) -> None:
        """Carry out the rest of ``reap``'s plan, from ``action`` on."""
        worker = reap.worker
        try:
            while action is not None:
                if isinstance(action, SendSignal):
                    result = self._sent(reap, action, self._signal(worker.pid, action))
                elif isinstance(action, DumpStacks):
                    number = len(reap.escalator.taken)
                    reap.stacks = await self._dump(worker, action, number, reap.steps)
                    result = Result.EXITED if worker.gone else Result.DONE
                else:
                    exited = await self._wait_exit(worker, action.deadline)
                    result = Result.EXITED if exited else Result.DONE
                action = self._next(reap, result)
        finally:
            worker.reaping = False

    def _signal(self, pid: int, step: SendSignal) -> Exception | None:
        """Send ``step`` through the reaper; the error it raised, if any."""
        try:
            self._reaper.signal(pid, step.signum, group=step.group)
        except Exception as exc:
            return exc
        return None

    def _sent(self, reap: _Reap, step: SendSignal, error: Exception | None) -> Result:
        """Report a delivered signal (``error`` is what sending it raised, if anything);
        what to tell the escalator (a failure is reported by :meth:`_next`)."""
        worker = reap.worker
        if isinstance(error, ProcessGoneError):
            self._worker_gone(worker, "gone before signal")
            return Result.EXITED
        if error is not None:
            self.counts.reap_failed += 1
            reap.error = f"{type(error).__name__}: {error}"
            return Result.REFUSED if isinstance(error, RefusedTargetError) else Result.FAILED
        self.counts.reaped += 1
        self._emit(
            WorkerReaped(
                time=self._clock.time(),
                pid=worker.pid,
                signal=step.signum,
                group=step.group,
                scopes=reap.scopes,
                step=len(reap.escalator.taken),
                steps=reap.steps,
                stacks=reap.stacks,
            )
        )
        if self._self_kill:
            logger.critical("self_kill_after_reap: sending signal %d to the server", step.signum)
            os.kill(self._own_pid, step.signum)
        return Result.DONE

    def _next(self, reap: _Reap, result: Result) -> Action | None:
        """Tell the escalator ``result``; report what it decided; its next action."""
        escalator, clock, pid = reap.escalator, self._clock, reap.worker.pid
        now = clock.monotonic()
        action = escalator.next(now, result)
        last = escalator.taken[-1] if escalator.taken else None
        signum = last.signum if isinstance(last, SendSignal) else 0
        if result in (Result.FAILED, Result.REFUSED):
            attempt = escalator.attempt
            if action is None:
                self._emit(
                    ReapAbandoned(
                        time=clock.time(),
                        pid=pid,
                        signal=signum,
                        error=reap.error,
                        attempts=attempt,
                    )
                )
            else:
                self._emit(
                    ReapFailed(
                        time=clock.time(),
                        pid=pid,
                        signal=signum,
                        error=reap.error,
                        attempt=attempt,
                        retry_in=escalator.backoff,
                    )
                )
        elif action is None and escalator.outcome in (Outcome.UNKILLABLE, Outcome.SURVIVED):
            self._emit(
                WorkerSurvived(
                    time=clock.time(),
                    pid=pid,
                    signal=signum,
                    unkillable=escalator.outcome is Outcome.UNKILLABLE,
                    waited=self._policy.unkillable_after,
                )
            )
        return action

    async def _wait_exit(self, worker: _Worker, deadline: float) -> bool:
        """Wait until monotonic ``deadline`` (on the injected clock) or the worker's exit;
        ``True`` if it exited."""
        if worker.gone:
            return True
        if worker.exited is None:
            worker.exited = anyio.Event()
        await self._until(deadline, worker.exited.wait)
        return worker.gone

    async def _until(self, deadline: float, work: Callable[[], Awaitable[object]]) -> bool:
        """Run ``work()`` until it returns or the injected clock reaches ``deadline``;
        ``True`` if it returned."""
        finished = False
        async with anyio.create_task_group() as tg:

            async def time_out() -> None:
                await self._clock.sleep_until(deadline)
                tg.cancel_scope.cancel()

            tg.start_soon(time_out)
            await work()
            finished = True
            tg.cancel_scope.cancel()
        return finished

    async def _dump(self, worker: _Worker, step: DumpStacks, number: int, steps: int) -> str | None:
        """Ask for a dump, report it and return its text.

        The reaper bounds the dump by ``step.timeout``; a reaper that overruns that by
        :data:`DUMP_SLACK` is cut off, so a dump can never hold up the kill.
        """
        text: str | None = None

        async def dump() -> None:
            nonlocal text
            try:
                text = await self._reaper.dump_stacks(worker.pid, step.timeout)
            except Exception:
                logger.exception("reaper.dump_stacks(%d) raised", worker.pid)

        deadline = self._clock.monotonic() + step.timeout + DUMP_SLACK
        if not await self._until(deadline, dump):
            logger.error("reaper.dump_stacks(%d) overran its timeout; cut off", worker.pid)
        self._emit(
            StacksDumped(
                time=self._clock.time(), pid=worker.pid, text=text, step=number, steps=steps
            )
        )
        return text


async def serve_source(
    source: Source,
    sink: Engine,
    on_failure: Callable[[BaseException], None],
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``source.serve(sink)``; a failure before it started propagates (the server
    cannot start), a failure afterwards is handed to ``on_failure`` (the server runs on)."""
    status = _StartedProxy(task_status)
    try:
        await source.serve(sink, task_status=status)
    except Exception as exc:
        if not status.called:
            raise
        on_failure(exc)
