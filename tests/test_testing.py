"""The public test helpers' own rules: settle is exact, the fake clock jumps only when
every task is blocked."""

from __future__ import annotations

import asyncio
import time

import anyio
import pytest

from aiotimer.testing import FakeClock, settle


@pytest.mark.asyncio
async def test_settle_waits_for_a_chain_of_wakeups_and_costs_no_sleep() -> None:
    """A chain of tasks, each woken by the previous one through call_soon, all run
    before settle returns, and settling takes far less than one 0.1 s poll."""
    done: list[int] = []
    events = [asyncio.Event() for _ in range(30)]

    async def link(i: int) -> None:
        await events[i].wait()
        done.append(i)
        if i + 1 < len(events):
            asyncio.get_running_loop().call_soon(events[i + 1].set)

    tasks = [asyncio.create_task(link(i)) for i in range(len(events))]
    events[0].set()
    started = time.perf_counter()
    for _ in range(10):
        await settle()
    elapsed = time.perf_counter() - started
    assert done == list(range(len(events)))
    assert elapsed < 0.1  # anyio.wait_all_tasks_blocked() sleeps 0.1 s per busy check
    await asyncio.gather(*tasks)


@pytest.mark.asyncio
async def test_settle_refuses_to_wait_for_ever_on_a_busy_task() -> None:
    async def spin() -> None:
        while True:
            await asyncio.sleep(0)

    task = asyncio.create_task(spin())
    try:
        with pytest.raises(TimeoutError):
            await settle(timeout=0.05)
    finally:
        task.cancel()


@pytest.mark.asyncio
async def test_autojump_moves_time_to_each_deadline_only_when_all_are_blocked() -> None:
    clock = FakeClock()
    woke: list[float] = []

    async def sleeper(deadline: float) -> None:
        await clock.sleep_until(deadline)
        woke.append(clock.monotonic())

    async with clock.autojump(), anyio.create_task_group() as tg:
        for deadline in (30.0, 5.0, 3600.0):
            tg.start_soon(sleeper, deadline)
    assert woke == [5.0, 30.0, 3600.0]


@pytest.mark.asyncio
async def test_autojump_makes_a_timeout_fire_without_real_waiting() -> None:
    clock = FakeClock()
    started = time.perf_counter()
    async with clock.autojump():
        with anyio.move_on_after(5) as scope:  # a real timer: never reached
            await clock.sleep_until(60.0)
    assert not scope.cancelled_caught
    assert clock.monotonic() == 60.0
    assert time.perf_counter() - started < 1.0


@pytest.mark.asyncio
async def test_jump_returns_none_with_no_sleeper_and_the_deadline_otherwise() -> None:
    clock = FakeClock()
    assert await clock.jump() is None

    async def sleeper() -> None:
        await clock.sleep_until(7.5)

    async with anyio.create_task_group() as tg:
        tg.start_soon(sleeper)
        assert await clock.jump() == 7.5
    assert clock.monotonic() == 7.5
