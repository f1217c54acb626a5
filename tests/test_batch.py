"""Folding a batch: pure core against a naive model, and the engine's use of it."""

from __future__ import annotations

import signal
from collections import Counter
from dataclasses import astuple

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiotimer import Request
from aiotimer._batch import APPLY, PAIRED_ACQUIRE, PAIRED_RELEASE, SUPERSEDED, fold
from aiotimer._escalator import ReapRetry
from aiotimer._policy import ReapPolicy
from aiotimer._protocol import Decoded
from aiotimer._server_engine import Engine
from aiotimer.events import Event
from aiotimer.server import TimerServer
from aiotimer.testing import FakeClock, MemorySource, RecordingReaper

KILL = int(signal.SIGKILL)
FAR = 4e9  # an epoch deadline in 2096

requests = st.lists(
    st.builds(
        lambda pid, scope, release, t: Request(pid, scope, -1.0 if release else t, KILL),
        st.sampled_from([1, 2]),
        st.sampled_from(["a", "b"]),
        st.booleans(),
        st.floats(0, 100),
    ),
    max_size=12,
)


def naive(batch: list[Request]) -> tuple[dict[tuple[int, str], float], int]:
    """Every request applied in order: live timers, and releases that ended one."""
    live: dict[tuple[int, str], float] = {}
    ended = 0
    for r in batch:
        key = (r.pid, r.scope_id)
        if r.is_release:
            ended += live.pop(key, None) is not None
        else:
            live[key] = r.expiration_time
    return live, ended


def folded(
    batch: list[Request], live: dict[tuple[int, str], float]
) -> tuple[dict[tuple[int, str], float], int]:
    """``batch`` applied to ``live`` as the engine applies it with :func:`fold`."""
    live = dict(live)
    ended = 0
    for r, fate in zip(batch, fold(batch).fates, strict=True):
        key = (r.pid, r.scope_id)
        if fate == APPLY:
            if r.is_release:
                ended += live.pop(key, None) is not None
            else:
                live[key] = r.expiration_time
        elif fate == PAIRED_ACQUIRE:
            live.pop(key, None)  # replaced, then ended by its release
        elif fate == PAIRED_RELEASE:
            ended += 1  # a block, recorded with its duration
    return live, ended


keys = st.tuples(st.sampled_from([1, 2]), st.sampled_from(["a", "b"]))


@given(st.dictionaries(keys, st.floats(0, 9)), requests)
def test_fold_applies_like_every_request_in_order(
    before: dict[tuple[int, str], float], batch: list[Request]
) -> None:
    """Same live timers after the batch, and as many blocks recorded as ended."""
    prior = [Request(pid, scope, t, KILL) for (pid, scope), t in before.items()]
    live, ended = naive(prior)
    want_live, want_ended = naive(prior + batch)
    got_live, got_ended = folded(batch, live)
    assert got_live == want_live
    assert ended + got_ended == want_ended


@given(requests)
def test_paired_requests_pair_up_in_order(batch: list[Request]) -> None:
    fates = fold(batch).fates
    for i, fate in enumerate(fates):
        if fate == PAIRED_ACQUIRE:
            key = (batch[i].pid, batch[i].scope_id)
            j = next(
                j for j in range(i + 1, len(batch)) if (batch[j].pid, batch[j].scope_id) == key
            )
            assert batch[j].is_release and fates[j] == PAIRED_RELEASE
        if fate == SUPERSEDED:
            assert not batch[i].is_release


@given(requests)
def test_fold_counts_the_paired_releases_of_each_scope(batch: list[Request]) -> None:
    folded = fold(batch)
    fates = zip(batch, folded.fates, strict=True)
    want = Counter(r.scope_id for r, f in fates if f == PAIRED_RELEASE)
    assert folded.paired == want


def test_fold_examples() -> None:
    a, r = Request(1, "s", 5.0, KILL), Request(1, "s", -1, 0)
    other = Request(2, "s", 5.0, KILL)
    assert list(fold([a, r]).fates) == [PAIRED_ACQUIRE, PAIRED_RELEASE]
    assert list(fold([a, other, r]).fates) == [PAIRED_ACQUIRE, APPLY, PAIRED_RELEASE]
    assert list(fold([a, a, r]).fates) == [SUPERSEDED, PAIRED_ACQUIRE, PAIRED_RELEASE]
    assert list(fold([a, a]).fates) == [SUPERSEDED, APPLY]
    assert list(fold([r, a]).fates) == [APPLY, APPLY]


@pytest.mark.asyncio
async def test_a_block_begun_and_ended_in_one_batch_never_reaches_the_table() -> None:
    source, reaper = MemorySource(), RecordingReaper()
    async with TimerServer(sources=[source], clock=FakeClock(), reaper=reaper) as server:
        source.push(Request(100, "x.py:1#1", FAR, KILL), Request(100, "x.py:1#1", -1, 0))
        state = server.get_state()
        assert state.timers == ()
        assert (state.counters.acquired, state.counters.released) == (1, 1)
        assert reaper.calls == []  # not even attached: nothing of it was kept
        [site] = server.scope_stats()
        assert (site.site, site.count, site.max) == ("x.py:1", 1, 0.0)


@pytest.mark.asyncio
async def test_a_folded_block_still_replaces_and_ends_a_live_timer() -> None:
    source = MemorySource()
    async with TimerServer(sources=[source], clock=FakeClock(), reaper=RecordingReaper()) as srv:
        source.push(Request(100, "s", FAR, KILL))
        [first] = srv.get_state().timers
        source.push(Request(100, "s", FAR + 50, KILL), Request(100, "s", -1, 0))
        assert srv.get_state().timers == ()
        source.push(Request(100, "s", FAR, KILL), Request(100, "s", FAR + 50, KILL))
        [timer] = srv.get_state().timers  # the later acquire replaced the superseded one
        assert timer.deadline == pytest.approx(first.deadline + 50)


# -- the engine: a folded batch leaves what applying its requests one by one leaves --------

SOON = 5.0  # seconds: "soon" acquires expire when the clock moves past it
pids = st.sampled_from([100, 101])
scopes = st.sampled_from(["a.py:1#1", "a.py:1#2"])  # one site
# Before the batch: acquires (report-only ones due soon, which expire unreaped and leave
# an overdue block behind, or reaping ones due far) and releases.
prior_requests = st.lists(
    st.builds(
        lambda pid, scope, kind: Request(
            pid, scope, *{"soon": (1e9 + SOON, 0), "far": (FAR, KILL), "rel": (-1.0, 0)}[kind]
        ),
        pids,
        scopes,
        st.sampled_from(["soon", "far", "rel"]),
    ),
    max_size=6,
)
batch_requests = st.lists(
    st.builds(
        lambda pid, scope, release, t: Request(pid, scope, -1.0 if release else FAR + t, KILL),
        pids,
        scopes,
        st.booleans(),
        st.floats(0, 100),
    ),
    max_size=12,
)


def _engine_state(
    prior: list[Request], restored: list[Request], batch: list[Request], *, one_by_one: bool
) -> tuple[object, ...]:
    """Apply ``prior`` and ``restored`` (alike for both ways), advance past the soon
    deadlines, apply ``batch`` (as one batch, or one request at a time), then release
    every key one by one (an overdue block left behind shows in the statistics)."""

    async def run() -> tuple[object, ...]:
        clock = FakeClock(wall_offset=1e9)
        events: list[Event] = []
        async with anyio.create_task_group() as tg:
            engine = Engine(
                task_group=tg,
                clock=clock,
                reaper=RecordingReaper(),
                policy=ReapPolicy(),
                emit=events.append,
                retry=ReapRetry(),
                request_events=False,
                self_kill_after_reap=False,
            )
            for req in prior:
                engine.submit(Decoded([req]), "test")
            engine.restore(restored, "journal")
            clock.advance(SOON + 1)
            engine.submit(Decoded([Request(999, "tick", -1.0, 0)]), "test")  # expire now
            if one_by_one:
                for req in batch:
                    engine.submit(Decoded([req]), "test")
            else:
                engine.submit(Decoded(list(batch)), "test")
            timers = [(t.pid, t.scope_id, t.deadline, t.signal) for t in engine.table.snapshot()]
            during = (timers, astuple(engine.counts), engine.scope_stats(), len(engine.overdue))
            ends = [Request(p, s, -1.0, 0) for p in (100, 101) for s in ("a.py:1#1", "a.py:1#2")]
            for req in ends:
                engine.submit(Decoded([req]), "test")
            after = (astuple(engine.counts), engine.scope_stats(), len(engine.overdue))
            engine.close()
            tg.cancel_scope.cancel()
        kinds = [
            (type(e).__name__, getattr(e, "pid", None), getattr(e, "scope_id", None))
            for e in events
        ]
        return during, after, kinds

    return anyio.run(run)


@settings(max_examples=300)
@given(
    prior_requests,
    st.lists(st.builds(Request, pids, scopes, st.just(FAR), st.just(KILL)), max_size=3),
    batch_requests,
)
def test_the_engine_applies_a_folded_batch_like_its_requests_one_by_one(
    prior: list[Request], restored: list[Request], batch: list[Request]
) -> None:
    """Same timers, counters, statistics and events, before and after the overdue blocks
    and the journal's restored timers come into play."""
    folded_state = _engine_state(prior, restored, batch, one_by_one=False)
    assert folded_state == _engine_state(prior, restored, batch, one_by_one=True)
