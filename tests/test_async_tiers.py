"""The async face's two tiers (cancel the task at the deadline, reap ``kill_after``
later) and ``expires`` as a decorator. The unit layer: a recording client stands in for
the transport; every async test runs on asyncio and on uvloop (conftest)."""

from __future__ import annotations

import asyncio
import time

import anyio
import pytest

from aiotimer.client import DEFAULT_KILL_AFTER, Expires, expires, expires_at
from aiotimer.client._task_deadline import _deadlines_of, open_blocks
from aiotimer.core._scope import scope_site
from aiotimer.testing import RecordingClient
from aiotimer.wire import scope_id_problem

#: Upper bound for "the task was cancelled at its deadline": generous for a loaded
#: 2-core machine, far below the never-cancelled alternative (the body's hour).
LATE = 2.0


@pytest.fixture
def client() -> RecordingClient:
    return RecordingClient()


@pytest.mark.asyncio
async def test_the_task_is_cancelled_at_the_deadline_and_the_server_told_later(
    client: RecordingClient,
) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        async with expires(0.05, client=client) as block:
            await asyncio.sleep(3600)
    elapsed = time.monotonic() - started
    assert 0.05 <= elapsed < 0.05 + LATE
    acquire, release = client.requests
    assert block.deadline is not None
    assert acquire.mono == block.deadline + DEFAULT_KILL_AFTER
    assert release.is_release and release.scope_id == acquire.scope_id


@pytest.mark.asyncio
async def test_the_deadline_never_cancels_the_task_early(client: RecordingClient) -> None:
    """uvloop runs a timer up to a millisecond early (its time is cached per iteration,
    in whole milliseconds): the block still ends at its deadline, never before."""
    for _ in range(300):
        with pytest.raises(TimeoutError):
            async with expires(0.002, client=client) as block:
                await asyncio.sleep(3600)
        assert block.deadline is not None and time.monotonic() >= block.deadline


@pytest.mark.asyncio
async def test_kill_after_sets_the_second_tier(client: RecordingClient) -> None:
    with pytest.raises(TimeoutError):
        async with expires_at(time.monotonic() + 0.01, client=client, kill_after=1.5) as b:
            await asyncio.sleep(3600)
    assert b.deadline is not None and client.requests[0].mono == b.deadline + 1.5


@pytest.mark.asyncio
async def test_kill_after_zero_is_one_tier_reaped_at_the_deadline(
    client: RecordingClient,
) -> None:
    async with expires(0.01, client=client, kill_after=0) as block:
        await asyncio.sleep(0.05)  # past the deadline: no cancellation
    assert client.requests[0].mono == block.deadline


@pytest.mark.asyncio
async def test_a_block_that_ends_in_time_is_not_cancelled_later(client: RecordingClient) -> None:
    async with expires(0.05, client=client):
        pass
    await asyncio.sleep(0.1)  # the deadline passes after the block: nothing happens
    assert [r.is_release for r in client.requests] == [False, True]


@pytest.mark.asyncio
async def test_nested_blocks_each_time_out_on_their_own(client: RecordingClient) -> None:
    inner_timed_out = False
    with pytest.raises(TimeoutError):
        async with expires(0.3, client=client):
            try:
                async with expires(0.01, client=client):
                    await asyncio.sleep(3600)
            except TimeoutError:
                inner_timed_out = True
            await asyncio.sleep(3600)  # the outer block's own deadline ends this
    assert inner_timed_out
    assert [r.is_release for r in client.requests] == [False, False, True, True]


@pytest.mark.asyncio
async def test_an_outer_timeout_is_the_outer_blocks(client: RecordingClient) -> None:
    """The outer deadline passes first: the inner block sees a cancellation, not a
    timeout of its own, and the outer block raises the TimeoutError."""
    inner_saw: list[type[BaseException]] = []
    with pytest.raises(TimeoutError):
        async with expires(0.01, client=client):
            try:
                async with expires(3600, client=client):
                    await asyncio.sleep(3600)
            except BaseException as exc:
                inner_saw.append(type(exc))
                raise
    assert inner_saw == [asyncio.CancelledError]


@pytest.mark.asyncio
async def test_inside_an_anyio_task_group_only_the_late_task_times_out(
    client: RecordingClient,
) -> None:
    done: list[str] = []

    async def item(name: str, seconds: float) -> None:
        try:
            async with expires(0.05, client=client):
                await anyio.sleep(seconds)
            done.append(name)
        except TimeoutError:
            done.append(f"{name} timed out")

    async with anyio.create_task_group() as tg:
        tg.start_soon(item, "quick", 0)
        tg.start_soon(item, "stuck", 3600)
        tg.start_soon(item, "quick too", 0.001)
    assert sorted(done) == ["quick", "quick too", "stuck timed out"]


def test_the_sync_face_has_one_tier(client: RecordingClient) -> None:
    with expires(5, client=client, kill_after=2) as block:
        pass
    assert client.requests[0].mono == block.deadline


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_kill_after_must_be_a_finite_number_at_least_zero(bad: float) -> None:
    with pytest.raises(ValueError, match="kill_after"):
        expires(1, kill_after=bad)


# -- as a decorator ------------------------------------------------------------------


def test_a_decorated_function_is_a_block_per_call(client: RecordingClient) -> None:
    @expires(5, client=client)
    def work(x: int) -> int:
        """Doubles."""
        return 2 * x

    assert (work(2), work(3)) == (4, 6)
    assert work.__name__ == "work" and work.__doc__ == "Doubles."
    scopes = [r.scope_id for r in client.requests if not r.is_release]
    assert len(scopes) == 2 and scopes[0] != scopes[1]
    assert {scope_site(s) for s in scopes} == {scope_site(scopes[0])}
    assert scope_site(scopes[0]).startswith("test_async_tiers.py:")


@pytest.mark.asyncio
async def test_a_decorated_coroutine_function_gets_the_async_face(
    client: RecordingClient,
) -> None:
    @expires(0.05, scope="fetch", client=client)
    async def fetch(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "ok"

    assert await fetch(0) == "ok"
    with pytest.raises(TimeoutError):
        await fetch(3600)
    assert [r.scope_id for r in client.requests] == ["fetch"] * 4  # shared, as in torch


# -- the lifecycle of an async block: expiring, expired, rescheduled -------------------


@pytest.mark.asyncio
async def test_an_async_block_is_expiring_once_cancelled_and_expired_once_left(
    client: RecordingClient,
) -> None:
    seen: list[str] = []
    with pytest.raises(TimeoutError):
        async with expires(0.01, scope="s", client=client) as block:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                seen.append(repr(block))
                with pytest.raises(RuntimeError, match="cannot reschedule: its deadline passed"):
                    block.reschedule(time.monotonic() + 3600)
                raise
    assert seen[0].startswith("<Expires [expiring] scope='s'")
    assert repr(block).startswith("<Expires [expired] scope='s'")
    with pytest.raises(RuntimeError, match="cannot exit: it has ended at its deadline"):
        await block.__aexit__(None, None, None)
    assert [r.is_release for r in client.requests] == [False, True]


@pytest.mark.asyncio
async def test_an_outer_cancellation_of_an_expiring_block_stays_a_cancellation(
    client: RecordingClient,
) -> None:
    async def body() -> None:
        async with expires(0.01, client=client) as block:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                blocks.append(block)
                task = asyncio.current_task()
                assert task is not None
                task.cancel()  # an outer cancellation, on top of the deadline's
                await asyncio.sleep(0)  # ... delivered here

    blocks: list[Expires] = []
    with pytest.raises(asyncio.CancelledError):
        await asyncio.create_task(body())
    assert repr(blocks[0]).startswith("<Expires [expired]")


@pytest.mark.asyncio
async def test_entering_an_active_block_again_leaves_its_deadline_alone(
    client: RecordingClient,
) -> None:
    """The refusal comes before anything changes: the block's deadline is still
    stopped when it ends, so it never cancels the task afterwards."""
    async with expires(0.05, client=client) as block:
        with pytest.raises(RuntimeError, match="cannot enter: it is running"):
            await block.__aenter__()
    await asyncio.sleep(0.1)  # past the deadline: nothing happens
    assert repr(block).startswith("<Expires [exited]")


@pytest.mark.asyncio
async def test_rescheduling_later_moves_the_cancellation_and_the_servers_deadline(
    client: RecordingClient,
) -> None:
    async with expires(0.02, scope="s", client=client, kill_after=2) as block:
        block.reschedule(time.monotonic() + 3600)
        await asyncio.sleep(0.1)  # past the first deadline: not cancelled
        assert repr(block).startswith("<Expires [active]")
    _, moved, release = client.requests
    assert block.deadline is not None and moved.mono == block.deadline + 2
    assert (moved.scope_id, release.scope_id, release.is_release) == ("s", "s", True)


@pytest.mark.asyncio
async def test_rescheduling_earlier_cancels_at_the_new_deadline(client: RecordingClient) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        async with expires(3600, client=client) as block:
            block.reschedule(time.monotonic() + 0.02)
            await asyncio.sleep(3600)
    assert time.monotonic() - started < LATE
    assert block.deadline is not None and time.monotonic() >= block.deadline
    assert repr(block).startswith("<Expires [expired]")


@pytest.mark.asyncio
async def test_a_rescheduled_block_is_listed_once_while_open(client: RecordingClient) -> None:
    async with expires(3600, scope="s", client=client) as block:
        for i in range(5):
            block.reschedule(time.monotonic() + 100 + i)
        task = asyncio.current_task()
        assert open_blocks() == {task: ["s"]}
    assert open_blocks() == {}


@pytest.mark.asyncio
async def test_open_blocks_lists_each_tasks_blocks_also_past_their_deadline(
    client: RecordingClient,
) -> None:
    """A block whose deadline passed (its task cancelled, the block not yet left: the
    case a stack dump is for) is listed with the running ones, by task, until it ends."""
    entered = asyncio.Event()

    async def swallowing() -> None:
        async with expires(0.01, scope="late", client=client):
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                entered.set()
                await asyncio.sleep(3600)  # swallowed: still inside the block

    late = asyncio.create_task(swallowing())
    async with expires(3600, scope="outer", client=client):
        async with expires(3600, scope="inner", client=client):
            await asyncio.wait_for(entered.wait(), 30)
            me = asyncio.current_task()
            assert me is not None
            found = open_blocks()
            assert {task: sorted(scopes) for task, scopes in found.items()} == {
                me: ["inner", "outer"],
                late: ["late"],
            }
        late.cancel()
        with pytest.raises(asyncio.CancelledError):
            await late
        assert open_blocks() == {me: ["outer"]}
    assert open_blocks() == {}


def test_a_template_cannot_be_entered_and_an_entered_block_cannot_decorate(
    client: RecordingClient,
) -> None:
    template = expires(1, client=client)
    template(lambda: None)
    with pytest.raises(RuntimeError, match="only once"), template:
        pass
    block = expires(1, client=client)
    with block:
        pass
    with pytest.raises(RuntimeError, match="fresh expires"):
        block(lambda: None)
    assert isinstance(block, Expires)


# -- async default scopes name their task ------------------------------------------


@pytest.mark.asyncio
async def test_an_async_default_scope_names_its_task(client: RecordingClient) -> None:
    async def fetch() -> str:
        async with expires(5, client=client) as block:
            return block.scope

    scope = await asyncio.create_task(fetch(), name="fetch-3")
    assert scope.endswith("@fetch-3") and scope_site(scope).startswith("test_async_tiers.py:")
    assert [r.scope_id for r in client.requests] == [scope, scope]
    async with expires(5, scope="mine", client=client) as named:
        pass
    assert named.scope == "mine"  # an explicit scope is the user's, untouched


@pytest.mark.asyncio
async def test_any_task_name_keeps_the_scope_valid(client: RecordingClient) -> None:
    async def block() -> str:
        async with expires(5, client=client) as b:
            return b.scope

    odd = await asyncio.create_task(block(), name="lone \udcff #1:2#3 " + "x" * 5000)
    assert scope_id_problem(odd) is None and len(odd) < 400
    assert scope_site(odd).startswith("test_async_tiers.py:")


@pytest.mark.parametrize(
    ("scope", "site"),
    [
        ("a.py:12#7", "a.py:12"),
        ("a.py:12#7@Task-3", "a.py:12"),
        ("a.py:12#7@we#ird:1#2", "a.py:12"),
        ("m@v2.py:3#4", "m@v2.py:3"),
        ("m@v2.py:3#4@T#1", "m@v2.py:3"),
        ("load#3", "load#3"),
        ("me@host", "me@host"),
        ("x:1#abc@t", "x:1#abc@t"),
    ],
)
def test_scope_site_strips_the_counter_and_the_task(scope: str, site: str) -> None:
    assert scope_site(scope) == site


@pytest.mark.asyncio
async def test_deadlines_of_many_blocks_fire_in_order_after_many_ended_ones(
    client: RecordingClient,
) -> None:
    """Thousands of ended blocks (their entries compacted away) do not disturb the live
    ones: each times out at its own deadline, the earliest first."""
    for _ in range(3000):
        async with expires(3600, scope="ended", client=client):
            pass
    order: list[float] = []

    async def item(after: float) -> None:
        with pytest.raises(TimeoutError):
            async with expires(after, scope=f"live-{after}", client=client):
                await asyncio.sleep(3600)
        order.append(after)

    async def quick() -> None:
        async with expires(0.01, scope="quick", client=client):
            pass

    await asyncio.gather(item(0.15), item(0.05), quick(), item(0.1))
    assert order == [0.05, 0.1, 0.15]


@pytest.mark.asyncio
async def test_blocks_ending_in_turn_leave_no_deadline_entries(client: RecordingClient) -> None:
    """An ended block on top of its loop's stack of armed blocks is dropped as the block
    ends (blocks mostly end in the reverse order they began), so a loop of blocks keeps
    none; an ended block under a live one waits for it, and never cancels anything."""
    for _ in range(50):
        async with expires(3600, scope="ended", client=client):
            pass
    deadlines = _deadlines_of(asyncio.get_running_loop())
    assert deadlines.stack == [] and deadlines.heap == []
    async with expires(0.05, scope="outer", client=client) as outer:
        async with expires(3600, scope="first", client=client) as first:
            async with expires(3600, scope="second", client=client):
                pass
            assert deadlines.stack == [outer, first]  # the second: dropped as it ended
        async with expires(3600, scope="third", client=client) as third:
            pass
        assert deadlines.stack == [outer]
        b_in, a_out = asyncio.Event(), asyncio.Event()

        async def a() -> None:  # enters first, ends first: under b's block, it waits
            async with expires(3600, scope="a", client=client):
                await b_in.wait()
            a_out.set()

        async def b() -> None:
            async with expires(3600, scope="b", client=client) as block_b:
                b_in.set()
                await a_out.wait()
                assert [blk.scope for blk in deadlines.stack] == ["outer", "a", "b"]
                assert deadlines.stack[2] is block_b
            assert deadlines.stack == [outer]  # b's end drops the ended a's too

        task_a = asyncio.create_task(a())
        await asyncio.sleep(0)  # a enters
        await asyncio.gather(task_a, b())
        assert third not in deadlines.stack
    assert deadlines.stack == [] and deadlines.heap == []
    await asyncio.sleep(0.1)  # past the outer's deadline: the timer finds nothing due
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


@pytest.mark.asyncio
async def test_ended_blocks_under_a_live_one_and_in_the_heap_are_swept(
    client: RecordingClient,
) -> None:
    """Blocks that end under a later, still running one (tasks ending out of order),
    and blocks that outlived a firing and ended since, do not pile up: the stack and the
    heap are swept past twice their live size + 1000, and nothing ended is cancelled."""
    release, stop = asyncio.Event(), asyncio.Event()

    async def held(scope: str, until: asyncio.Event) -> None:
        async with expires(3600, scope=scope, client=client):
            await until.wait()

    shorts = [asyncio.create_task(held(f"short-{n}", release)) for n in range(1500)]
    await asyncio.sleep(0)  # every short block armed
    deadlines = _deadlines_of(asyncio.get_running_loop())
    async with expires(3600, scope="long", client=client) as long:
        release.set()
        await asyncio.gather(*shorts)  # ended, under the long block
        assert len(deadlines.stack) == 1501
        more = []
        while len(deadlines.stack) > 1 + len(more):  # live blocks armed until a sweep
            assert len(more) < 3000
            more.append(asyncio.create_task(held(f"more-{len(more)}", stop)))
            await asyncio.sleep(0)
        assert all(block._entry is not None for block in deadlines.stack)
        # A firing moves the armed blocks into the heap; ended since, they are swept.
        async with expires(0.01, scope="fires", client=client):
            with pytest.raises(asyncio.CancelledError):
                await asyncio.sleep(3600)
            assert len(deadlines.heap) == 1 + len(more)  # the long block and the others
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
        stop.set()
        await asyncio.gather(*more)
        for wave in range(3):  # more outlive a firing, then end: the heap stays bounded
            stop = asyncio.Event()
            more = [asyncio.create_task(held(f"w{wave}-{n}", stop)) for n in range(1500)]
            async with expires(0.01, scope="fires again", client=client):
                with pytest.raises(asyncio.CancelledError):
                    await asyncio.sleep(3600)
                asyncio.current_task().uncancel()  # type: ignore[union-attr]
            stop.set()
            await asyncio.gather(*more)
            assert len(deadlines.heap) <= 2 * 1502 + 1000
        live = [item[2] for item in deadlines.heap if item[2]._entry == item[0]]
        assert live == [long]
    assert [r.scope_id for r in client.requests if r.cancelled] == ["fires"] + 3 * ["fires again"]
