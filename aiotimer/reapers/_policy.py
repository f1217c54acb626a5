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

The steps are defined in :mod:`aiotimer.reapers._steps`; the shell carries a plan out through an
:class:`~aiotimer.reapers._escalator.Escalator` (:meth:`ReapPolicy.escalator`).
"""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass

from aiotimer.core import Timer
from aiotimer.reapers._escalator import Escalator, ReapRetry
from aiotimer.reapers._steps import DumpStacks, SendSignal, Step, Wait, check_seconds

__all__ = ["Escalation", "ReapPolicy"]

_SIGKILL = int(_signal.SIGKILL)
_SIGTERM = int(_signal.SIGTERM)


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
        check_seconds("dump_timeout", self.dump_timeout)
        check_seconds("grace", self.grace)
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
    """Turns an expired :class:`~aiotimer.core.Timer` into a plan of steps.

    Args:
        default: the server-wide ladder, or ``None`` for torch semantics (each timer is
            reaped with exactly the signal its request names, unless the request asks
            for escalation with its extension keys).
        shadow: server-wide report-only mode: :meth:`plan` is always empty; the server
            reports :meth:`intended` as "would have done" instead.
        unkillable_after: how long an :class:`Escalator` made by :meth:`escalator` waits
            after the last step before it declares the worker unkillable (or surviving).

    The request's extension keys (``grace``, ``group``, ``dump``; see the protocol docs)
    are read from the request that set the timer (:attr:`~aiotimer.core.Timer.request`).
    """

    __slots__ = ("default", "shadow", "unkillable_after")

    def __init__(
        self,
        default: Escalation | None = None,
        *,
        shadow: bool = False,
        unkillable_after: float = 5.0,
    ) -> None:
        check_seconds("unkillable_after", unkillable_after)
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
        request = timer.request
        grace = None if request is None else request.grace
        group = request is not None and request.group
        dump = request is not None and request.dump
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
