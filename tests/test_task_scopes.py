"""A stack dump names the task that holds the loop with its open blocks (so a blocked
loop's culprit is found, whatever block's deadline led to the reap), and every call of a
decorated coroutine function names its task. Unit layer: a recording client; async
tests run on asyncio and uvloop (conftest)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Iterator

import pytest

from aiotimer.client import _dump_hook as diagnostics
from aiotimer.client import expires
from aiotimer.client._task_stacks import format_tasks
from aiotimer.core._scope import scope_site
from aiotimer.testing import RecordingClient
from aiotimer.wire import Request


@pytest.mark.asyncio
async def test_each_call_of_a_decorated_coroutine_names_its_task() -> None:
    client = RecordingClient()

    @expires(after=30, client=client)
    async def fetch() -> None:
        await asyncio.sleep(0)

    await asyncio.gather(
        asyncio.create_task(fetch(), name="a"), asyncio.create_task(fetch(), name="b")
    )
    scopes = {r.scope_id for r in client.requests}
    assert len(scopes) == 2
    assert {s.rpartition("@")[2] for s in scopes} == {"a", "b"}
    assert len({scope_site(s) for s in scopes}) == 1


def test_the_sync_face_does_not_name_a_task() -> None:
    client = RecordingClient()
    with expires(after=30, client=client) as block:
        pass
    assert "@" not in block.scope


@pytest.mark.asyncio
async def test_the_dump_names_the_task_that_holds_the_loop_and_its_blocks() -> None:
    client = RecordingClient()
    seen: list[str] = []

    async def idle() -> None:
        async with expires(after=30, client=client):
            await asyncio.Event().wait()

    async def hog() -> None:
        async with expires(after=30, client=client) as block:
            # What the dump hook does from its signal handler while this task runs.
            seen.append(block.scope)
            seen.append(format_tasks(asyncio.get_running_loop(), current_frame=sys._getframe()))

    idler = asyncio.create_task(idle(), name="idle")
    await asyncio.sleep(0)
    await asyncio.create_task(hog(), name="hog")
    idler.cancel()
    scope, text = seen
    lines = text.splitlines()
    assert lines[1] == f"The loop is held by task 'hog', in aiotimer block(s) {scope}"
    idle_at = lines.index("Task 'idle' (pending):")
    assert lines[idle_at + 1].startswith("    open aiotimer block(s): ")
    assert lines[idle_at + 1].endswith("@idle")


@pytest.mark.asyncio
async def test_a_dump_with_no_running_task_says_so() -> None:
    async def idle() -> None:
        await asyncio.Event().wait()

    task = asyncio.create_task(idle(), name="idle")
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    done: asyncio.Future[str] = loop.create_future()
    loop.call_soon(lambda: done.set_result(format_tasks(loop)))  # a callback, not a task
    text = await done
    task.cancel()
    assert "No task is running" in text.splitlines()[1]


class SlowReleaseClient(RecordingClient):
    """A release that has to wait (a full pipe, a reconnect), as long as ``wait``."""

    def __init__(self, wait: float) -> None:
        super().__init__()
        self.wait = wait

    async def send_async(self, request: Request) -> None:
        if request.is_release:
            await asyncio.sleep(self.wait)
        self.send(request)


@pytest.mark.asyncio
async def test_a_release_that_waits_past_the_deadline_is_not_cancelled_by_it() -> None:
    """The body finished in time: the block's deadline must not cancel the release, nor
    turn the finished block into a cancellation or a timeout."""
    client = SlowReleaseClient(wait=0.3)
    async with expires(after=0.1, client=client) as block:
        pass  # done at once; the release then waits past the deadline
    assert [r.is_release for r in client.requests] == [False, True]
    assert block.remaining() is not None and block.remaining() < 0  # it did pass
    await asyncio.sleep(0)  # no cancellation is pending for this task either


def test_a_generator_function_cannot_be_decorated() -> None:
    """Calling it would only create the generator: its work would go untimed."""

    def numbers() -> Iterator[int]:
        yield 1

    async def stream() -> AsyncIterator[int]:
        yield 1

    for func in (numbers, stream):
        with pytest.raises(TypeError, match="generator function"):
            expires(after=1, client=RecordingClient())(func)


@pytest.mark.asyncio
async def test_a_two_tier_block_asks_for_a_dump_when_the_process_has_the_hook(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its reap means a blocked loop: the dump is what names the task holding it."""
    client = RecordingClient()
    async with expires(after=30, client=client):
        pass
    monkeypatch.setattr(diagnostics, "_hook", object())  # as install_dump_handler() does
    async with expires(after=30, client=client):
        pass
    async with expires(after=30, client=client, kill_after=0):
        pass
    with expires(after=30, client=client):
        pass
    assert [r.dump for r in client.acquires()] == [False, True, False, False]
