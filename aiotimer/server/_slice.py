"""One slice of expired timers as the server's machine acts on it
(:mod:`aiotimer.server._machine`): its record, and what each expiry reports. Pure: no
I/O, no clock.

A timer's :class:`~aiotimer.events.TimerExpired` says what was done about it
(:func:`expiry`): the plan carried out, or why nothing was: the block runs on (an
empty plan: report only, the shadow mode's intended plan named), the server's own
process (never signalled), a worker still unpinned (its identity cannot be proven).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiotimer.core import Timer
from aiotimer.events import TimerExpired
from aiotimer.reapers import ReapPolicy, Step, format_plan
from aiotimer.server._effects import Acted
from aiotimer.server._learning import Learning

__all__ = ["Begun", "Slice", "expiry", "known_due"]

_OUT_OF_DESCRIPTORS = (
    "nothing: the server ran out of file descriptors and cannot prove the worker's "
    "identity (see the log)"
)


def known_due(timer: Timer) -> float:
    """When the server could first act on ``timer``: its deadline, or its arrival when
    it arrived already past its deadline (the loop is not late for a request that was).
    Loop lag and reap latency run from here; :attr:`TimerExpired.late` from the deadline.
    """
    return max(timer.deadline, timer.acquired_at)


@dataclass(slots=True, eq=False)
class Begun:
    """A reap begun in the current slice: the scopes it covers so far."""

    scopes: list[str]
    folded: int = 0  # timers of the same slice beyond those listed


@dataclass(slots=True, eq=False)
class Slice:
    """One slice of expired timers being acted on, at ``now`` (``wall``)."""

    now: float
    wall: float
    expired: list[Timer]
    index: int = 0  # the next timer to act on
    #: pid -> the reap begun in this slice.
    begun: dict[int, Begun] = field(default_factory=dict)
    #: The timer asked about (:class:`~aiotimer.server._effects.ActOn`), and its plan.
    asked: tuple[Timer, tuple[Step, ...]] | None = None


def expiry(
    timer: Timer,
    plan: tuple[Step, ...],
    how: Acted,
    work: Slice,
    *,
    policy: ReapPolicy,
    learning: Learning,
) -> TimerExpired:
    """The report of ``timer``'s expiry, acted on with ``plan`` as ``how`` says
    (:attr:`Acted.UNWATCHED`: the server's own process)."""
    report_only = not plan or how is Acted.UNPINNED or how is Acted.UNWATCHED
    if how is Acted.UNWATCHED:
        action = format_plan(())
        if timer.signal > 0:
            action = "nothing: the server never signals its own process"
    elif how is Acted.UNPINNED:
        action = _OUT_OF_DESCRIPTORS
    elif not plan and policy.shadow and timer.signal > 0:
        action = "nothing (shadow mode); would do: " + format_plan(policy.intended(timer))
    else:
        action = format_plan(plan)
    learned, samples = learning.expired(timer) or (None, 0)
    return TimerExpired(
        time=work.wall,
        pid=timer.pid,
        scope_id=timer.scope_id,
        signal=timer.signal,
        late=work.now - timer.deadline,
        report_only=report_only,
        action=action,
        kill_after=timer.kill_after,
        learned=learned,
        learned_samples=samples,
    )
