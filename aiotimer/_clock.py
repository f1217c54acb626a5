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

__all__ = ["Clock", "MonotonicClock"]


@runtime_checkable
class Clock(Protocol):
    """What the server needs from time.

    ``monotonic()`` is the time base of every deadline the server keeps; ``time()`` is
    wall-clock epoch seconds, used only to translate the wire's ``expiration_time``;
    ``sleep_until()`` suspends the calling task until ``monotonic() >= deadline`` (it
    must be cancellable).
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


class MonotonicClock:
    """The production clock: ``time.monotonic``/``time.time`` and the event loop's sleep."""

    __slots__ = ()

    def monotonic(self) -> float:
        """Return ``time.monotonic()``."""
        return time.monotonic()

    def time(self) -> float:
        """Return ``time.time()``."""
        return time.time()

    async def sleep_until(self, deadline: float) -> None:
        """Sleep until ``time.monotonic() >= deadline`` (returns after a checkpoint if past)."""
        await anyio.sleep(max(0.0, deadline - time.monotonic()))

    def __repr__(self) -> str:
        return "MonotonicClock()"
