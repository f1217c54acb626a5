"""What a timer is: the record the table orders, and what it asks of the reaper. Pure.

The table (:mod:`aiotimer.core._table`) keeps these in deadline order; the reap policy,
the journal and the events read them. Both records are immutable and untracked by the
cyclic garbage collector (see :class:`Timer`).
"""

from __future__ import annotations

import msgspec

__all__ = ["ReapOptions", "Timer", "TimerKey"]

#: A timer's identity: ``(pid, scope_id)``. Acquiring an existing key replaces its timer.
TimerKey = tuple[int, str]


class ReapOptions(msgspec.Struct, frozen=True, gc=False):
    """How a timer asks to be reaped beyond its signal (a request's extension keys).

    ``grace``: seconds between its signal and a SIGKILL (``None``: no escalation);
    ``group``: signal the worker's whole process group; ``dump``: dump the worker's
    stacks first. :class:`~aiotimer.ReapPolicy` turns them into a plan.
    """

    grace: float | None = None
    group: bool = False
    dump: bool = False


class Timer(msgspec.Struct, frozen=True, gc=False):
    """One live timer: worker ``pid``, its ``scope_id``, and what to do at ``deadline``.

    ``deadline`` and ``acquired_at`` are on the server's monotonic clock. ``signal`` is
    the signal the request named (``<= 0`` means report only). ``options`` holds the
    request's escalation keys, if it had any (the table never looks at them).
    ``kill_after`` is ``> 0`` for the second tier of an ``async with`` block: the block's
    own deadline, when the worker cancels its task, is ``kill_after`` seconds before
    ``deadline`` (:attr:`block_deadline`); ``deadline`` is when the server reaps.

    Immutable, and not tracked by the cyclic garbage collector (``gc=False``), nor are
    the table's entries holding it: 100k live timers would otherwise add ~200k objects
    to every full collection (~100 ms each on a small machine).
    """

    pid: int
    scope_id: str
    deadline: float
    signal: int
    acquired_at: float = 0.0
    options: ReapOptions | None = None
    kill_after: float = 0.0

    @property
    def key(self) -> TimerKey:
        """The ``(pid, scope_id)`` key of this timer."""
        return (self.pid, self.scope_id)

    @property
    def block_deadline(self) -> float:
        """The block's own deadline: ``deadline - kill_after`` (``deadline`` for a block
        of one tier)."""
        return self.deadline - self.kill_after
