"""The Store contract, run on the in-memory fake and on a real etcd (``-m etcd``)."""

from __future__ import annotations

import anyio
import pytest
from _etcd import EtcdServer, free_port

from aiotimer.cluster import Store, connect
from aiotimer.cluster._etcd import parse_endpoints
from aiotimer.errors import LeaseLostError, StoreUnavailableError
from aiotimer.testing import FakeClock, MemoryStore

pytestmark = pytest.mark.timeout(30)


@pytest.mark.asyncio
async def test_put_get_and_prefix_in_key_order(store: Store) -> None:
    assert await store.get("/t/a") is None
    await store.put("/t/b", b"2")
    await store.put("/t/a", b"1")
    await store.put("/u/c", b"3")
    got = await store.get("/t/a")
    assert got is not None
    assert (got.key, got.value, got.lease) == ("/t/a", b"1", 0)
    assert [(e.key, e.value) for e in await store.get_prefix("/t/")] == [
        ("/t/a", b"1"),
        ("/t/b", b"2"),
    ]
    await store.delete("/t/a")
    await store.delete("/t/missing")
    assert await store.get("/t/a") is None


@pytest.mark.asyncio
async def test_put_if_is_compare_and_set_on_mod_revision(store: Store) -> None:
    assert await store.put_if("/gen", b"1", mod_revision=0)
    assert not await store.put_if("/gen", b"x", mod_revision=0), "created twice"
    first = await store.get("/gen")
    assert first is not None
    assert await store.put_if("/gen", b"2", mod_revision=first.mod_revision)
    assert not await store.put_if("/gen", b"3", mod_revision=first.mod_revision), "stale CAS won"
    now = await store.get("/gen")
    assert now is not None
    assert now.value == b"2"
    assert now.mod_revision > first.mod_revision


@pytest.mark.asyncio
async def test_lease_keys_go_with_the_lease(store: Store) -> None:
    lease = await store.grant_lease(30)
    assert lease != 0
    await store.put("/n/a", b"a", lease=lease)
    assert await store.put_if("/n/b", b"b", mod_revision=0, lease=lease)
    entry = await store.get("/n/a")
    assert entry is not None
    assert entry.lease == lease
    assert await store.keep_alive(lease)
    await store.revoke_lease(lease)
    assert await store.get_prefix("/n/") == []
    assert not await store.keep_alive(lease)
    await store.revoke_lease(lease)  # already gone: no error
    with pytest.raises(LeaseLostError):
        await store.put("/n/a", b"a", lease=lease)


@pytest.mark.asyncio
async def test_watch_yields_current_state_then_each_change(store: Store) -> None:
    await store.put("/w", b"0")
    seen: list[bytes | None] = []
    async with store.watch("/w") as changes, anyio.create_task_group() as tg:

        async def write() -> None:
            await store.put("/w", b"1")
            await store.delete("/w")
            await store.put("/w", b"2")

        tg.start_soon(write)
        with anyio.fail_after(10):
            async for entry in changes:
                seen.append(None if entry is None else entry.value)
                if len(seen) == 4:
                    break
    assert seen == [b"0", b"1", None, b"2"]


@pytest.mark.asyncio
async def test_watch_of_an_absent_key_starts_with_none(store: Store) -> None:
    async with store.watch("/absent") as changes:
        with anyio.fail_after(10):
            assert await anext(changes) is None
            await store.put("/absent", b"now")
            entry = await anext(changes)
    assert entry is not None
    assert entry.value == b"now"


# -- the in-memory fake's own controls ----------------------------------------------------


@pytest.mark.asyncio
async def test_memory_lease_expires_on_the_injected_clock() -> None:
    clock = FakeClock()
    store = MemoryStore(clock)
    lease = await store.grant_lease(10)
    await store.put("/k", b"v", lease=lease)
    clock.advance(9.9)
    assert await store.keep_alive(lease)
    clock.advance(9.9)
    assert await store.get("/k") is not None
    clock.advance(0.1)
    assert await store.get("/k") is None
    assert not await store.keep_alive(lease)


@pytest.mark.asyncio
async def test_memory_go_down_ends_watches_and_refuses_operations() -> None:
    store = MemoryStore(FakeClock())
    await store.put("/k", b"v")
    async with store.watch("/k") as changes:
        assert (await anext(changes)) is not None
        store.go_down()
        with pytest.raises(StoreUnavailableError):
            await anext(changes)
    with pytest.raises(StoreUnavailableError):
        await store.get("/k")
    store.come_back()
    entry = await store.get("/k")
    assert entry is not None
    assert entry.value == b"v"


# -- etcd only -------------------------------------------------------------------------


def test_parse_endpoints() -> None:
    assert parse_endpoints("a:1, http://b:2/,") == (("a", 1), ("b", 2))
    assert parse_endpoints(["[::1]:2379"]) == (("::1", 2379),)
    for bad in ("", "host", "host:port", ":2379"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            parse_endpoints(bad)


@pytest.mark.etcd
def test_etcd_lease_expires_after_its_ttl(etcd: EtcdServer) -> None:
    """On one loop only: the wait (~2-3 s) is etcd's own, the client's calls are those
    the contract tests above run on both loops."""

    async def main() -> None:
        store = connect(etcd.endpoint)
        try:
            lease = await store.grant_lease(1)
            await store.put("/k", b"v", lease=lease)
            with anyio.fail_after(10):  # etcd expires a 1 s lease within ~1-2 s
                while await store.get("/k") is not None:
                    await anyio.sleep(0.1)
            assert not await store.keep_alive(lease)
        finally:
            await store.aclose()

    anyio.run(main)


@pytest.mark.etcd
@pytest.mark.asyncio
async def test_etcd_unreachable_is_a_typed_error_and_fails_over(etcd: EtcdServer) -> None:
    dead = f"127.0.0.1:{free_port()}"
    store = connect(dead, timeout=2)
    try:
        with pytest.raises(StoreUnavailableError, match=dead):
            await store.get("/k")
    finally:
        await store.aclose()
    store = connect(f"{dead},{etcd.endpoint}", timeout=2)
    try:
        with pytest.raises(StoreUnavailableError):
            await store.get("/k")
        assert await store.get("/k") is None  # the second endpoint answers
    finally:
        await store.aclose()


@pytest.mark.etcd
@pytest.mark.asyncio
async def test_etcd_restart_ends_the_watch_and_the_store_recovers(own_etcd: EtcdServer) -> None:
    etcd = own_etcd
    store = connect(etcd.endpoint, timeout=2)
    try:
        await store.put("/k", b"before")
        async with store.watch("/k") as changes:
            assert await anext(changes) is not None
            etcd.stop()
            with pytest.raises(StoreUnavailableError), anyio.fail_after(10):
                await anext(changes)
        with pytest.raises(StoreUnavailableError):
            await store.get("/k")
        await anyio.to_thread.run_sync(etcd.start)
        with anyio.fail_after(10):
            while True:
                try:
                    entry = await store.get("/k")
                    break
                except StoreUnavailableError:
                    await anyio.sleep(0.1)
        assert entry is not None
        assert entry.value == b"before"
    finally:
        await store.aclose()
