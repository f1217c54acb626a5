"""Public test helpers: deterministic fakes for aiotimer and for code that uses it.

* :class:`FakeClock` — a :class:`~aiotimer.Clock` that moves only when told to.
"""

from __future__ import annotations

import heapq
import itertools

import anyio

__all__ = ["FakeClock"]


class FakeClock:
    """A manual clock for tests: ``monotonic()`` starts at ``start`` and moves by ``advance``.

    ``time()`` is ``monotonic() + wall_offset``; :meth:`step_wall` changes the offset to
    simulate a wall-clock step (NTP, a VM resume) without moving monotonic time.
    Tasks in :meth:`sleep_until` wake when an ``advance`` reaches their deadline. Use it
    from the event loop's thread only.
    """

    def __init__(self, start: float = 0.0, *, wall_offset: float = 1_700_000_000.0) -> None:
        self._now = float(start)
        self._wall_offset = float(wall_offset)
        self._sleepers: list[tuple[float, int, anyio.Event]] = []
        self._seq = itertools.count()

    def monotonic(self) -> float:
        """The fake monotonic time."""
        return self._now

    def time(self) -> float:
        """The fake wall-clock time: ``monotonic() + wall_offset``."""
        return self._now + self._wall_offset

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (>= 0) and wake the sleepers now due."""
        if not seconds >= 0:
            raise ValueError(f"a clock only moves forward; got advance({seconds!r})")
        self._now += seconds
        while self._sleepers and self._sleepers[0][0] <= self._now:
            heapq.heappop(self._sleepers)[2].set()

    def step_wall(self, seconds: float) -> None:
        """Step the wall clock by ``seconds`` (may be negative); monotonic time is unchanged."""
        self._wall_offset += seconds

    def next_wakeup(self) -> float | None:
        """The earliest deadline a task is sleeping until, or ``None``."""
        return self._sleepers[0][0] if self._sleepers else None

    async def sleep_until(self, deadline: float) -> None:
        """Suspend until :meth:`advance` brings ``monotonic()`` to ``deadline``."""
        if deadline <= self._now:
            await anyio.lowlevel.checkpoint()
            return
        event = anyio.Event()
        heapq.heappush(self._sleepers, (deadline, next(self._seq), event))
        await event.wait()

    def __repr__(self) -> str:
        return f"<FakeClock monotonic={self._now:.6f} sleepers={len(self._sleepers)}>"
