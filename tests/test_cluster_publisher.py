"""NodePublisher and JobRestarts on the in-memory store and a fake clock."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import anyio
import pytest

from aiotimer.cluster import (
    GenerationRecord,
    JobRestarts,
    MemberRecord,
    NodePublisher,
    NodeRecord,
    NodeStatus,
    read_view,
)
from aiotimer.cluster._record import decode, encode, member_key, node_key
from aiotimer.cluster._store import Entry
from aiotimer.errors import NodeNameTakenError
from aiotimer.events import RankStatus, WorkerInfo, WorkerReaped, WorkerState
from aiotimer.supervisor._restart import Backoff, RestartPolicy
from aiotimer.testing import FakeClock, MemoryStore, settle

pytestmark = pytest.mark.timeout(30)


class Node:
    """A node's changing state, as its supervisor would describe it."""

    def __init__(self) -> None:
        self.status = NodeStatus(
            role="supervisor",
            ranks=(RankStatus(rank=0, state=WorkerState.HEALTHY, pid=4242),),
            workers=(WorkerInfo(pid=4242, state="timed", timers=1),),
            live_timers=1,
        )

    def describe(self) -> NodeStatus:
        return self.status


async def advance(clock: FakeClock, seconds: float = 0.0) -> None:
    """Let every task run until all are blocked, advance the fake clock, settle again."""
    await settle()
    clock.advance(seconds)
    await settle()


async def record(store: MemoryStore, name: str = "a") -> NodeRecord | None:
    entry = await store.get(node_key("job", name))
    return None if entry is None else decode(NodeRecord, entry.value)


def publisher(store: MemoryStore, clock: FakeClock, node: Node, name: str = "a") -> NodePublisher:
    return NodePublisher(
        store, job="job", node=name, describe=node.describe, ttl=3, clock=clock, host="h"
    )


@pytest.mark.asyncio
async def test_publishes_changes_rate_limited_and_heartbeats() -> None:
    clock, node = FakeClock(), Node()
    store = MemoryStore(clock)
    async with publisher(store, clock, node) as pub:
        rec = await record(store)
        assert rec is not None
        assert (rec.node, rec.host, rec.pid, rec.role, rec.live_timers) == (
            "a",
            "h",
            os.getpid(),
            "supervisor",
            1,
        )
        assert rec.heartbeat == 1.0  # ttl / 3
        writes = pub.published
        node.status = NodeStatus(role="supervisor", live_timers=2)
        pub.changed()
        await advance(clock)
        assert pub.published == writes, "a change right after a write waits min_interval"
        await advance(clock, 1.0)
        rec = await record(store)
        assert rec is not None
        assert (rec.live_timers, rec.workers) == (2, ())
        # Unchanged: rewritten (and the lease kept alive) once per heartbeat only.
        writes = pub.published
        for _ in range(5):
            await advance(clock, 1.0)
        assert pub.published == writes + 5
        assert (await record(store)) is not None, "the lease was kept alive past its TTL"
    assert await record(store) is None, "a clean stop revokes the lease"
    left = await store.get(member_key("job", "a"))
    assert left is not None
    member = decode(MemberRecord, left.value)
    assert member is not None
    assert (member.left_at is not None, member.outcome) == (True, "stopped")


@pytest.mark.asyncio
async def test_reaps_are_recorded_with_rank_and_published_within_min_interval() -> None:
    clock, node = FakeClock(), Node()
    store = MemoryStore(clock)
    async with publisher(store, clock, node) as pub:
        await advance(clock, 2.0)
        pub.on_event(
            WorkerReaped(
                time=clock.time(),
                pid=4242,
                signal=signal.SIGKILL,
                group=True,
                scopes=("step",),
                step=1,
                steps=1,
            )
        )
        await advance(clock, 1.0)
        rec = await record(store)
        assert rec is not None
        assert [(r.pid, r.rank, r.scopes, r.signal) for r in rec.last_reaps] == [
            (4242, 0, ("step",), "SIGKILL")
        ]


@pytest.mark.asyncio
async def test_a_name_held_by_a_live_node_is_refused() -> None:
    clock = FakeClock()
    store = MemoryStore(clock)
    async with publisher(store, clock, Node()):
        other = NodePublisher(
            store, job="job", node="a", describe=Node().describe, ttl=3, clock=clock, host="h2"
        )
        with pytest.raises(NodeNameTakenError, match=r"node name 'a' of job 'job'.*host h"):
            async with other:
                pass
        rec = await record(store)
        assert rec is not None
        assert rec.host == "h", "the live node's record is untouched"


@pytest.mark.asyncio
async def test_the_record_of_a_dead_process_on_this_host_is_taken_over() -> None:
    clock = FakeClock()
    store = MemoryStore(clock)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    stale = NodeRecord(
        node="a", job="job", host=host, pid=dead.pid, started_at=0, updated_at=0, heartbeat=1
    )
    lease = await store.grant_lease(30)
    await store.put(node_key("job", "a"), encode(stale), lease=lease)
    pub = NodePublisher(store, job="job", node="a", describe=Node().describe, ttl=3, clock=clock)
    async with pub:
        rec = await record(store)
        assert rec is not None
        assert rec.pid == os.getpid()


@pytest.mark.asyncio
async def test_an_outage_longer_than_the_ttl_reclaims_the_name_with_a_new_lease() -> None:
    clock, node = FakeClock(), Node()
    store = MemoryStore(clock)
    async with publisher(store, clock, node) as pub:
        first_lease = pub.lease
        store.go_down()
        for _ in range(5):  # 5 s down, TTL 3 s: the lease expires meanwhile
            await advance(clock, 1.0)
        store.come_back()
        store.expire_leases()
        assert await record(store) is None
        await advance(clock, 1.0)
        rec = await record(store)
        assert rec is not None, "republished after the outage"
        assert pub.lease != first_lease
        entry = await store.get(node_key("job", "a"))
        assert entry is not None
        assert entry.lease == pub.lease


@pytest.mark.asyncio
async def test_a_killed_node_shows_lost_once_its_lease_expires() -> None:
    clock = FakeClock()
    store = MemoryStore(clock)
    async with publisher(store, clock, Node(), "a"):
        crashed = publisher(store, clock, Node(), "b")
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                await tg.start(crashed.run)
                view = await read_view(store, "job", now=clock.time())
                assert [(r.node, r.status) for r in view.nodes] == [
                    ("a", "running"),
                    ("b", "running"),
                ]
                store.go_down()  # b cannot say it left: as if it were SIGKILLed
                scope.cancel()
        store.come_back()
        await advance(clock, 1.0)  # a keeps its lease alive
        await advance(clock, 1.0)
        await advance(clock, 1.5)  # b's TTL (3 s) has run out
        store.expire_leases()
        view = await read_view(store, "job", now=clock.time())
        assert [(r.node, r.status) for r in view.nodes] == [("a", "running"), ("b", "lost")]


# -- job-wide restarts ------------------------------------------------------------------


@pytest.mark.asyncio
async def test_job_restarts_bump_once_and_every_follower_sees_it() -> None:
    clock = FakeClock()
    store = MemoryStore(clock)
    policy = RestartPolicy(max_restarts=1, window=60, backoff=Backoff(initial=0.5, jitter=0))
    a = JobRestarts(store, job="job", node="a", policy=policy, clock=clock)
    b = JobRestarts(store, job="job", node="b", policy=policy, clock=clock)
    seen: dict[str, list[GenerationRecord]] = {"a": [], "b": []}

    async def follow(who: JobRestarts) -> None:
        async for rec in who.follow():
            seen[who.node].append(rec)

    async with anyio.create_task_group() as tg:
        tg.start_soon(follow, a)
        tg.start_soon(follow, b)
        await advance(clock)
        assert [r.generation for r in seen["a"]] == [0], "a node starts at the current one"
        bumped = await b.request(seen=0, rank=1, reason="reaped by timer 'step'")
        assert (bumped.generation, bumped.node, bumped.rank, bumped.delay) == (1, "b", 1, 0.5)
        # a's worker failed in the same wave: the job already restarted.
        assert (await a.request(seen=0, rank=0, reason="killed")).generation == 1
        await advance(clock)
        for name in "ab":
            assert [r.generation for r in seen[name]] == [0, 1]
        # A late node catches up with the current generation.
        late: list[GenerationRecord] = []

        async def follow_late() -> None:
            async for rec in JobRestarts(store, job="job", node="c", policy=policy).follow():
                late.append(rec)

        tg.start_soon(follow_late)
        await advance(clock)
        assert [r.generation for r in late] == [1]
        # The budget (1 restart in 60 s) is spent: the next failure gives the job up.
        final = await a.request(seen=1, rank=0, reason="crashed (exit code 1)")
        assert final.gave_up is not None
        await advance(clock)
        assert seen["b"][-1].gave_up == final.gave_up
        tg.cancel_scope.cancel()


@pytest.mark.asyncio
async def test_followers_survive_an_outage_and_catch_up() -> None:
    clock = FakeClock()
    store = MemoryStore(clock)
    policy = RestartPolicy(max_restarts=5, window=60, backoff=Backoff(initial=0, jitter=0))
    a = JobRestarts(store, job="job", node="a", policy=policy, clock=clock)
    seen: list[int] = []

    async def follow() -> None:
        async for rec in a.follow():
            seen.append(rec.generation)

    async with anyio.create_task_group() as tg:
        tg.start_soon(follow)
        await advance(clock)
        store.go_down()
        await advance(clock)
        store.come_back()
        await store.put(a.key, encode(GenerationRecord(generation=3)))  # written meanwhile
        await advance(clock, 1.0)
        assert seen == [0, 3]
        tg.cancel_scope.cancel()


@pytest.mark.asyncio
async def test_a_node_giving_up_ends_the_job_once() -> None:
    clock = FakeClock()
    store = MemoryStore(clock)
    a = JobRestarts(store, job="job", node="a", policy=RestartPolicy(), clock=clock)
    await store.put(a.key, encode(GenerationRecord(generation=2)))
    first = await a.give_up("worker 1 exited with no-restart code 93")
    assert (first.generation, first.gave_up, first.node) == (
        2,
        "worker 1 exited with no-restart code 93",
        "a",
    )
    again = await a.give_up("something else")
    assert again.gave_up == first.gave_up, "the first give-up is kept"
    assert (await a.current()).gave_up == first.gave_up


class _JoinsBetweenReads(MemoryStore):
    """A store where node ``b`` joins (record, then member entry, as a publisher writes
    them) right after the first prefix read has been answered."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.now = clock.time()
        self.joined = False

    async def get_prefix(self, prefix: str) -> list[Entry]:
        entries = await super().get_prefix(prefix)
        if not self.joined:
            self.joined = True
            record = NodeRecord(
                node="b", job="job", host="h", pid=2, started_at=self.now,
                updated_at=self.now, heartbeat=1.0,
            )  # fmt: skip
            await self.put(node_key("job", "b"), encode(record))
            member = MemberRecord(node="b", host="h", pid=2, joined_at=self.now)
            await self.put(member_key("job", "b"), encode(member))
        return entries


@pytest.mark.asyncio
async def test_a_node_joining_during_a_read_never_shows_as_lost() -> None:
    clock = FakeClock()
    view = await read_view(_JoinsBetweenReads(clock), "job", now=clock.time())
    assert [(r.node, r.status) for r in view.nodes] in ([], [("b", "running")])
