"""The event bus: numbered history, bounded subscribers, the async callback's buffer."""

from __future__ import annotations

import anyio
import pytest
from _pids import fake_pid

from aiotimer.events import Event, ServerStarted, TimerEvicted, WorkerUnknown
from aiotimer.server._eventbus import EventBus
from aiotimer.testing import settle


def event(i: int) -> Event:
    return WorkerUnknown(time=float(i), pid=i, scope_id="s", source="test")


def test_history_is_numbered_and_bounded() -> None:
    bus = EventBus(history=3)
    for i in range(5):
        bus.publish(event(i))
    got, missed = bus.since(0, 10)
    assert [n for n, _ in got] == [3, 4, 5] and missed == 2
    got, missed = bus.since(3, 10)
    assert [n for n, _ in got] == [4, 5] and missed == 0
    assert bus.since(5, 10) == ([], 0)
    assert [n for n, _ in bus.since(0, 1)[0]] == [3]


def test_reaps_and_refusals_are_kept_apart_from_a_flood_of_other_events() -> None:
    bus = EventBus(history=3, incidents=2)
    bus.publish(event(0))  # worker_unknown: a refusal
    for i in range(1, 10):
        bus.publish(ServerStarted(time=float(i), pid=i, sources=()))  # not an incident
    bus.publish(event(10))
    bus.publish(event(11))
    assert [n for n, _ in bus.incidents] == [11, 12]  # the newest two, numbered as events
    assert [n for n, _ in bus.since(0, 10)[0]] == [10, 11, 12]


def test_a_timer_dropped_from_a_full_table_is_an_incident() -> None:
    """An eviction leaves a block unwatched: `aiotimer status` lists it with the rest."""
    bus = EventBus()
    evicted = TimerEvicted(time=1.0, pid=fake_pid(1), scope_id="leak", holds=9,
                           for_pid=fake_pid(2), max_timers=10)  # fmt: skip
    bus.publish(evicted)
    assert bus.incidents[-1][1] is evicted


@pytest.mark.asyncio
async def test_a_slow_subscriber_loses_events_but_never_blocks() -> None:
    bus = EventBus(buffer=2)
    seen: list[float] = []

    async def read() -> None:
        async for e in bus.subscribe():
            seen.append(e.time)

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        await settle()
        for i in range(5):  # no checkpoint: the reader cannot keep up
            bus.publish(event(i))
        assert bus.dropped == 2  # the waiting reader took one, the buffer two
        bus.close()
    assert seen == [0.0, 1.0, 2.0]
