"""What a timer is: the record the table orders, holding the request it was made of. Pure.

The table (:mod:`aiotimer.core._table`) keeps these in deadline order; the reap policy,
the journal and the views read them. A timer keeps the wire :class:`~aiotimer.wire.Request`
that set it (:attr:`Timer.request`): how it asks to be reaped (``grace``, ``group``,
``dump``), its two tiers (``kill_after``) and whatever key the wire grows next are read
from that one record, never copied field by field. Immutable and untracked by the
cyclic garbage collector (see :class:`Timer`).
"""

from __future__ import annotations

import msgspec

from aiotimer.wire import Request

__all__ = ["Timer", "TimerKey"]

#: A timer's identity: ``(pid, scope_id)``. Acquiring an existing key replaces its timer.
TimerKey = tuple[int, str]


class Timer(msgspec.Struct, frozen=True, gc=False):
    """One live timer: worker ``pid``, its ``scope_id``, and what to do at ``deadline``.

    ``deadline`` and ``acquired_at`` are on the server's monotonic clock. ``signal`` is
    the signal the request named (``<= 0`` means report only). ``request`` is the wire
    record that set the timer (``None`` for a timer built by hand, as in tests: no
    extension keys); the table never looks at it. ``pid``, ``scope_id`` and ``signal``
    are the table's key and order, kept beside it so the hot paths read no nested record.

    Immutable, and not tracked by the cyclic garbage collector (``gc=False``), nor are
    the table's entries holding it: 100k live timers would otherwise add ~200k objects
    to every full collection (~100 ms each on a small machine).
    """

    pid: int
    scope_id: str
    deadline: float
    signal: int
    acquired_at: float = 0.0
    request: Request | None = None

    @property
    def key(self) -> TimerKey:
        """The ``(pid, scope_id)`` key of this timer."""
        return (self.pid, self.scope_id)

    @property
    def kill_after(self) -> float:
        """``> 0`` for the second tier of an ``async with`` block: the block's own
        deadline, when the worker cancels its task, is ``kill_after`` seconds before
        ``deadline`` (when the server reaps); ``0.0`` for a block of one tier."""
        request = self.request
        return 0.0 if request is None or request.kill_after is None else request.kill_after

    @property
    def block_deadline(self) -> float:
        """The block's own deadline: ``deadline - kill_after`` (``deadline`` for a block
        of one tier)."""
        return self.deadline - self.kill_after
