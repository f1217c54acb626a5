"""Learned timeouts shared by the nodes of a job: the widest value wins, a node that
never saw a scope starts from the job's value; on the in-memory store and on a real
etcd (``-m etcd``)."""

from __future__ import annotations

import signal

import pytest
from _pids import fake_pid

from aiotimer import Request, learned
from aiotimer.cluster import Store
from aiotimer.cluster._learned import (
    LearnedRecord,
    LearnedSharing,
    learned_key,
    server_values,
    widest,
)
from aiotimer.server import TimerServer
from aiotimer.testing import FakeClock, MemorySource, RecordingReaper

pytestmark = pytest.mark.timeout(30)
KILL = int(signal.SIGKILL)
P1, P2 = fake_pid(21), fake_pid(22)


def test_the_widest_value_of_the_other_nodes() -> None:
    records = [
        LearnedRecord(node="a", values={"step": 2.0, "eval": 30.0}),
        LearnedRecord(node="b", values={"step": 5.0}),
        LearnedRecord(node="me", values={"step": 50.0}),
    ]
    assert widest(records, skip="me") == {"step": 5.0, "eval": 30.0}


def steps(source: MemorySource, clock: FakeClock, pid: int, n: int, took: float) -> None:
    for _ in range(n):
        mono = clock.monotonic() + 30
        source.push(Request(pid, "step", clock.time() + 30, KILL, mono=mono, learned=learned(30)))
        clock.advance(took)
        source.push(Request(pid, "step", -1, 0))


def sharing(store: Store, node: str, server: TimerServer) -> LearnedSharing:
    return LearnedSharing(
        store,
        job="job-learned",
        node=node,
        read=lambda: server_values(server),
        widen=server.widen_learned,
    )


@pytest.mark.asyncio
async def test_every_node_of_the_job_times_a_scope_at_its_widest_value(store: Store) -> None:
    clock_a, clock_b = FakeClock(), FakeClock()
    source_a, source_b = MemorySource(), MemorySource()
    async with (
        TimerServer(sources=[source_a], clock=clock_a, reaper=RecordingReaper()) as a,
        TimerServer(sources=[source_b], clock=clock_b, reaper=RecordingReaper()) as b,
    ):
        share_a, share_b = sharing(store, "a", a), sharing(store, "b", b)
        steps(source_a, clock_a, P1, 150, took=0.5)  # node a learns 2.5 s
        await share_a.exchange()
        await share_b.exchange()
        # node b never saw the scope: its first block is timed at the job's value
        source_b.push(Request(P2, "step", clock_b.time() + 30, KILL, learned=learned(30)))
        [timer] = b.get_state().timers
        assert timer.seconds_left == pytest.approx(2.5)
        source_b.push(Request(P2, "step", -1, 0))
        clock_b.advance(0.1)
        steps(source_b, clock_b, P2, 1, took=1.2)  # a long step on b: 6 s there, at once
        await share_b.exchange()
        await share_a.exchange()
        [summary] = a.snapshot().document.learned
        assert summary.value == pytest.approx(6.0), "a takes b's wider value"
        entry = await store.get(learned_key("job-learned", "b"))
        assert entry is not None and entry.lease != 0, "the record goes with the node"
