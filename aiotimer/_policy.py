"""Escalation policy: what to do about an expired timer, as data. Pure: no I/O, no clock.

How this works
--------------
When a timer expires the server asks the policy for a *plan*: a tuple of steps that the
server's shell carries out in order, emitting one event per step:

* :class:`DumpStacks` — ask the worker for a stack dump (bounded by ``timeout``);
* :class:`SendSignal` — send ``signum`` to the worker (or its whole process group);
* :class:`Wait` — wait up to ``seconds`` for the worker to exit; if it does, the rest of
  the plan is skipped.

An empty plan means "report only" (the timer's signal is ``<= 0``). With no ladder
configured and no escalation asked for by the request, the plan is exactly one
``SendSignal`` with the request's own signal, as torch clients expect.
"""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass

from aiotimer._protocol import Request
from aiotimer._table import Timer

__all__ = ["DumpStacks", "ReapPolicy", "SendSignal", "Step", "Wait"]


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


class ReapPolicy:
    """Turns an expired :class:`~aiotimer.Timer` into a plan of steps.

    The request's extension keys (``grace``, ``group``, ``dump``; see the protocol docs)
    are honoured when the timer's ``options`` holds its :class:`~aiotimer.Request`.
    """

    __slots__ = ()

    def plan(self, timer: Timer) -> tuple[Step, ...]:
        """The steps to carry out for ``timer``, which has just expired."""
        if timer.signal <= 0:
            return ()
        req = timer.options if isinstance(timer.options, Request) else None
        group = bool(req and req.group)
        steps: list[Step] = []
        if req is not None and req.dump:
            steps.append(DumpStacks())
        steps.append(SendSignal(timer.signal, group))
        if req is not None and req.grace is not None and timer.signal != _signal.SIGKILL:
            steps += [Wait(req.grace), SendSignal(_signal.SIGKILL, group)]
        return tuple(steps)
