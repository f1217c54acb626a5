"""Carrying a reap plan out, as a pure state machine. No I/O, no clock.

How this works
--------------
The shell carries a plan out through an :class:`Escalator`: it performs the action the
escalator hands out, tells it what became of that action (a :class:`Result`) and gets the
next one. Failed signals are retried by the escalator too, with back-off
(:class:`ReapRetry`), and finally abandoned. Waits (grace periods, back-offs, the
confirmation window) come out of it as absolute deadlines (:class:`WaitUntil`), so the
shell only ever sleeps until a deadline or until the worker exits, whichever is first.
"""

from __future__ import annotations

import enum
import signal as _signal
from collections.abc import Sequence
from dataclasses import dataclass

from aiotimer.reapers._steps import DumpStacks, SendSignal, Step, Wait, check_seconds, format_plan

__all__ = ["Action", "Escalator", "Outcome", "ReapRetry", "Result", "WaitUntil"]

_SIGKILL = int(_signal.SIGKILL)


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
class WaitUntil:
    """Sleep until the monotonic ``deadline`` or until the worker exits, whichever first."""

    deadline: float


#: What :meth:`Escalator.next` asks the shell to do.
Action = SendSignal | DumpStacks | WaitUntil


class Result(enum.Enum):
    """What became of the action an :class:`Escalator` handed out (told back to it)."""

    #: Carried out: the signal was sent, the dump is over, the wait ran out.
    DONE = "done"
    #: The signal could not be sent (e.g. permission denied); it may be retried.
    FAILED = "failed"
    #: The signal must never be sent (the target is refused); it is not retried.
    REFUSED = "refused"
    #: The worker is gone (it exited, or was found gone when signalled).
    EXITED = "exited"


class Outcome(enum.Enum):
    """How an :class:`Escalator` finished."""

    #: The plan was empty (report-only timer or shadow mode); nothing was done.
    NOTHING = "nothing"
    #: The worker was gone when asked (check :attr:`Escalator.taken` for whether it was
    #: signalled at all: an empty tuple means it exited on its own).
    EXITED = "exited"
    #: Every step was handed out and no confirmation window was asked for.
    DONE = "done"
    #: The worker was still alive ``confirm`` seconds after a final SIGKILL.
    UNKILLABLE = "unkillable"
    #: The worker was still alive ``confirm`` seconds after a final non-SIGKILL signal.
    SURVIVED = "survived"
    #: A signal failed on every attempt (or was refused); the rest of the plan is dropped.
    ABANDONED = "abandoned"


class Escalator:
    """Runs one plan: told what became of each action, hands out the next.

    The shell loops::

        esc = policy.escalator(timer, retry=retry)
        action = esc.next(clock.monotonic())
        while action is not None:
            match action:
                case SendSignal(): signal the worker (or its group) -> DONE, FAILED, ...
                case DumpStacks(): await the dump, bounded by action.timeout -> DONE
                case WaitUntil(): sleep until action.deadline or the worker's exit
            action = esc.next(clock.monotonic(), result)
        report(esc.outcome)

    A gone worker (:attr:`Result.EXITED`) ends the plan at once: nothing is signalled
    after it is gone. A failed signal is handed out again after a back-off wait, up to
    ``retry.attempts`` attempts in all (:attr:`attempt` counts them), then the plan is
    abandoned (:attr:`Outcome.ABANDONED`); a refused one is abandoned at once. With
    ``confirm`` set (and a signal in the plan), the escalator waits that long after the
    last step and then reports :attr:`Outcome.UNKILLABLE` (or :attr:`Outcome.SURVIVED`)
    if the worker still lives. Pure: time only enters through ``now``.
    """

    __slots__ = (
        "_attempt",
        "_backoff",
        "_confirm",
        "_deadline",
        "_index",
        "_outcome",
        "_plan",
        "_retry",
        "_retry_at",
        "_taken",
    )

    def __init__(
        self,
        plan: Sequence[Step],
        *,
        confirm: float | None = None,
        retry: ReapRetry | None = None,
    ) -> None:
        if confirm is not None:
            check_seconds("confirm", confirm)
        self._plan = tuple(plan)
        self._confirm = confirm
        self._retry = retry if retry is not None else ReapRetry()
        self._index = 0
        self._deadline: float | None = None
        self._retry_at: float | None = None
        self._attempt = 0
        self._backoff = 0.0
        self._outcome: Outcome | None = None
        self._taken: list[Step] = []

    @property
    def plan(self) -> tuple[Step, ...]:
        """The plan being carried out."""
        return self._plan

    @property
    def outcome(self) -> Outcome | None:
        """How the plan ended, or ``None`` while it is still running."""
        return self._outcome

    @property
    def taken(self) -> tuple[Step, ...]:
        """The signal and dump steps handed out so far, in order (retries not repeated)."""
        return tuple(self._taken)

    @property
    def attempt(self) -> int:
        """The number of the latest attempt at the current signal (1 for the first)."""
        return self._attempt

    @property
    def backoff(self) -> float:
        """Seconds of the latest back-off before a failed signal's next attempt."""
        return self._backoff

    def next(self, now: float, result: Result = Result.DONE) -> Action | None:
        """The next action at monotonic time ``now``, given what became of the last one
        (``result``; for the first call, the default), or ``None`` when finished."""
        if self._outcome is not None:
            return None
        if result is Result.EXITED:
            self._outcome = Outcome.EXITED
            return None
        if result is Result.REFUSED or (
            result is Result.FAILED and self._attempt >= self._retry.attempts
        ):
            self._outcome = Outcome.ABANDONED
            return None
        if result is Result.FAILED:
            self._backoff = self._retry.delay(self._attempt)
            self._retry_at = now + self._backoff
            return WaitUntil(self._retry_at)
        if self._retry_at is not None:  # backing off before another attempt
            if now < self._retry_at:
                return WaitUntil(self._retry_at)
            self._retry_at = None
            self._attempt += 1
            again = self._taken[-1]
            assert isinstance(again, SendSignal)  # only a signal can fail
            return again
        while self._index < len(self._plan):
            step = self._plan[self._index]
            if isinstance(step, Wait):
                waiting = self._wait(now, step.seconds)
                if waiting is not None:
                    return waiting
            else:
                self._index += 1
                self._taken.append(step)
                self._attempt = 1
                return step
            self._index += 1
        if not self._plan:
            self._outcome = Outcome.NOTHING
            return None
        signals = [s for s in self._plan if isinstance(s, SendSignal)]
        if self._confirm is None or not signals:
            self._outcome = Outcome.DONE
            return None
        waiting = self._wait(now, self._confirm)
        if waiting is not None:
            return waiting
        lethal = signals[-1].signum == _SIGKILL
        self._outcome = Outcome.UNKILLABLE if lethal else Outcome.SURVIVED
        return None

    def _wait(self, now: float, seconds: float) -> WaitUntil | None:
        if self._deadline is None:
            self._deadline = now + seconds
        if now < self._deadline:
            return WaitUntil(self._deadline)
        self._deadline = None
        return None

    def __repr__(self) -> str:
        state = "running" if self._outcome is None else self._outcome.value
        where = f"step {self._index}/{len(self._plan)}"
        return f"<Escalator {state}: {where} of {format_plan(self._plan)}>"
