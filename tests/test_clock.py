from __future__ import annotations

import math
import random
import time
from collections.abc import Awaitable

import anyio
import pytest

from aiotimer import Clock, MonotonicClock
from aiotimer._edges.clock import open_alarm, run_until
from aiotimer.testing import FakeClock, settle


def test_clocks_satisfy_protocol() -> None:
    assert isinstance(MonotonicClock(), Clock)
    assert isinstance(FakeClock(), Clock)


def test_fake_clock_moves_only_when_told() -> None:
    clock = FakeClock(start=5.0, wall_offset=1000.0)
    assert clock.monotonic() == 5.0
    assert clock.time() == 1005.0
    clock.advance(2.5)
    assert clock.monotonic() == 7.5
    clock.step_wall(-100.0)
    assert clock.monotonic() == 7.5
    assert clock.time() == 907.5
    with pytest.raises(ValueError, match="only moves forward"):
        clock.advance(-1)


@pytest.mark.asyncio
async def test_fake_clock_sleep_until_wakes_on_advance() -> None:
    clock = FakeClock()
    woke: list[float] = []

    async def sleeper(deadline: float) -> None:
        await clock.sleep_until(deadline)
        woke.append(clock.monotonic())

    async with anyio.create_task_group() as tg:
        tg.start_soon(sleeper, 3.0)
        tg.start_soon(sleeper, 1.0)
        await settle()
        assert clock.next_wakeup() == 1.0
        clock.advance(1.0)
        await settle()
        assert woke == [1.0]
        clock.advance(5.0)
    assert woke == [1.0, 6.0]
    assert clock.next_wakeup() is None


@pytest.mark.asyncio
async def test_monotonic_clock_sleep_until() -> None:
    clock = MonotonicClock()
    start = time.monotonic()
    await clock.sleep_until(start + 0.02)
    assert time.monotonic() >= start + 0.02
    with anyio.fail_after(1):
        await clock.sleep_until(start - 10)  # in the past: returns at once


@pytest.mark.timeout(30)
@pytest.mark.asyncio
async def test_monotonic_clock_never_wakes_before_the_deadline() -> None:
    # uvloop's timers round to whole milliseconds of a cached clock and may fire up to
    # ~1 ms early; sleep_until must hide that. Sleeps of 0-3 ms, both sides of the margin.
    # A plain asyncio.sleep() on uvloop wakes early in ~40% of these (389 of 1,000 here),
    # so 200 of them cannot all miss a lost margin.
    clock = MonotonicClock()
    rng = random.Random(1)
    early: list[float] = []
    for _ in range(200):
        deadline = time.monotonic() + rng.uniform(0.0, 0.003)
        await clock.sleep_until(deadline)
        woke = time.monotonic()
        if woke < deadline:
            early.append(deadline - woke)
    assert early == []


@pytest.mark.asyncio
async def test_monotonic_clock_sleep_until_is_cancellable() -> None:
    clock = MonotonicClock()
    with anyio.move_on_after(0.01) as scope:
        await clock.sleep_until(time.monotonic() + 60)
    assert scope.cancelled_caught


@pytest.mark.asyncio
async def test_monotonic_alarm_follows_its_deadline_and_never_fires_early() -> None:
    # The expiry task's alarm: moved later (the earliest timer was released) it does
    # not fire at the old deadline; moved earlier it fires at the new one; never early.
    # The old deadline leaves the waiter 0.3 s to start waiting, so a loaded host does
    # not let it pass before it is moved.
    woke: list[float] = []
    with open_alarm(MonotonicClock()) as alarm:

        async def waiter() -> None:
            await alarm.wait()
            woke.append(time.monotonic())

        start = time.monotonic()
        alarm.set(start + 0.3)
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await settle()
            alarm.set(start + 60)  # later: the waiter sleeps on
            assert time.monotonic() < start + 0.3, "moved only after the old deadline"
            await anyio.sleep(start + 0.4 - time.monotonic())  # past the old deadline
            assert woke == []
            earlier = time.monotonic() + 0.02
            alarm.set(earlier)  # earlier than the last one
        assert woke and woke[0] >= earlier
        alarm.set(math.inf)
        with anyio.move_on_after(0.05) as scope:
            await alarm.wait()
        assert scope.cancelled_caught


@pytest.mark.asyncio
async def test_fake_clock_alarm_wakes_at_the_deadline_last_set() -> None:
    clock = FakeClock()
    woke: list[float] = []
    with open_alarm(clock) as alarm:

        async def waiter() -> None:
            await alarm.wait()
            woke.append(clock.monotonic())

        alarm.set(5.0)
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await settle()
            alarm.set(8.0)
            clock.advance(6.0)
            await settle()
            assert woke == []
            alarm.set(7.0)  # earlier: the sleep is cut short and starts again
            await settle()
            assert woke == [] and clock.next_wakeup() == 7.0
            clock.advance(1.0)
        assert woke == [7.0]


@pytest.mark.asyncio
async def test_monotonic_alarm_takes_any_deadline() -> None:
    # A deadline beyond the kernel's range (a far-off acquire) is armed as never.
    with open_alarm(MonotonicClock()) as alarm:
        for deadline in (1e12, 1e300, -5.0, time.monotonic() + 0.01):
            alarm.set(deadline)
        with anyio.fail_after(5):
            await alarm.wait()


@pytest.mark.timeout(30)
@pytest.mark.asyncio
async def test_run_until_gives_up_at_the_deadline_never_before() -> None:
    clock = MonotonicClock()
    for delay in (0.0, 0.0004, 0.003, 0.0125):
        deadline = time.monotonic() + delay
        assert not await run_until(clock, deadline, anyio.sleep_forever)
        assert time.monotonic() >= deadline


@pytest.mark.timeout(30)
@pytest.mark.asyncio
async def test_run_until_returns_when_the_work_ends_first_and_leaves_no_timer() -> None:
    clock = MonotonicClock()
    ran: list[str] = []

    async def work() -> None:
        await anyio.sleep(0.001)
        ran.append("done")

    assert await run_until(clock, time.monotonic() + 60, work)
    assert ran == ["done"]
    # The loop's timer went with it: a later sleep in the same scope is not cancelled.
    with anyio.CancelScope() as scope:
        await anyio.sleep(0.01)
    assert not scope.cancelled_caught


@pytest.mark.asyncio
async def test_run_until_on_an_injected_clock_waits_for_that_clock() -> None:
    clock = FakeClock()
    results: list[bool] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: _record(results, run_until(clock, 5.0, anyio.sleep_forever)))
        await settle()
        clock.advance(4.9)
        await settle()
        assert results == []
        clock.advance(0.1)
        await settle()
        assert results == [False]


async def _record(results: list[bool], result: Awaitable[bool]) -> None:
    results.append(await result)
