"""What feeds the straggler detector: the ``at`` stamp on the wire, blocks paired from
requests (aiotimer.core._blocks), the supervisor's pid -> rank feed and its events."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from aiotimer import TimerServer, expires
from aiotimer.client._fifo import FifoClient, stamped
from aiotimer.cluster._record import NodeRecord
from aiotimer.cluster._stragglers import format_stragglers, job_stragglers
from aiotimer.core._blocks import BlockTimes, FinishedBlock
from aiotimer.core._straggler import StragglerDetector
from aiotimer.events import Event, RankStatus, StragglerDetected, StragglerRecovered, WorkerState
from aiotimer.supervisor._stragglers import Stragglers
from aiotimer.wire import LineDecoder, Request, encode, validate


def acquire(pid: int, scope: str, at: float | None) -> Request:
    return Request(pid, scope, 1e9, 9, mono=at, at=at)


def release(pid: int, scope: str, at: float | None) -> Request:
    return Request(pid, scope, -1, 0, at=at)


def test_a_stamped_line_is_the_encoding_of_its_request_with_at() -> None:
    req = Request(42, "a.py:3#1", 1_763_712_000.25, 9, mono=1234.5)
    line = stamped(encode(req), 1224.125)
    assert line == encode(Request(42, "a.py:3#1", 1_763_712_000.25, 9, mono=1234.5, at=1224.125))
    (decoded,) = LineDecoder().feed(line).requests
    assert decoded.at == 1224.125
    # Too long to stamp within one atomic write: sent as it was.
    long = encode(Request(42, "x" * 2000, -1, 0))
    assert stamped(long, 5.0) in (long, encode(Request(42, "x" * 2000, -1, 0, at=5.0)))


def test_at_must_be_finite() -> None:
    assert validate(Request(1, "s", -1, 0, at=float("nan"))) is not None
    assert validate(Request(1, "s", -1, 0, at=3.5)) is None


def test_blocks_are_paired_by_pid_and_scope_at_their_stamped_times() -> None:
    blocks = BlockTimes(lambda pid: pid != 99)
    out = blocks.feed(
        [
            acquire(1, "step", 10.0),
            acquire(2, "step", 10.5),
            acquire(99, "step", 10.0),  # not wanted
            release(1, "step", 10.25),
            release(99, "step", 11.0),
            acquire(1, "t.py:4#7", None),  # no stamp: timed when read
        ],
        read_at=20.0,
    )
    assert out == [FinishedBlock(1, "step", 10.0, 10.25)]
    out = blocks.feed([release(2, "step", 10.75), release(1, "t.py:4#7", None)], 21.0)
    assert out == [FinishedBlock(2, "step", 10.5, 10.75), FinishedBlock(1, "t.py:4", 20.0, 21.0)]
    assert blocks.feed([release(3, "never", 1.0)], 22.0) == []  # unknown: nothing
    blocks.feed([acquire(4, "s", 1.0)], 23.0)
    blocks.forget(4)
    assert len(blocks) == 0


def test_open_blocks_are_bounded() -> None:
    blocks = BlockTimes(lambda pid: True, capacity=2)
    blocks.feed([acquire(1, "a", 1.0), acquire(1, "b", 2.0), acquire(1, "c", 3.0)], 4.0)
    assert len(blocks) == 2
    assert blocks.feed([release(1, "a", 5.0)], 5.0) == []  # the oldest was forgotten


def test_the_supervisor_feed_names_a_rank_and_forgets_a_replaced_process() -> None:
    told: list[Event] = []
    restarted: list[int] = []
    ranks = {100: 0, 101: 1, 102: 2}
    feed = Stragglers(
        ranks_by_pid=ranks, emit=told.append, wall=lambda: 1.0, restart=restarted.append
    )
    rng = random.Random(0)
    t = dict.fromkeys(ranks, 0.0)
    for _ in range(60):
        batch = []
        for pid in ranks:
            d = 0.04 * (2.0 if pid == 102 else 1.0) * rng.lognormvariate(0, 0.05)
            batch += [acquire(pid, "step", t[pid]), release(pid, "step", t[pid] + d)]
            t[pid] += d + 0.001
        feed.observe(batch, 0.0)
    (named,) = told
    assert isinstance(named, StragglerDetected)
    assert (named.rank, named.pid, named.scope, named.basis) == (2, 102, "step", "cycle")
    assert restarted == [2]
    rows = feed.annotate([RankStatus(rank=r, state=WorkerState.HEALTHY) for r in range(4)])
    assert rows[2].straggler == ("step",) and rows[2].slowness is not None
    assert rows[2].slowness >= 1.3
    assert rows[0].straggler == () and rows[3].slowness is None  # rank 3: never judged
    # Rank 2's new process: what was known of it is dropped, and that is told.
    ranks[103] = 2
    feed.observe([acquire(103, "step", 100.0), release(103, "step", 100.04)], 0.0)
    recovered = told[-1]
    assert isinstance(recovered, StragglerRecovered)
    assert (recovered.rank, recovered.reason) == (2, "its process was replaced")
    assert feed.detector.stragglers() == {}


def test_a_bounded_number_of_sites_is_watched() -> None:
    det = StragglerDetector(max_sites=1)
    det.block(0, "a", 0.0, 1.0)
    det.block(0, "b", 0.0, 1.0)
    assert "1 sites" in repr(det)
    with pytest.raises(ValueError, match="max_sites"):
        StragglerDetector(max_sites=0)


@pytest.mark.asyncio
async def test_a_server_that_observes_gets_stamped_blocks_and_one_that_does_not_none(
    tmp_path: Path,
) -> None:
    """Through a real FIFO: a server with ``on_requests`` asks for stamps in its marker
    and the client's lines carry ``at``; a plain server's marker does not, nor do they."""
    for observing in (True, False):
        seen: list[Request] = []
        fifo = tmp_path / f"{observing}.fifo"

        def observe(reqs: Sequence[Request], _at: float, seen: list[Request] = seen) -> None:
            seen.extend(reqs)

        async with TimerServer(fifo=fifo, on_requests=observe if observing else None):
            client = FifoClient(str(fifo))
            try:
                before = time.monotonic()
                for _ in range(3):
                    with expires(after=30, scope="step", client=client):
                        pass
                after = time.monotonic()
                deadline = time.monotonic() + 10
                while observing and len(seen) < 6:
                    assert time.monotonic() < deadline, "6 requests observed within 10 s"
                    await anyio.sleep(0.01)
            finally:
                client.close()
        if observing:
            assert [r.is_release for r in seen] == [False, True] * 3
            stamps = [r.at for r in seen]
            assert all(s is not None and before <= s <= after for s in stamps), (
                before,
                stamps,
                after,
            )
            assert stamps == sorted(stamps)  # type: ignore[type-var]
        else:
            assert seen == []


def node(name: str, *ranks: RankStatus) -> NodeRecord:
    return NodeRecord(
        node=name, job="j", host="h", pid=1, started_at=1.0, updated_at=1.0, heartbeat=1.0,
        ranks=ranks,
    )  # fmt: skip


def test_the_job_view_lists_named_ranks_and_ranks_slow_across_nodes() -> None:
    healthy = WorkerState.HEALTHY
    even = {"step": (0.04, 0.001, 0.039)}
    records = [
        node("a", RankStatus(rank=0, state=healthy, timings=even)),
        node(
            "b",
            RankStatus(rank=0, state=healthy, pid=7, timings={"step": (0.064, 0.001, 0.063)}),
            RankStatus(rank=1, state=healthy, slowness=2.0, straggler=("load",), timings=even),
        ),
        node("c", RankStatus(rank=0, state=healthy, timings=even)),
    ]
    found = job_stragglers(records)
    assert [(s.node, s.rank, s.scopes, s.job_wide) for s in found] == [
        ("b", 1, ("load",), False),  # named by its node, the slowest
        ("b", 0, ("step",), True),  # 1.6x the job's other ranks in "step"
    ]
    assert found[1].slowness == pytest.approx(1.6, rel=0.01) and found[1].pid == 7
    lines = format_stragglers(found)
    assert lines[0] == "stragglers:" and lines[2].endswith("in step (across nodes)")
    assert job_stragglers(records[:1]) == () and format_stragglers(()) == []
