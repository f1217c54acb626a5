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
interval: an idle engine makes no wake-ups (``Counters.wakeups`` counts them). On the
event loop's clock the task wakes :data:`SLEEP_MARGIN` before a deadline and yields until
it falls, since loop timers only wake to the millisecond; a deadline already due when it
looks is handled at once, without another sleep. Deadlines that fall while the loop is
busy elsewhere are caught by ``submit`` too: after applying a batch it handles whatever
has come due, so that ingesting a burst of input does not hold up an expiry.

Expired timers are handled in deadline order: the policy turns each into a plan
(:mod:`aiotimer._policy`). An empty plan is "report only". Otherwise the worker's other
timers are cleared and one *reap* task per worker carries the plan out through the
policy's :class:`~aiotimer._policy.Escalator`, so a slow reap
(a grace wait, a retry back-off) never delays another expiry. When the plan starts with
a signal and the reaper can signal without blocking
(:class:`~aiotimer.reapers.NonBlockingReaper`), that first signal goes out inline, in the
expiry handler, before anything else is done about the timer (a spawned task would only
run one loop iteration later, perhaps after a chunk of input to decode); its outcome is
reported right after the :class:`~aiotimer.events.TimerExpired` event, and the reap task
resumes after it, retrying it if it failed. A failed signal is
reported and retried with exponential back-off, and finally reported as abandoned; it is
never reported as success. A :class:`~aiotimer._policy.DumpStacks` step's text rides on
the :class:`~aiotimer.events.StacksDumped` event and on every later
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
from dataclasses import dataclass, field

import anyio
import anyio.abc

from aiotimer._clock import Clock, MonotonicClock
from aiotimer._policy import (
    Action,
    DumpStacks,
    Escalator,
    Outcome,
    ReapPolicy,
    SendSignal,
    Step,
    Wait,
    format_plan,
)
from aiotimer._protocol import Decoded, Request
from aiotimer._stats import DurationStats, Overdue, SiteSummary
from aiotimer._table import Timer, TimerTable
from aiotimer.errors import ProcessGoneError, RefusedTargetError
from aiotimer.events import (
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
from aiotimer.reapers import NonBlockingReaper, Reaper, as_nonblocking
from aiotimer.sources._base import Source

__all__ = ["DUMP_SLACK", "SLEEP_MARGIN", "Counters", "Engine", "ReapRetry", "serve_source"]

logger = logging.getLogger("aiotimer")

#: Seconds a reaper's ``dump_stacks`` may overrun its timeout before the engine cuts it off.
DUMP_SLACK = 1.0

#: With the event loop's clock (:class:`~aiotimer._clock.MonotonicClock`), the expiry
#: task sleeps until this many seconds before a live deadline, then yields to the loop
#: (one iteration at a time, so I/O goes on) until the deadline is reached. Loop timers
#: have millisecond granularity (uvloop rounds a delay to whole ms of a cached clock;
#: asyncio rounds epoll's timeout up), so a sleep until the deadline itself wakes ~0.3 ms
#: late on average and up to ~1.5 ms. The price: up to this much CPU per expiry.
SLEEP_MARGIN = 0.001


@dataclass(frozen=True, slots=True)
class ReapRetry:
    """How a failed signal is retried: ``attempts`` in all, the delay growing from
    ``initial`` by ``factor`` per attempt up to ``maximum`` seconds."""

    attempts: int = 6
    initial: float = 0.1
    maximum: float = 5.0
    factor: float = 2.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if not (0 <= self.initial <= self.maximum and self.factor >= 1):
            raise ValueError("need 0 <= initial <= maximum and factor >= 1")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        return float(min(self.maximum, self.initial * self.factor ** (attempt - 1)))


@dataclass(frozen=True, slots=True)
class Counters:
    """What a server run has done so far.

    ``requests`` counts valid requests received; ``acquired``/``released`` the timers set
    and released in time; ``expired`` the deadlines passed; ``reaped`` the signals
    delivered; ``reap_failed`` the failed signal attempts; ``rejected`` the bad inputs;
    ``workers_exited`` the workers seen exiting; ``wakeups`` the times the expiry task
    woke up; ``events_dropped`` the events the event log had no room for.
    """

    requests: int = 0
    acquired: int = 0
    released: int = 0
    expired: int = 0
    reaped: int = 0
    reap_failed: int = 0
    rejected: int = 0
    workers_exited: int = 0
    wakeups: int = 0
    events_dropped: int = 0


@dataclass(slots=True)
class _Counts:
    requests: int = 0
    acquired: int = 0
    released: int = 0
    expired: int = 0
    reaped: int = 0
    reap_failed: int = 0
    rejected: int = 0
    workers_exited: int = 0
    wakeups: int = 0


@dataclass(slots=True, eq=False)
class _Worker:
    pid: int
    exited: anyio.Event = field(default_factory=anyio.Event)
    watch: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    reaping: bool = False
    gone: bool = False


@dataclass(slots=True, eq=False)
class _Reap:
    """One reap of a worker: its escalator, and what its events report."""

    worker: _Worker
    escalator: Escalator
    first: Action | None  # the escalator's first action, taken when the timer expired
    steps: int  # the plan's signal and dump steps
    scopes: tuple[str, ...] = ()  # the worker's timers this reap clears
    stacks: str | None = None  # the dump's text, once a DumpStacks step ran
    verdict: float | bool | None = None  # of ``first``'s attempt 1 if made inline


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
        self.counts = _Counts()
        self.stats = DurationStats()
        self.overdue = Overdue()
        self.last_progress: float | None = None
        self._tg = task_group
        self._clock = clock
        self._reaper = reaper
        self._nonblocking = as_nonblocking(reaper)
        self._policy = policy
        self._emit = emit
        self._retry = retry
        self._request_events = request_events
        self._self_kill = self_kill_after_reap
        self._own_pid = os.getpid()
        self._margin = SLEEP_MARGIN if isinstance(clock, MonotonicClock) else 0.0
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
        extended = req.grace is not None or req.group or req.dump
        timer = Timer(pid, req.scope_id, deadline, req.signal, mono, req if extended else None)
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
        with worker.watch:
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
        worker.exited.set()
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
        table, clock, margin = self.table, self._clock, self._margin
        while True:
            deadline = table.next_deadline()
            now = clock.monotonic()
            if deadline is not None and deadline <= now:
                self._expire_due(now)
            elif deadline is not None and deadline - now <= margin:
                await anyio.lowlevel.checkpoint()  # it is about to fall: yield, look again
            else:
                with anyio.CancelScope() as scope:
                    self._sleep_scope = scope
                    if deadline is None:
                        self._armed = math.inf
                        await anyio.sleep_forever()
                    else:
                        self._armed = deadline
                        await clock.sleep_until(deadline - margin)
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
        inline: tuple[SendSignal, Exception | None] | None = None
        if plan and worker is not None and not worker.reaping:
            # Start the reap first: its first signal may go out right here, inline.
            worker.reaping = True
            escalator = policy.escalator(timer)
            first = escalator.next(now, True)
            reap = _Reap(worker, escalator, first, sum(not isinstance(s, Wait) for s in plan))
            if isinstance(first, SendSignal) and self._nonblocking is not None:
                inline = first, self._attempt_nowait(self._nonblocking, worker.pid, first)
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
        if inline is not None:  # report the inline attempt, after TimerExpired
            reap.verdict = self._judge(reap, inline[0], 1, 1, inline[1])
        self._tg.start_soon(self._reap, reap, name=f"aiotimer-reap-{timer.pid}")

    # -- reaping ----------------------------------------------------------------------

    async def _reap(self, reap: _Reap) -> None:
        """Carry out ``reap``'s plan, from its first action (already taken, perhaps run)."""
        worker, escalator, clock = reap.worker, reap.escalator, self._clock
        action: Action | None = reap.first
        try:
            while action is not None:
                number = len(escalator.taken)
                if isinstance(action, SendSignal):
                    verdict, reap.verdict = reap.verdict, None
                    delivered = await self._send(reap, action, number, verdict)
                    if not delivered and not worker.gone:
                        return  # abandoned (and reported); the worker stays watched
                elif isinstance(action, DumpStacks):
                    reap.stacks = await self._dump(worker, action, number, reap.steps)
                else:
                    await self._wait_exit(worker, action.deadline)
                action = escalator.next(clock.monotonic(), not worker.gone)
            if escalator.outcome in (Outcome.UNKILLABLE, Outcome.SURVIVED):
                last = escalator.taken[-1]
                self._emit(
                    WorkerSurvived(
                        time=clock.time(),
                        pid=worker.pid,
                        signal=last.signum if isinstance(last, SendSignal) else 0,
                        unkillable=escalator.outcome is Outcome.UNKILLABLE,
                        waited=self._policy.unkillable_after,
                    )
                )
        finally:
            worker.reaping = False

    async def _send(
        self, reap: _Reap, step: SendSignal, number: int, verdict: float | bool | None
    ) -> bool:
        """Deliver one signal, retrying failures; ``True`` if it was delivered.

        ``verdict`` is attempt 1's (see :meth:`_judge`) when it was already made inline.
        """
        worker, attempt = reap.worker, 1
        if verdict is None:
            verdict = self._judge(reap, step, number, 1, await self._attempt(worker.pid, step))
        while not isinstance(verdict, bool):
            if await self._wait_exit(worker, self._clock.monotonic() + verdict):
                return False
            attempt += 1
            error = await self._attempt(worker.pid, step)
            verdict = self._judge(reap, step, number, attempt, error)
        return verdict

    async def _attempt(self, pid: int, step: SendSignal) -> Exception | None:
        """Signal once through the reaper; the error it raised, if any."""
        try:
            await self._reaper.signal(pid, step.signum, group=step.group)
        except Exception as exc:
            return exc
        return None

    @staticmethod
    def _attempt_nowait(reaper: NonBlockingReaper, pid: int, step: SendSignal) -> Exception | None:
        """:meth:`_attempt`, inline."""
        try:
            reaper.signal_nowait(pid, step.signum, group=step.group)
        except Exception as exc:
            return exc
        return None

    def _judge(
        self,
        reap: _Reap,
        step: SendSignal,
        number: int,
        attempt: int,
        error: Exception | None,
    ) -> float | bool:
        """Report how attempt number ``attempt`` to send ``step`` went (``error`` is what
        it raised, if anything) and decide what comes next: ``True`` delivered, ``False``
        given up (the worker is gone, or the reap is abandoned), or the seconds to wait
        before the next attempt."""
        worker, clock = reap.worker, self._clock
        pid, signum = worker.pid, step.signum
        if isinstance(error, ProcessGoneError):
            self._worker_gone(worker, "gone before signal")
            return False
        if error is not None:
            self.counts.reap_failed += 1
            text = f"{type(error).__name__}: {error}"
            if isinstance(error, RefusedTargetError) or attempt >= self._retry.attempts:
                self._emit(
                    ReapAbandoned(
                        time=clock.time(), pid=pid, signal=signum, error=text, attempts=attempt
                    )
                )
                return False
            delay = self._retry.delay(attempt)
            self._emit(
                ReapFailed(
                    time=clock.time(),
                    pid=pid,
                    signal=signum,
                    error=text,
                    attempt=attempt,
                    retry_in=delay,
                )
            )
            return delay
        self.counts.reaped += 1
        self._emit(
            WorkerReaped(
                time=clock.time(),
                pid=pid,
                signal=signum,
                group=step.group,
                scopes=reap.scopes,
                step=number,
                steps=reap.steps,
                stacks=reap.stacks,
            )
        )
        if self._self_kill:
            logger.critical("self_kill_after_reap: sending signal %d to the server", signum)
            os.kill(self._own_pid, signum)
        return True

    async def _wait_exit(self, worker: _Worker, deadline: float) -> bool:
        """Wait until monotonic ``deadline`` (on the injected clock) or the worker's exit;
        ``True`` if it exited."""
        if not worker.exited.is_set():
            await self._until(deadline, worker.exited.wait)
        return worker.exited.is_set()

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
