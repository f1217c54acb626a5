"""Time, injected.

The server never reads a clock directly: it asks a :class:`Clock`. Production uses
:class:`MonotonicClock` (``time.monotonic`` for deadlines, ``time.time`` only to convert
torch's epoch deadlines); tests use :class:`aiotimer.testing.FakeClock`, which only moves
when told to, so timeout tests run instantly and never flake.

Waking at a deadline: on Linux under asyncio (or uvloop) :class:`MonotonicClock` waits on
a ``timerfd`` (:mod:`aiotimer._edges.timerfd`), which fires :data:`WAKE_EARLY` before the
deadline, to the kernel's timer resolution, and costs nothing until then; the task then
yields until the deadline. Elsewhere it sleeps on the loop's timer until
:data:`SLEEP_MARGIN` before the deadline and yields until the deadline. A task that
sleeps until a deadline which keeps moving (the expiry task: until the table's next
deadline) holds an :class:`Alarm` (:func:`open_alarm`): re-arming a timerfd is one
system call and wakes nobody.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Protocol, runtime_checkable

import anyio
import anyio.lowlevel

from aiotimer._edges.timerfd import TimerFd, open_timerfd

__all__ = [
    "SLEEP_MARGIN",
    "WAKE_EARLY",
    "Alarm",
    "Clock",
    "MonotonicClock",
    "open_alarm",
    "run_until",
]


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


#: Without a timerfd, :meth:`MonotonicClock.sleep_until` sleeps on the event loop's timer
#: until this many seconds before the deadline, then yields to the loop (one iteration at
#: a time, so I/O goes on) until the deadline is reached. Loop timers have millisecond
#: granularity: uvloop rounds a delay to whole ms of a cached clock and may wake up to ~1 ms early;
#: asyncio rounds epoll's timeout up and wakes ~0.3 ms late on average, up to ~1.5 ms.
#: The price of waking at the deadline itself: up to this much CPU per sleep.
SLEEP_MARGIN = 0.001
#: A timerfd alarm fires this many seconds before its deadline, and its task yields to
#: the loop from then until the deadline, as the loop-timer path does from
#: :data:`SLEEP_MARGIN` on: waking a sleeping thread and resuming its task takes
#: ~0.1-0.2 ms unloaded and more on a busy host, which would otherwise be added to every
#: reap (``python -m benchmarks.bench_reap_latency``: p50 0.15 ms with a timerfd firing at
#: the deadline, 0.03 ms with this). The price: up to this much CPU per deadline reached.
WAKE_EARLY = SLEEP_MARGIN


class MonotonicClock:
    """The production clock: ``time.monotonic``/``time.time`` and the event loop's sleep.

    :meth:`sleep_until` never returns before its deadline, on asyncio and uvloop alike
    (see the module docs).
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

        Never returns early: a timerfd fires at the deadline; without one, the loop's
        timer takes it to :data:`SLEEP_MARGIN` before the deadline (again, if that timer
        fired early), then it yields until the deadline.
        """
        if deadline > time.monotonic():
            with _monotonic_alarm(self) as alarm:
                alarm.set(deadline)
                await alarm.wait()
            return
        await anyio.lowlevel.checkpoint()

    async def _sleep_until_by_loop(self, deadline: float) -> None:
        while (left := deadline - time.monotonic()) > SLEEP_MARGIN:
            await anyio.sleep(left - SLEEP_MARGIN)
        await anyio.lowlevel.checkpoint()
        while time.monotonic() < deadline:
            await anyio.lowlevel.checkpoint()

    def __repr__(self) -> str:
        return "MonotonicClock()"


class Alarm(Protocol):
    """A re-armable wake-up for one task at a deadline of its clock (see the module
    docs); a context manager that releases what it holds."""

    def set(self, deadline: float) -> None:
        """Wake the waiter once the clock reaches ``deadline`` (``math.inf``: never);
        replaces the previous deadline, whether or not a task waits."""
        ...

    async def wait(self) -> None:
        """Return once the clock has reached the deadline last set (at once if it has);
        cancellable."""
        ...

    def __enter__(self) -> Alarm: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


def open_alarm(clock: Clock) -> Alarm:
    """An :class:`Alarm` on ``clock``: a timerfd for a :class:`MonotonicClock` in an
    asyncio loop on Linux, else one that sleeps with ``clock.sleep_until``.

    Raises:
        OSError: no descriptor for the timerfd (out of descriptors).
    """
    if type(clock) is MonotonicClock:
        return _monotonic_alarm(clock)
    return _SleepAlarm(clock, clock.sleep_until)


def _monotonic_alarm(clock: MonotonicClock) -> Alarm:
    loop = _running_asyncio_loop()
    timerfd = open_timerfd() if loop is not None else None
    if loop is not None and timerfd is not None:
        return _TimerfdAlarm(loop, timerfd)
    return _SleepAlarm(clock, clock._sleep_until_by_loop)


class _TimerfdAlarm:
    """An alarm on a timerfd watched by the loop: ``set`` is one ``timerfd_settime``."""

    __slots__ = ("_deadline", "_loop", "_timerfd", "_waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop, timerfd: TimerFd) -> None:
        self._loop = loop
        self._timerfd = timerfd
        self._deadline = math.inf
        self._waiter: asyncio.Future[None] | None = None
        loop.add_reader(timerfd.fd, self._fired)

    def set(self, deadline: float) -> None:
        if deadline != self._deadline:
            self._deadline = deadline
            self._timerfd.arm(deadline - WAKE_EARLY)

    def _fired(self) -> None:
        self._timerfd.clear()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        yielded = False
        while (left := self._deadline - time.monotonic()) > 0:
            if left > WAKE_EARLY:  # the timerfd fires WAKE_EARLY before the deadline
                self._waiter = self._loop.create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
            else:  # awake: yield to the loop (its I/O goes on) until the deadline
                await asyncio.sleep(0)
            yielded = True
        if not yielded:
            await anyio.lowlevel.checkpoint()

    def __enter__(self) -> _TimerfdAlarm:
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.remove_reader(self._timerfd.fd)
        self._timerfd.close()


class _SleepAlarm:
    """An alarm that sleeps with ``sleep_until`` in a cancel scope; ``set`` to an
    earlier deadline cancels the sleep, a later one waits for it to end."""

    __slots__ = ("_clock", "_deadline", "_scope", "_sleep_until")

    def __init__(self, clock: Clock, sleep_until: _SleepUntil) -> None:
        self._clock = clock
        self._sleep_until = sleep_until
        self._deadline = math.inf
        self._scope: anyio.CancelScope | None = None

    def set(self, deadline: float) -> None:
        earlier = deadline < self._deadline
        self._deadline = deadline
        if earlier and self._scope is not None:
            self._scope.cancel()

    async def wait(self) -> None:
        while (deadline := self._deadline) > self._clock.monotonic():
            with anyio.CancelScope() as self._scope:
                if deadline == math.inf:
                    await anyio.sleep_forever()
                else:
                    await self._sleep_until(deadline)
            self._scope = None
        await anyio.lowlevel.checkpoint()

    def __enter__(self) -> _SleepAlarm:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


async def run_until(clock: Clock, deadline: float, work: Callable[[], Awaitable[object]]) -> bool:
    """Run ``work()`` until it returns (``True``) or ``clock`` reaches ``deadline``
    (``False``: ``work()`` was cancelled there, never before).

    For a :class:`MonotonicClock` under asyncio this is one loop timer, set
    :data:`SLEEP_MARGIN` past the deadline and set again if the loop fires it early: no
    task and no descriptor, where a reap waits for its worker's exit. Other clocks (and
    trio) race ``work()`` against ``clock.sleep_until`` in a task group.
    """
    loop = _running_asyncio_loop() if type(clock) is MonotonicClock else None
    if loop is None:
        return await _race_sleep(clock, deadline, work)
    with anyio.CancelScope() as scope:
        timer: list[asyncio.TimerHandle] = []

        def fire() -> None:
            left = deadline - time.monotonic()
            if left > 0:  # the loop's timer fired early (uvloop rounds to whole ms)
                timer[0] = loop.call_later(left + SLEEP_MARGIN, fire)
            else:
                scope.cancel()

        timer.append(loop.call_later(max(deadline - time.monotonic(), 0.0) + SLEEP_MARGIN, fire))
        try:
            await work()
            return True
        finally:
            timer[0].cancel()
    return False


def _running_asyncio_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # not asyncio (trio through anyio)
        return None


async def _race_sleep(clock: Clock, deadline: float, work: Callable[[], Awaitable[object]]) -> bool:
    finished = False
    async with anyio.create_task_group() as tg:

        async def time_out() -> None:
            await clock.sleep_until(deadline)
            tg.cancel_scope.cancel()

        tg.start_soon(time_out)
        await work()
        finished = True
        tg.cancel_scope.cancel()
    return finished


class _SleepUntil(Protocol):
    async def __call__(self, deadline: float) -> None: ...
