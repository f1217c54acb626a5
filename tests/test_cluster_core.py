"""The cluster layer's pure parts: records, the publish schedule, job restarts, the view."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiotimer.cluster import (
    GenerationRecord,
    MemberRecord,
    NodeRecord,
    ReapRecord,
    build_view,
    format_view,
)
from aiotimer.cluster._generation import next_generation
from aiotimer.cluster._record import PublishSchedule, decode, encode, node_key
from aiotimer.events import RankStatus, WorkerInfo, WorkerState
from aiotimer.supervisor._restart import Backoff, RestartPolicy

NOW = 1_700_000_000.0


def node(name: str, *, updated: float = NOW, heartbeat: float = 1.0, **kw: object) -> NodeRecord:
    return NodeRecord(
        node=name,
        job="j",
        host=f"host-{name}",
        pid=100,
        started_at=NOW - 60,
        updated_at=updated,
        heartbeat=heartbeat,
        **kw,  # type: ignore[arg-type]
    )


# -- records ----------------------------------------------------------------------------


def test_records_round_trip_and_bad_values_decode_to_none() -> None:
    rec = node(
        "a",
        ranks=(RankStatus(rank=0, state=WorkerState.HEALTHY, pid=5, restarts=1),),
        workers=(WorkerInfo(pid=5, state="timed", timers=1),),
        last_reaps=(ReapRecord(at=NOW, pid=5, rank=0, scopes=("step",), signal="SIGKILL"),),
        counters={"reaped": 1},
    )
    assert decode(NodeRecord, encode(rec)) == rec
    assert decode(NodeRecord, b"not json") is None
    assert decode(NodeRecord, b'{"node": 1}') is None
    assert node_key("job-1", "a") == "/aiotimer/v1/job-1/nodes/a"


# -- the publish schedule ---------------------------------------------------------------


def test_schedule_first_write_at_once_then_rate_limited_changes_and_heartbeats() -> None:
    s = PublishSchedule(min_interval=1.0, heartbeat=3.0)
    assert s.due(10.0) == 10.0
    s.published(10.0)
    assert s.due(10.5) == 13.0, "no change: next write is the heartbeat"
    s.changed()
    assert s.due(10.5) == 11.0, "a change waits out min_interval"
    assert s.due(12.0) == 12.0, "a change after min_interval is written at once"
    s.published(12.0)
    s.failed()
    assert s.due(12.2) == 13.0


@given(  # in milliseconds, as integers: exact arithmetic
    min_interval=st.integers(0, 5000),
    extra=st.integers(1, 5000),
    events=st.lists(st.tuples(st.integers(0, 10000), st.booleans()), max_size=30),
)
def test_schedule_never_writes_faster_than_min_interval(
    min_interval: int, extra: int, events: list[tuple[int, bool]]
) -> None:
    s = PublishSchedule(min_interval=min_interval, heartbeat=min_interval + extra)
    now, last = 0, None
    for step, change in events:
        now += step
        if change:
            s.changed()
        if s.due(now) <= now:
            if last is not None:
                assert now - last >= min_interval
            s.published(now)
            last = now
        else:
            # Without a change nothing is due before the heartbeat.
            assert last is not None
            assert s.due(now) <= last + s.heartbeat


def test_schedule_rejects_min_interval_above_heartbeat() -> None:
    with pytest.raises(ValueError, match="min_interval"):
        PublishSchedule(min_interval=2, heartbeat=1)


# -- job-wide restarts ------------------------------------------------------------------

POLICY = RestartPolicy(max_restarts=2, window=100.0, backoff=Backoff(initial=1, cap=8, jitter=0))


def bump(current: GenerationRecord, seen: int, now: float) -> GenerationRecord | None:
    return next_generation(
        current, seen=seen, policy=POLICY, now=now, u=0.5, node="b", rank=1, reason="reaped"
    )


def test_a_failure_bumps_the_generation_once_per_wave() -> None:
    first = bump(GenerationRecord(), seen=0, now=NOW)
    assert first is not None
    assert (first.generation, first.node, first.rank, first.delay) == (1, "b", 1, 1.0)
    assert first.restarts == (NOW,)
    # Another node's worker failed in the same generation 0: already handled.
    assert bump(first, seen=0, now=NOW + 1) is None
    second = bump(first, seen=1, now=NOW + 2)
    assert second is not None
    assert (second.generation, second.delay) == (2, 2.0), "back-off grows with the window"


def test_the_job_gives_up_when_the_budget_in_the_window_is_spent() -> None:
    rec = GenerationRecord()
    for seen in range(2):
        nxt = bump(rec, seen=seen, now=NOW + seen)
        assert nxt is not None
        rec = nxt
    final = bump(rec, seen=2, now=NOW + 5)
    assert final is not None
    assert final.generation == 2
    assert final.gave_up is not None
    assert "budget exhausted (2 restarts in 100s)" in final.gave_up
    assert "node b rank 1: reaped" in final.gave_up
    assert bump(final, seen=2, now=NOW + 6) is None, "nothing after a give-up"


def test_old_restarts_leave_the_window() -> None:
    rec = GenerationRecord(generation=2, restarts=(NOW, NOW + 1))
    nxt = bump(rec, seen=2, now=NOW + 100.5)
    assert nxt is not None
    assert nxt.gave_up is None
    assert nxt.restarts == (NOW + 1, NOW + 100.5)


def test_an_infinite_window_never_refills() -> None:
    policy = RestartPolicy(max_restarts=1, window=math.inf)
    rec = GenerationRecord(generation=1, restarts=(0.0,))
    nxt = next_generation(
        rec, seen=1, policy=policy, now=NOW, u=0.0, node="a", rank=None, reason="crashed"
    )
    assert nxt is not None
    assert nxt.gave_up is not None
    assert nxt.gave_up.endswith("node a: crashed")


# -- the job view -----------------------------------------------------------------------


def test_view_judges_running_stale_lost_and_left_nodes() -> None:
    records = [
        node(
            "a",
            role="supervisor",
            ranks=(
                RankStatus(rank=0, state=WorkerState.HEALTHY, pid=11, restarts=1),
                RankStatus(rank=1, state=WorkerState.HEALTHY, pid=12, restarts=1),
            ),
            workers=(WorkerInfo(pid=12, state="timed", timers=2),),
            live_timers=2,
            restarts=1,
            last_reaps=(ReapRecord(at=NOW - 5, pid=10, rank=0, scopes=("s",), signal="SIGKILL"),),
        ),
        node("b", updated=NOW - 4.5),  # 3 heartbeats + 1 s = 4 s: stale
        node("c", updated=NOW - 3.9),  # still fresh
    ]
    members = [
        MemberRecord(node=n, host=f"host-{n}", pid=1, joined_at=NOW - 60) for n in "abcd"
    ] + [
        MemberRecord(
            node="e",
            host="h",
            pid=2,
            joined_at=0,
            left_at=NOW,
            outcome="succeeded",
            last_reaps=(ReapRecord(at=NOW - 1, pid=20, rank=1, signal="SIGKILL"),),
        )
    ]
    view = build_view("j", records, members, GenerationRecord(generation=1), NOW)
    assert {r.node: r.status for r in view.nodes} == {
        "a": "running",
        "b": "stale",
        "c": "running",
        "d": "lost",
        "e": "left",
    }
    assert view.totals["workers"] == 2
    assert view.totals["live_timers"] == 2
    assert (view.totals["lost"], view.totals["stale"], view.totals["left"]) == (1, 1, 1)
    assert view.worker_states == {"healthy": 2}
    assert [(r.node, r.reap.rank) for r in view.recent_reaps] == [("e", 1), ("a", 0)]
    as_json = view.to_json()
    nodes = as_json["nodes"]
    assert isinstance(nodes, list)
    assert [n["node"] for n in nodes] == ["a", "b", "c", "d", "e"]
    assert nodes[0]["workers"][1] == {
        "rank": 1,
        "pid": 12,
        "state": "healthy",
        "restarts": 1,
        "timers": 2,
        "scopes": (),
        "slowness": None,
        "straggler": (),
    }
    assert nodes[0]["workers_total"] == 2 and "ranks" not in nodes[0]
    assert nodes[3] == {"node": "d", "status": "lost", "host": "host-d", "pid": 1, "age": None}
    text = format_view(view)
    assert "job j: 5 nodes (2 running, 1 stale, 1 lost, 1 left)" in text
    assert "generation 1" in text
    assert "record gone (lease expired)" in text
    assert "node a rank 0 pid 10  SIGKILL  scopes: s" in text
    assert "supervisor, 2 workers, 2 timers" in text
    assert "  rank 0    pid       11  healthy    restarts 1\n" in text
    assert "  rank 1    pid       12  healthy    restarts 1, 2 timers\n" in text


def test_view_of_a_job_with_no_nodes() -> None:
    view = build_view("empty", [], [], None, NOW)
    assert view.nodes == ()
    assert view.to_json()["nodes"] == []
    assert format_view(view).startswith("job empty: 0 nodes")
