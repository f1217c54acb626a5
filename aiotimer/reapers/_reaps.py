"""Carrying out reaps: one per worker, through the policy's Escalator.

:meth:`Reaps.begin` starts a reap in the expiry handler: it makes the reap's
:class:`~aiotimer.reapers._escalator.Escalator` and takes its first action at once, so a first
signal leaves at the deadline (signals never block: :meth:`Reaper.signal` is
synchronous). :meth:`Reaps.proceed`, once the expiry is reported, reports that signal's
outcome and runs the rest of the plan in a task of its own, so a slow reap (a grace
wait, a retry back-off, a stack dump) never delays another expiry. Every action is
performed the same way, in one short loop: perform it, tell the escalator the
:class:`~aiotimer.reapers._escalator.Result`, report what it decided, take the next.

A failed signal is reported (:class:`~aiotimer.events.ReapFailed`) and retried with
back-off, and finally reported as abandoned (:class:`~aiotimer.events.ReapAbandoned`);
it is never reported as success. A refused one (:class:`~aiotimer.events.SignalRefused`:
the kill policy, or the kernel for good) is abandoned at once; a refused group signal
falls back to the worker alone, right away. A reap whose first signal is refused
(:attr:`Reap.refused`, known when :meth:`Reaps.begin` returns) is the refusal of its
timer alone: the engine leaves the worker's other timers in place, each to be reaped
(or refused) at its own deadline. A :class:`~aiotimer.reapers._steps.DumpStacks` step's text
rides on the :class:`~aiotimer.events.StacksDumped` event and on every later
:class:`~aiotimer.events.WorkerReaped` of the same reap.

The worker's record is a :class:`~aiotimer.reapers._watch.WatchedWorker`: a reap moves it
from ``PINNED`` to ``REAPING`` when it begins and back when it ends; a signal that finds
the worker gone hands it to ``on_gone`` (the :class:`~aiotimer.reapers._watch.Watchlist`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import anyio
import anyio.abc

from aiotimer._edges.clock import Clock, run_until
from aiotimer.core import LatencyHistogram
from aiotimer.errors import ProcessGoneError, RefusedTargetError
from aiotimer.events import (
    Event,
    ReapAbandoned,
    ReapFailed,
    ServerCounters,
    SignalRefused,
    SignalSent,
    StacksDumped,
    WorkerReaped,
    WorkerSurvived,
)
from aiotimer.reapers._escalator import Action, Escalator, Outcome, ReapRetry, Result
from aiotimer.reapers._signal import Reaper
from aiotimer.reapers._steps import DumpStacks, SendSignal, Step, Wait
from aiotimer.reapers._watch import WatchedWorker

__all__ = ["DUMP_SLACK", "Reap", "Reaps"]

logger = logging.getLogger("aiotimer")

#: Seconds a reaper's ``dump_stacks`` may overrun its timeout before the engine cuts it off.
DUMP_SLACK = 1.0


@dataclass(slots=True, eq=False)
class Reap:
    """One reap of a worker: its escalator, and what its events report."""

    worker: WatchedWorker
    escalator: Escalator
    steps: int  # the plan's signal and dump steps
    lethal: int  # the plan's last signal: the one that reaps (earlier ones do not)
    first: Action | None = None  # the first action, taken in the expiry handler
    error: str = ""  # the last failed signal's error, until it is reported
    first_error: Exception | None = None  # what sending the first signal raised
    group_refusal: Exception | None = None  # the first signal's, to its group (then alone)
    scopes: tuple[str, ...] = ()  # the worker's timers this reap clears (the first ones)
    omitted: int = 0  # how many more it clears
    stacks: str | None = None  # the dump's text, once a DumpStacks step ran
    deadline: float = 0.0  # the expired timer's, for the reap latency
    signalled: bool = False  # whether a signal of this reap was delivered yet

    @property
    def refused(self) -> bool:
        """Whether its first signal was refused (the kill policy, or the kernel for good):
        the reap is over at once, and covers only the timer that began it."""
        return isinstance(self.first_error, RefusedTargetError)


class Reaps:
    """The reaps of one server run (see the module docs)."""

    def __init__(
        self,
        *,
        task_group: anyio.abc.TaskGroup,
        clock: Clock,
        reaper: Reaper,
        emit: Callable[[Event], None],
        counts: ServerCounters,
        retry: ReapRetry,
        confirm: float,
        self_kill: bool,
        on_gone: Callable[[WatchedWorker, str], None],
    ) -> None:
        self._tg = task_group
        self._clock = clock
        self._reaper = reaper
        self._emit = emit
        self._counts = counts
        self._retry = retry
        self._confirm = confirm
        self._self_kill = self_kill
        self._on_gone = on_gone
        self._own_pid = os.getpid()
        #: Seconds from the expired timer's deadline to the first delivered signal.
        self.latency = LatencyHistogram()

    def begin(
        self, worker: WatchedWorker, plan: Sequence[Step], now: float, deadline: float
    ) -> Reap:
        """Start reaping ``worker`` with ``plan`` at ``now`` (its timer's ``deadline``
        passed): take the first action (a signal is sent at once; its outcome is
        reported by :meth:`proceed`)."""
        worker.begin_reap()
        escalator = Escalator(plan, confirm=self._confirm, retry=self._retry)
        signals = [s.signum for s in plan if isinstance(s, SendSignal)]
        steps = sum(not isinstance(s, Wait) for s in plan)
        reap = Reap(worker, escalator, steps, signals[-1] if signals else 0, deadline=deadline)
        reap.first = escalator.next(now)
        if isinstance(reap.first, SendSignal):
            reap.first, reap.first_error, reap.group_refusal = self._send(worker.pid, reap.first)
            if reap.first_error is None:
                self._delivered(reap)
        return reap

    def _delivered(self, reap: Reap) -> None:
        """Record the reap latency at its first delivered signal."""
        if not reap.signalled:
            reap.signalled = True
            self.latency.observe(self._clock.monotonic() - reap.deadline)

    def proceed(self, reap: Reap, scopes: tuple[str, ...], omitted: int = 0) -> None:
        """Report the first action's outcome, then carry out the rest in a task.

        ``scopes`` are the worker's timers this reap clears (for the events; ``omitted``
        more are not listed)."""
        reap.scopes, reap.omitted = scopes, omitted
        action = reap.first
        if isinstance(action, SendSignal):
            sent = self._sent(reap, action, reap.first_error, reap.group_refusal)
            action = self._next(reap, sent)
            reap.first_error = reap.group_refusal = None
        if action is None:
            reap.worker.end_reap()
        else:
            pid = reap.worker.pid
            self._tg.start_soon(self._reap, reap, action, name=f"aiotimer-reap-{pid}")

    async def _reap(self, reap: Reap, action: Action | None) -> None:
        """Carry out the rest of ``reap``'s plan, from ``action`` on."""
        worker = reap.worker
        try:
            while action is not None:
                if isinstance(action, SendSignal):
                    result = self._sent(reap, *self._send(worker.pid, action))
                elif isinstance(action, DumpStacks):
                    number = len(reap.escalator.taken)
                    reap.stacks = await self._dump(worker, action, number, reap.steps)
                    result = Result.EXITED if worker.gone else Result.DONE
                else:
                    exited = await self._wait_exit(worker, action.deadline)
                    result = Result.EXITED if exited else Result.DONE
                action = self._next(reap, result)
        finally:
            worker.end_reap()

    def _signal(self, pid: int, step: SendSignal) -> Exception | None:
        """Send ``step`` through the reaper; the error it raised, if any."""
        try:
            self._reaper.signal(pid, step.signum, group=step.group)
        except Exception as exc:
            return exc
        return None

    def _send(
        self, pid: int, step: SendSignal
    ) -> tuple[SendSignal, Exception | None, Exception | None]:
        """Send ``step``; a refused group signal falls back to the worker alone. Returns
        the step sent last, what sending it raised, and the group signal's refusal."""
        error = self._signal(pid, step)
        if isinstance(error, RefusedTargetError) and step.group:
            alone = SendSignal(step.signum)
            return alone, self._signal(pid, alone), error
        return step, error, None

    def _sent(
        self,
        reap: Reap,
        step: SendSignal,
        error: Exception | None,
        group_refusal: Exception | None = None,
    ) -> Result:
        """Report a signal sent by :meth:`_send` (``error`` is what sending it raised,
        ``group_refusal`` the refusal of its group before it); what to tell the
        escalator (a failure is reported by :meth:`_next`).

        Every refusal is a :class:`SignalRefused`. Only the plan's lethal step (its last
        signal) is reported as reaped; earlier signals are :class:`SignalSent`."""
        worker = reap.worker
        if group_refusal is not None:
            self._refused(worker.pid, SendSignal(step.signum, True), group_refusal, fallback=True)
        if isinstance(error, RefusedTargetError):
            self._refused(worker.pid, step, error, fallback=False)
        if isinstance(error, ProcessGoneError):
            self._on_gone(worker, "gone before signal")
            return Result.EXITED
        if error is not None:
            self._counts.reap_failed += 1
            reap.error = f"{type(error).__name__}: {error}"
            return Result.REFUSED if isinstance(error, RefusedTargetError) else Result.FAILED
        self._delivered(reap)
        number = len(reap.escalator.taken)
        if step.signum != reap.lethal:
            self._emit(
                SignalSent(
                    time=self._clock.time(),
                    pid=worker.pid,
                    signal=step.signum,
                    group=step.group,
                    step=number,
                    steps=reap.steps,
                )
            )
            return Result.DONE
        self._counts.reaped += 1
        self._emit(
            WorkerReaped(
                time=self._clock.time(),
                pid=worker.pid,
                signal=step.signum,
                group=step.group,
                scopes=reap.scopes,
                step=number,
                steps=reap.steps,
                stacks=reap.stacks,
                omitted=reap.omitted,
            )
        )
        if self._self_kill:
            logger.critical("self_kill_after_reap: sending signal %d to the server", step.signum)
            os.kill(self._own_pid, step.signum)
        return Result.DONE

    def _refused(self, pid: int, step: SendSignal, error: Exception, *, fallback: bool) -> None:
        self._emit(
            SignalRefused(
                time=self._clock.time(),
                pid=pid,
                signal=step.signum,
                group=step.group,
                reason=str(error),
                fallback="pid" if fallback else "",
            )
        )

    def _next(self, reap: Reap, result: Result) -> Action | None:
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
                    waited=self._confirm,
                )
            )
        return action

    async def _wait_exit(self, worker: WatchedWorker, deadline: float) -> bool:
        """Wait until monotonic ``deadline`` (on the injected clock) or the worker's exit;
        ``True`` if it exited."""
        if not worker.gone:
            await self._until(deadline, worker.wait_gone)
        return worker.gone

    async def _until(self, deadline: float, work: Callable[[], Awaitable[object]]) -> bool:
        """Run ``work()`` until it returns or the injected clock reaches ``deadline``;
        ``True`` if it returned."""
        return await run_until(self._clock, deadline, work)

    async def _dump(
        self, worker: WatchedWorker, step: DumpStacks, number: int, steps: int
    ) -> str | None:
        """Ask for a dump, report it and return its text.

        The reaper bounds the dump by ``step.timeout``; a reaper that overruns that by
        :data:`DUMP_SLACK` is cut off, so a dump can never hold up the kill.
        """
        text: str | None = None
        reason = f"the reaper overran its timeout ({step.timeout:g}s) and was cut off"

        async def dump() -> None:
            nonlocal text, reason
            try:
                result = await self._reaper.dump_stacks(worker.pid, step.timeout)
            except Exception as exc:
                logger.exception("reaper.dump_stacks(%d) raised", worker.pid)
                reason = f"the reaper raised {type(exc).__name__}: {exc}"
                return
            if isinstance(result, str):
                text = result
            else:
                reason = "the reaper gave none" if result is None else result.reason

        deadline = self._clock.monotonic() + step.timeout + DUMP_SLACK
        if not await self._until(deadline, dump):
            logger.error("reaper.dump_stacks(%d) overran its timeout; cut off", worker.pid)
        self._emit(
            StacksDumped(
                time=self._clock.time(),
                pid=worker.pid,
                text=text,
                step=number,
                steps=steps,
                reason=None if text is not None else reason,
            )
        )
        return text
