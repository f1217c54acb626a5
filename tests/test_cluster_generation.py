"""The generation key's rules when the store cannot be trusted (pure, no store, no clock):
bumps never go back, what a node knows is written back, every bump is paid from the
budget."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from aiotimer.cluster._generation import (
    LEDGER_SLACK,
    FollowStep,
    GenerationFollower,
    GenerationRecord,
    next_generation,
)
from aiotimer.cluster._record import decode, encode
from aiotimer.supervisor._restart import Backoff, RestartPolicy

NOW = 1_700_000_000.0
POLICY = RestartPolicy(max_restarts=3, window=60.0, backoff=Backoff(initial=1, cap=8, jitter=0))


def bump(current: GenerationRecord, seen: int, at: float = NOW) -> GenerationRecord | None:
    return next_generation(
        current, seen=seen, policy=POLICY, now=at, u=0.5, node="b", rank=0, reason="reaped"
    )


# -- writers: max(stored, seen) + 1 ----------------------------------------------------------


def test_a_writer_never_writes_a_generation_it_has_seen() -> None:
    # The store lost the key (or went back to generation 1) after the job reached 4.
    for stored in (GenerationRecord(), GenerationRecord(generation=1, restarts=(NOW - 5,))):
        new = bump(stored, seen=4)
        assert new is not None
        assert new.generation == 5
    assert bump(GenerationRecord(generation=5), seen=4) is None, "already bumped past 4"


def test_a_writer_counts_only_the_restarts_the_budget_can_count() -> None:
    past = tuple(NOW - 5000 + i for i in range(1000))  # long out of the window
    future = (NOW + 3600.0,) * 3  # a forged budget spent in advance
    new = bump(GenerationRecord(generation=9, restarts=past + future), seen=9)
    assert new is not None
    assert new.gave_up is None
    assert new.restarts == (NOW,)


# -- records out of range are not records ----------------------------------------------------


def test_out_of_range_generation_records_do_not_decode() -> None:
    for raw in (
        b'{"generation": -1}',
        b'{"generation": 9007199254740992}',
        b'{"generation": 1, "restarts": [-5]}',
        b'{"generation": 1, "at": 1e300}',
        b'{"generation": 1, "delay": -1}',
        b'{"generation": 1, "rank": -1}',
        b"\x00garbage",
    ):
        assert decode(GenerationRecord, raw) is None, raw
    big_delay = decode(GenerationRecord, b'{"generation": 1, "delay": 1e300}')
    assert big_delay is not None and big_delay.delay == 1e300  # clamped when acted on


# -- followers -------------------------------------------------------------------------------


NOTHING = GenerationRecord()


def follower(known: GenerationRecord | None = NOTHING) -> GenerationFollower:
    return GenerationFollower(POLICY, known)


def test_a_newer_generation_restarts_with_its_delay_clamped_to_the_back_off_cap() -> None:
    f = follower()
    stored = GenerationRecord(generation=1, delay=1e300, at=NOW)
    step = f.observe(stored, now=0.0)
    assert step.act is not None
    assert (step.act.generation, step.act.delay, step.write) == (1, 8.0, None)
    assert f.observe(stored, now=0.1) == FollowStep(), "read again (a new watch): no news"


def test_a_lost_key_is_written_back_and_the_next_bump_restarts_every_node() -> None:
    known = GenerationRecord(generation=3, restarts=(NOW,), at=NOW, node="a", reason="r")
    a, b = follower(known), follower(known)
    for f in (a, b):
        step = f.observe(None, now=0.0)  # deleted, or etcd restarted on an empty data dir
        assert (step.write, step.act) == (known, None)
        assert step.note is not None and "writing back generation 3" in step.note
        assert f.observe(known, now=0.0) == FollowStep(), "the write-back itself is no news"
    # The next failure, on a node that ran generation 3, bumps to 4 whatever is stored.
    new = bump(GenerationRecord(), seen=3, at=NOW + 10)
    assert new is not None and new.generation == 4
    for f in (a, b):
        act = f.observe(new, now=1.0).act
        assert act is not None and act.generation == 4


def test_garbage_is_taken_as_absent_and_written_over() -> None:
    known = GenerationRecord(generation=2, at=NOW)
    step = follower(known).observe(None, now=0.0)  # the shell reads garbage as None
    assert step.write == known
    assert follower().observe(None, now=0.0) == FollowStep(), "nothing known: nothing to restore"


def test_a_rewound_bump_from_a_node_that_did_not_know_is_carried_forward() -> None:
    known = GenerationRecord(generation=5, restarts=(NOW - 1,), at=NOW - 1)
    # Node c joined after the store lost the key, read generation 0, and bumped to 1.
    theirs = GenerationRecord(generation=1, restarts=(NOW,), at=NOW, node="c", rank=1, reason="x")
    a, b = follower(known), follower(known)
    step = a.observe(theirs, now=0.0)
    assert step.act is not None and step.write == step.act
    assert (step.act.generation, step.act.node, step.act.reason) == (6, "c", "x")
    assert step.act.restarts == (NOW - 1, NOW)
    assert step.note is not None and "carried forward as generation 6" in step.note
    # Every node carries it forward to the same record: one compare-and-set wins, and the
    # others find their own value in the key.
    assert b.observe(theirs, now=0.0).write == step.write
    assert b.observe(step.act, now=0.0) == FollowStep()


def test_a_stale_value_written_back_by_a_lagging_node_is_not_a_bump() -> None:
    old = GenerationRecord(generation=4, at=NOW - 10)
    new = GenerationRecord(generation=5, at=NOW)
    f = follower(old)
    assert f.observe(new, now=0.0).act == new
    step = f.observe(old, now=1.0)  # a node that still knew 4 wrote it back
    assert (step.write, step.act) == (new, None)


def test_forged_bumps_are_paid_from_the_budget_then_end_the_job() -> None:
    f = follower()
    acts = [f.observe(GenerationRecord(generation=g, at=NOW), now=g * 0.1) for g in range(1, 6)]
    restarts = [s.act for s in acts if s.act is not None and s.act.gave_up is None]
    assert [r.generation for r in restarts] == [1, 2, 3], "3 restarts: the budget"
    final = acts[3]
    assert final.act is not None and final.act.gave_up is not None
    assert "job restart budget exhausted (3 restarts in 60s): generation 4" in final.act.gave_up
    assert final.write == final.act, "written, so every node ends"
    assert acts[4].act is None, "a node that ended stays ended"
    assert acts[4].write == final.act, "and keeps the job ended"
    assert "generation 4 (node ?: no reason) would be one more" in final.act.gave_up


def test_the_ledger_refills_as_bumps_leave_its_window() -> None:
    f = follower()
    window = POLICY.window - LEDGER_SLACK
    for g in range(1, 4):
        assert f.observe(GenerationRecord(generation=g), now=float(g)).act is not None
    step = f.observe(GenerationRecord(generation=4), now=1.0 + window)
    assert step.act is not None and step.act.gave_up is None, "the first bump left the window"


def test_a_give_up_is_always_obeyed_and_kept() -> None:
    f = follower(GenerationRecord(generation=3))
    ended = GenerationRecord(generation=1, gave_up="node b gave up")
    assert f.observe(ended, now=0.0).act == ended, "even behind: stopping is safe"
    step = f.observe(GenerationRecord(generation=7), now=0.0)
    assert (step.write, step.act) == (ended, None), "the give-up is written back"


def test_a_catching_up_follower_takes_the_current_record_as_it_is() -> None:
    f = follower(None)
    assert f.observe(None, now=0.0).act == GenerationRecord()
    g = follower(None)
    assert g.observe(GenerationRecord(generation=9), now=0.0).act == GenerationRecord(generation=9)


# -- the rules hold whatever the store holds ---------------------------------------------------

values = st.one_of(
    st.none(),
    st.builds(
        GenerationRecord,
        generation=st.integers(0, 12),
        at=st.one_of(st.none(), st.floats(0, 1e10)),
        node=st.sampled_from([None, "a", "b"]),
        delay=st.floats(0, 1e300),
        gave_up=st.one_of(st.none(), st.just("stop")),
    ),
)


@settings(max_examples=300, deadline=None)
@given(reads=st.lists(st.tuples(values, st.floats(0, 5)), max_size=40))
def test_generations_acted_on_only_move_forward_within_the_budget(
    reads: list[tuple[GenerationRecord | None, float]],
) -> None:
    f = follower()
    now, restarts, last, ended = 0.0, [], 0, False
    for stored, dt in reads:
        now += dt
        step = f.observe(stored, now=now)
        if step.write is not None:
            assert decode(GenerationRecord, encode(step.write)) == step.write, "writes are valid"
        act = step.act
        if act is None:
            continue
        assert not ended, "nothing after a give-up"
        if act.gave_up is not None:
            ended = True
            continue
        assert act.generation > last, "a restart is always to a newer generation"
        assert act.delay <= POLICY.backoff.cap
        last = act.generation
        restarts.append(now)
        recent = [t for t in restarts if t > now - (POLICY.window - LEDGER_SLACK)]
        assert len(recent) <= POLICY.max_restarts
    assert math.isfinite(now)
