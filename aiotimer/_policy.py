"""Escalation policy: what to do about an expired timer, as data. Pure: no I/O, no clock.

How this works
--------------
When a timer expires the server asks the policy for a *plan*: a tuple of steps that the
server's shell carries out in order, emitting one event per step:

* :class:`DumpStacks` — ask the worker for a stack dump (bounded by ``timeout``);
* :class:`SendSignal` — send ``signum`` to the worker (or its whole process group);
* :class:`Wait` — wait up to ``seconds`` for the worker to exit; if it does, the rest of
  the plan is skipped.

Where the plan comes from (first rule that applies):

1. shadow mode (``ReapPolicy(shadow=True)``): ``()`` — nothing is done; the server
   reports what :meth:`ReapPolicy.intended` would have done;
2. report-only timer (its signal is ``<= 0``): ``()``;
3. no server ladder and no escalation key on the request: exactly
   ``(SendSignal(timer.signal),)``, as torch clients expect;
4. otherwise the effective :class:`Escalation` (the server's ladder, or one built from
   the request's own signal, merged with the request's ``grace``/``group``/``dump``
   keys; see :meth:`ReapPolicy.escalation_for`) rendered by :meth:`Escalation.steps`:
   ``[DumpStacks] -> [soft signal -> Wait(grace)] -> kill signal``.

The shell carries a plan out through an :class:`Escalator`: it performs the action the
escalator hands out, tells it what became of that action (a :class:`Result`) and gets the
next one. Failed signals are retried by the escalator too, with back-off
(:class:`ReapRetry`), and finally abandoned. Waits (grace periods, back-offs, the
confirmation window) come out of it as absolute deadlines (:class:`WaitUntil`), so the
shell only ever sleeps until a deadline or until the worker exits, whichever is first.
"""

from __future__ import annotations

import enum
import math
import signal as _signal
from collections.abc import Sequence
from dataclasses import dataclass

from aiotimer._table import Timer
from aiotimer.events import signal_name

__all__ = [
    "Action",
    "DumpStacks",
    "Escalation",
    "Escalator",
    "Outcome",
    "ReapPolicy",
    "ReapRetry",
    "Result",
    "SendSignal",
    "Step",
    "Wait",
    "WaitUntil",
    "format_plan",
]

_SIGKILL = int(_signal.SIGKILL)
_SIGTERM = int(_signal.SIGTERM)


@dataclass(frozen=True, slots=True)
class SendSignal:
    """Send ``signum`` to the worker, or to its process group when ``group``."""

    signum: int
    group: bool = False


@dataclass(frozen=True, slots=True)
class Wait:
    """Wait up to ``seconds`` for the worker to exit; stop escalating if it does."""

    seconds: float


@dataclass(frozen=True, slots=True)
class DumpStacks:
    """Ask the worker to dump its stacks; give up after ``timeout`` seconds."""

    timeout: float = 2.0


Step = SendSignal | Wait | DumpStacks


def _check_seconds(name: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class Escalation:
    """A reaping ladder: optional dump, optional soft signal and grace, then the kill.

    Rendered by :meth:`steps` as::

        DumpStacks(dump_timeout)                 if dump
        SendSignal(soft_signal, group)           if soft_signal is not None
        Wait(grace)                                and differs from kill_signal
        SendSignal(kill_signal, group)

    (a zero ``grace`` sends the soft signal and then the kill without waiting).
    ``group`` signals the worker's whole process group instead of the worker alone.

    Raises:
        ValueError: a negative or non-finite duration, or a signal number ``<= 0``.
    """

    dump: bool = False
    dump_timeout: float = 2.0
    soft_signal: int | None = _SIGTERM
    grace: float = 5.0
    kill_signal: int = _SIGKILL
    group: bool = False

    def __post_init__(self) -> None:
        _check_seconds("dump_timeout", self.dump_timeout)
        _check_seconds("grace", self.grace)
        if self.kill_signal <= 0:
            raise ValueError(f"kill_signal must be a signal number > 0, got {self.kill_signal}")
        if self.soft_signal is not None and self.soft_signal <= 0:
            raise ValueError(
                f"soft_signal must be a signal number > 0 or None, got {self.soft_signal}"
            )

    def steps(self) -> tuple[Step, ...]:
        """This ladder as a plan of steps (always ending with the kill signal)."""
        steps: list[Step] = []
        if self.dump:
            steps.append(DumpStacks(self.dump_timeout))
        if self.soft_signal is not None and self.soft_signal != self.kill_signal:
            steps.append(SendSignal(self.soft_signal, self.group))
            if self.grace > 0:
                steps.append(Wait(self.grace))
        steps.append(SendSignal(self.kill_signal, self.group))
        return tuple(steps)


class ReapPolicy:
    """Turns an expired :class:`~aiotimer.Timer` into a plan of steps.

    Args:
        default: the server-wide ladder, or ``None`` for torch semantics (each timer is
            reaped with exactly the signal its request names, unless the request asks
            for escalation with its extension keys).
        shadow: server-wide report-only mode: :meth:`plan` is always empty; the server
            reports :meth:`intended` as "would have done" instead.
        unkillable_after: how long an :class:`Escalator` made by :meth:`escalator` waits
            after the last step before it declares the worker unkillable (or surviving).

    The request's extension keys (``grace``, ``group``, ``dump``; see the protocol docs)
    are honoured through the timer's :class:`~aiotimer._table.ReapOptions`.
    """

    __slots__ = ("default", "shadow", "unkillable_after")

    def __init__(
        self,
        default: Escalation | None = None,
        *,
        shadow: bool = False,
        unkillable_after: float = 5.0,
    ) -> None:
        _check_seconds("unkillable_after", unkillable_after)
        self.default = default
        self.shadow = shadow
        self.unkillable_after = unkillable_after

    def escalation_for(self, timer: Timer) -> Escalation | None:
        """The effective ladder for ``timer``, or ``None`` for a plain single signal.

        With a server ladder, the request's ``grace`` replaces the ladder's grace and its
        ``group``/``dump`` keys add to the ladder's (a request cannot turn them off);
        the ladder's signals are used, the request's signal only decides reap (``> 0``)
        versus report. Without a server ladder, a request with any of those keys gets
        ``[dump] -> its own signal -> [Wait(grace) -> SIGKILL]``. ``None`` also for a
        report-only timer (signal ``<= 0``).
        """
        if timer.signal <= 0:
            return None
        options = timer.options
        grace = None if options is None else options.grace
        group = options is not None and options.group
        dump = options is not None and options.dump
        ladder = self.default
        if ladder is not None:
            return Escalation(
                dump=ladder.dump or dump,
                dump_timeout=ladder.dump_timeout,
                soft_signal=ladder.soft_signal,
                grace=ladder.grace if grace is None else grace,
                kill_signal=ladder.kill_signal,
                group=ladder.group or group,
            )
        if grace is None and not group and not dump:
            return None
        if grace is None:
            return Escalation(dump=dump, soft_signal=None, kill_signal=timer.signal, group=group)
        return Escalation(
            dump=dump, soft_signal=timer.signal, grace=grace, kill_signal=_SIGKILL, group=group
        )

    def intended(self, timer: Timer) -> tuple[Step, ...]:
        """The plan for ``timer`` ignoring shadow mode: what a real reap would do."""
        if timer.signal <= 0:
            return ()
        ladder = self.escalation_for(timer)
        if ladder is None:
            return (SendSignal(timer.signal),)
        return ladder.steps()

    def plan(self, timer: Timer) -> tuple[Step, ...]:
        """The steps to carry out for ``timer``, which has just expired (``()`` in shadow)."""
        if self.shadow:
            return ()
        return self.intended(timer)

    def escalator(self, timer: Timer, *, retry: ReapRetry | None = None) -> Escalator:
        """An :class:`Escalator` running :meth:`plan` for ``timer`` (failed signals
        retried as ``retry`` says)."""
        return Escalator(self.plan(timer), confirm=self.unkillable_after, retry=retry)

    def __repr__(self) -> str:
        mode = " shadow" if self.shadow else ""
        return f"<ReapPolicy{mode} default={self.default!r}>"


# -- carrying a plan out ------------------------------------------------------------------


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
            _check_seconds("confirm", confirm)
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


def format_plan(plan: Sequence[Step]) -> str:
    """A short human-readable rendering of a plan, for events and logs.

    >>> format_plan(Escalation(dump=True, group=True).steps())
    'dump stacks (2s) -> SIGTERM to group -> wait 5s -> SIGKILL to group'
    """
    if not plan:
        return "nothing (report only)"
    parts: list[str] = []
    for step in plan:
        if isinstance(step, DumpStacks):
            parts.append(f"dump stacks ({step.timeout:g}s)")
        elif isinstance(step, Wait):
            parts.append(f"wait {step.seconds:g}s")
        else:
            parts.append(signal_name(step.signum) + (" to group" if step.group else ""))
    return " -> ".join(parts)
