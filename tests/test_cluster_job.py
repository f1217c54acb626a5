"""JobRestarts when the store loses, rewinds or garbles the generation key, or someone
writes bumps of their own (in-memory store, fake clock); and the job view of hostile
records (a real etcd, as ``aiotimer status --etcd`` reads it)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
from _etcd import EtcdServer
from test_cluster_cli import status_args

from aiotimer.cluster import GenerationRecord, JobRestarts, NodeRecord, connect, read_view
from aiotimer.cluster._cli import run_job_status
from aiotimer.cluster._record import decode, encode, node_key
from aiotimer.supervisor._restart import Backoff, RestartPolicy
from aiotimer.testing import FakeClock, MemoryStore, settle

pytestmark = pytest.mark.timeout(30)

POLICY = RestartPolicy(max_restarts=3, window=600, backoff=Backoff(initial=0, cap=2, jitter=0))
NOTHING = GenerationRecord()


class Follower:
    """A node's follower task, recording what it is told to act on."""

    def __init__(self, store: MemoryStore, clock: FakeClock, node: str) -> None:
        self.job = JobRestarts(store, job="job", node=node, policy=POLICY, clock=clock)
        self.acts: list[GenerationRecord] = []

    async def run(self, known: GenerationRecord) -> None:
        async for record in self.job.follow(known=known):
            self.acts.append(record)


@asynccontextmanager
async def following(
    store: MemoryStore, clock: FakeClock, *nodes: str, known: GenerationRecord = NOTHING
) -> AsyncIterator[list[Follower]]:
    """Followers of ``nodes`` running (and settled) for the duration of the block."""
    followers = [Follower(store, clock, node) for node in nodes]
    async with anyio.create_task_group() as tg:
        for follower in followers:
            tg.start_soon(follower.run, known)
        await settle()
        yield followers
        tg.cancel_scope.cancel()


@pytest.mark.asyncio
async def test_a_deleted_key_is_written_back_and_the_next_hang_restarts_the_job() -> None:
    clock = FakeClock()
    store = MemoryStore(clock)
    async with following(store, clock, "a", "b") as (a, b):
        first = await b.job.request(seen=0, rank=0, reason="reaped")
        await settle()
        assert [r.generation for r in a.acts] == [1] == [r.generation for r in b.acts]
        await store.delete(a.job.key)  # etcd lost its data
        await settle()
        assert await a.job.current() == first, "written back, budget and all"
        second = await a.job.request(seen=1, rank=1, reason="reaped again")
        assert second.generation == 2
        assert second.restarts == (*first.restarts, second.at)
        await settle()
        assert [r.generation for r in a.acts] == [1, 2] == [r.generation for r in b.acts]


@pytest.mark.asyncio
async def test_garbage_in_the_key_is_one_line_and_written_over(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    store = MemoryStore(clock)
    job = JobRestarts(store, job="job", node="a", policy=POLICY, clock=clock)
    await store.put(job.key, b'{"generation": "lots"}')
    caplog.set_level(logging.WARNING, "aiotimer.cluster")
    assert await job.current() == NOTHING
    assert await job.current() == NOTHING
    garbage = [r.message for r in caplog.records if "not a valid GenerationRecord" in r.message]
    assert len(garbage) == 1, "one line per value, not per read"
    async with following(store, clock, "a", known=GenerationRecord(generation=4)) as (a,):
        entry = await store.get(a.job.key)
        assert entry is not None
        assert decode(GenerationRecord, entry.value) == GenerationRecord(generation=4)
        await store.put(a.job.key, b"\xff\xfe not json")
        await settle()
        assert (await a.job.current()).generation == 4
        assert (await a.job.request(seen=4, rank=0, reason="r")).generation == 5
        await settle()
        assert [r.generation for r in a.acts] == [5]


@pytest.mark.asyncio
async def test_five_forged_bumps_restart_within_the_budget_then_end_the_job() -> None:
    clock = FakeClock()
    store = MemoryStore(clock)
    async with following(store, clock, "a", "b") as (a, b):
        for g in range(1, 6):  # etcdctl put, five times, 1e300 s of back-off each
            forged = GenerationRecord(generation=g, delay=1e300, reason="forged")
            await store.put(a.job.key, encode(forged))
            await settle()
    for node in (a, b):
        restarts = [r for r in node.acts if r.gave_up is None]
        assert [(r.generation, r.delay) for r in restarts] == [(1, 2.0), (2, 2.0), (3, 2.0)]
        (ended,) = [r for r in node.acts if r.gave_up is not None]
        assert "budget exhausted (3 restarts in 600s): generation 4" in ended.gave_up
    stored = await a.job.current()
    assert stored.gave_up is not None, "the give-up is in the store for every node"


@pytest.mark.asyncio
async def test_a_bump_from_a_node_that_missed_the_generation_restarts_everyone() -> None:
    clock = FakeClock()
    store = MemoryStore(clock)
    known = GenerationRecord(generation=3, at=clock.time())
    await store.put("/aiotimer/v1/job/generation", encode(known))
    async with following(store, clock, "a", "b", known=known) as (a, b):
        await store.delete(a.job.key)
        late = JobRestarts(store, job="job", node="c", policy=POLICY, clock=clock)
        # Node c joined while the key was gone (so it ran generation 0) and bumps to 1
        # before a and b could write generation 3 back: they carry it forward to 4.
        assert (await late.request(seen=0, rank=0, reason="c hung")).generation == 1
        await settle()
        assert (await late.current()).generation == 4
    assert [r.generation for r in a.acts] == [4] == [r.generation for r in b.acts]


# -- the job view of hostile records -------------------------------------------------------


@pytest.mark.etcd
def test_status_skips_records_out_of_range_with_one_line_each(
    etcd: EtcdServer, capsys: pytest.CaptureFixture[str]
) -> None:
    now = time.time()
    good = NodeRecord(node="ok", job="j", host="h", pid=7, started_at=now, updated_at=now,
                      heartbeat=1.0)  # fmt: skip
    hostile = {
        "pid": b'{"node":"x","job":"j","host":"h","pid":1099511627776,"started_at":0,'
        b'"updated_at":0,"heartbeat":1}',
        "at": b'{"node":"y","job":"j","host":"h","pid":8,"started_at":0,"updated_at":0,'
        b'"heartbeat":1,"last_reaps":[{"at":1e300,"pid":8}]}',
        "junk": b"\x00\x01",
    }

    async def main() -> None:
        store = connect(etcd.endpoint)
        try:
            await store.put(node_key("j", "ok"), encode(good))
            for name, raw in hostile.items():
                await store.put(node_key("j", name), raw)
            await store.put("/aiotimer/v1/j/generation", b'{"generation": 1, "delay": "x"}')
            view = await read_view(store, "j", now=now)
            assert [r.node for r in view.nodes] == ["ok"]
            assert len(view.skipped) == 4
        finally:
            await store.aclose()

    anyio.run(main)
    assert run_job_status(status_args("--etcd", etcd.endpoint, "--job", "j")) == 0
    out = capsys.readouterr().out
    skipped = [line for line in out.splitlines() if line.startswith("skipped ")]
    assert len(skipped) == 4
    assert any("/nodes/pid: not a valid NodeRecord" in line for line in skipped)
    assert any("/generation: not a valid GenerationRecord" in line for line in skipped)
