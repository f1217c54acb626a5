"""Time, injected.

The server never reads a clock directly: it asks a :class:`Clock`. Production uses
:class:`MonotonicClock` (``time.monotonic`` for deadlines, ``time.time`` only to convert
torch's epoch deadlines); tests use :class:`aiotimer.testing.FakeClock`, which only moves
when told to, so timeout tests run instantly and never flake.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

import anyio
import anyio.lowlevel

__all__ = ["SLEEP_MARGIN", "Clock", "MonotonicClock"]


@runtime_checkable
class Clock(Protocol):
    """What the server needs from time.

    ``monotonic()`` is the time base of every deadline the server keeps; ``time()`` is
    wall-clock epoch seconds, used only to translate the wire's ``expiration_time``;
    ``sleep_until()`` suspends the calling task until ``monotonic() >= deadline`` (it
    must be cancellable, and must never return before the deadline: the server trusts it
    for expiry, grace periods and dump cut-offs).
    """

    def monotonic(self) -> float:
        """Return the current monotonic time in seconds."""
        ...

    def time(self) -> float:
        """Return the current wall-clock time in epoch seconds."""
        ...

    async def sleep_until(self, deadline: float) -> None:
        """Sleep until ``monotonic() >= deadline``."""
        ...


#: :meth:`MonotonicClock.sleep_until` sleeps on the event loop's timer until this many
#: seconds before the deadline, then yields to the loop (one iteration at a time, so I/O
#: goes on) until the deadline is reached. Loop timers have millisecond granularity:
#: uvloop rounds a delay to whole ms of a cached clock and may wake up to ~1 ms early;
#: asyncio rounds epoll's timeout up and wakes ~0.3 ms late on average, up to ~1.5 ms.
#: The price of waking at the deadline itself: up to this much CPU per sleep.
SLEEP_MARGIN = 0.001


class MonotonicClock:
    """The production clock: ``time.monotonic``/``time.time`` and the event loop's sleep.

    :meth:`sleep_until` never returns before its deadline, on asyncio and uvloop alike
    (see :data:`SLEEP_MARGIN`).
    """

    __slots__ = ()

    def monotonic(self) -> float:
        """Return ``time.monotonic()``."""
        return time.monotonic()

    def time(self) -> float:
        """Return ``time.time()``."""
        return time.time()

    async def sleep_until(self, deadline: float) -> None:
        """Sleep until ``time.monotonic() >= deadline`` (returns after a checkpoint if past).

        Never returns early: the loop's timer takes it to :data:`SLEEP_MARGIN` before the
        deadline (again, if that timer fired early), then it yields until the deadline.
        """
        while (left := deadline - time.monotonic()) > SLEEP_MARGIN:
            await anyio.sleep(left - SLEEP_MARGIN)
        await anyio.lowlevel.checkpoint()
        while time.monotonic() < deadline:
            await anyio.lowlevel.checkpoint()

    def __repr__(self) -> str:
        return "MonotonicClock()"
