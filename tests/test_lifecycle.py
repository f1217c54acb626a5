"""The owned-task lifecycle the server, the supervisor and the control plane share:
its transitions, what start() raises, cancellation, misuse, crashes."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

import anyio
import pytest

from aiotimer._edges.lifecycle import TRANSITIONS, LifecycleState, OwnedTask, unwrap
from aiotimer.errors import ServerStateError, SourceError

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(10)]


class Body:
    """A body that records the states it saw and can be told to fail."""

    def __init__(self, life: OwnedTask, *, fail_before: bool = False) -> None:
        self.life = life
        self.fail_before = fail_before
        self.seen: list[str] = []
        self.cleaned = False

    async def __call__(self, ready: Callable[[], None]) -> None:
        try:
            self.seen.append(repr(self.life))
            async with anyio.create_task_group() as tg:
                if self.fail_before:
                    raise SourceError("cannot open")
                tg.start_soon(anyio.sleep_forever)
                ready()
                await self.life.wait_stop_requested()
                self.seen.append(repr(self.life))
                tg.cancel_scope.cancel()
        finally:
            self.cleaned = True


async def test_a_life_goes_through_every_state() -> None:
    life = OwnedTask("widget")
    body = Body(life)
    assert life.state is LifecycleState.CREATED and repr(life) == "<OwnedTask widget created>"
    await life.aclose()  # closing what never started is a no-op
    assert life.state is LifecycleState.CREATED
    await life.start(body, name="widget")
    assert life.state is LifecycleState.RUNNING and not life.stop_requested
    await life.aclose()
    await life.aclose()  # idempotent
    assert life.state is LifecycleState.STOPPED and body.cleaned and life.stop_requested
    assert body.seen == ["<OwnedTask widget starting>", "<OwnedTask widget stopping>"]
    assert TRANSITIONS[LifecycleState.STOPPED] == {LifecycleState.STARTING}


async def test_starting_twice_and_restarting() -> None:
    life = OwnedTask("widget")
    await life.start(Body(life), name="widget")
    with pytest.raises(ServerStateError, match="cannot start a running widget"):
        await life.start(Body(life), name="widget")
    await life.aclose()
    await life.start(Body(life), name="widget")  # restartable: a second life
    assert life.state is LifecycleState.RUNNING and not life.stop_requested
    await life.aclose()

    once = OwnedTask("supervisor", restartable=False)
    await once.start(Body(once), name="once")
    await once.aclose()
    with pytest.raises(ServerStateError, match="cannot start a stopped supervisor"):
        await once.start(Body(once), name="once")


async def test_a_failure_before_ready_is_raised_unwrapped() -> None:
    life = OwnedTask("widget")
    body = Body(life, fail_before=True)
    with pytest.raises(SourceError, match="cannot open"):  # not an ExceptionGroup
        await life.start(body, name="widget")
    assert life.state is LifecycleState.STOPPED and body.cleaned


async def test_a_body_that_ends_before_ready_fails_start() -> None:
    life = OwnedTask("widget")

    async def quits(ready: Callable[[], None]) -> None:
        return

    with pytest.raises(ServerStateError, match="ended while starting"):
        await life.start(quits, name="widget")
    assert life.state is LifecycleState.STOPPED


async def test_a_cancelled_start_stops_the_task() -> None:
    life = OwnedTask("widget")
    entered, cleaned = anyio.Event(), anyio.Event()

    async def slow(ready: Callable[[], None]) -> None:
        try:
            entered.set()
            await life.wait_stop_requested()  # never ready: it stops when told to
        finally:
            cleaned.set()

    starting = asyncio.ensure_future(life.start(slow, name="slow"))
    await entered.wait()
    assert life.state is LifecycleState.STARTING
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert cleaned.is_set() and life.state is LifecycleState.STOPPED


async def test_a_crash_after_ready_is_logged_and_stays_there(
    caplog: pytest.LogCaptureFixture,
) -> None:
    life = OwnedTask("widget")
    crash = anyio.Event()

    async def fragile(ready: Callable[[], None]) -> None:
        ready()
        await crash.wait()
        raise RuntimeError("boom")

    await life.start(fragile, name="fragile")
    with caplog.at_level(logging.ERROR, logger="aiotimer"):
        crash.set()
        with anyio.fail_after(5):
            while life.state is not LifecycleState.STOPPED:
                await anyio.sleep(0.001)
    assert [r.getMessage() for r in caplog.records] == ["the widget crashed"]
    await life.aclose()  # nothing left to stop, nothing raised


async def test_the_owner_may_stop_itself() -> None:
    life = OwnedTask("widget")
    body = Body(life)
    await life.start(body, name="widget")
    life.request_stop()
    assert life.state is LifecycleState.STOPPING
    await life.aclose()
    assert life.state is LifecycleState.STOPPED and body.cleaned


async def test_ready_twice_is_a_misuse() -> None:
    life = OwnedTask("widget")
    problems: list[BaseException] = []

    async def twice(ready: Callable[[], None]) -> None:
        ready()
        try:
            ready()
        except ServerStateError as exc:
            problems.append(exc)
        await life.wait_stop_requested()

    await life.start(twice, name="twice")
    await life.aclose()
    assert [str(p) for p in problems] == ["the widget reported ready twice"]


async def test_aclose_must_run_in_the_owners_loop() -> None:
    life = OwnedTask("widget")
    await life.start(Body(life), name="widget")
    errors: list[BaseException] = []

    def elsewhere() -> None:
        try:
            asyncio.run(life.aclose())
        except ServerStateError as exc:
            errors.append(exc)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    await anyio.to_thread.run_sync(thread.join)
    assert [str(e) for e in errors] == ["aclose() must be awaited in the widget's own event loop"]
    assert life.state is LifecycleState.RUNNING
    await life.aclose()


async def test_unwrap_takes_single_exceptions_out_of_groups() -> None:
    inner = SourceError("x")
    assert unwrap(BaseExceptionGroup("g", [ExceptionGroup("h", [inner])])) is inner
    two = ExceptionGroup("g", [inner, SourceError("y")])
    assert unwrap(two) is two
