"""Folding a batch: pure core against a naive model, and the engine's use of it."""

from __future__ import annotations

import itertools
import signal
from collections import Counter
from dataclasses import astuple
from pathlib import Path

import anyio
import pytest
from _pids import fake_pid
from hypothesis import given, settings
from hypothesis import strategies as st

from aiotimer import Request
from aiotimer.core._fold import fold, paired_blocks
from aiotimer.events import Event
from aiotimer.reapers._escalator import ReapRetry
from aiotimer.reapers._policy import ReapPolicy
from aiotimer.server import TimerServer
from aiotimer.server._engine import MAX_TIMERS, Engine
from aiotimer.server._journal import Journal
from aiotimer.testing import FakeClock, MemorySource, RecordingReaper
from aiotimer.wire import Decoded

KILL = int(signal.SIGKILL)
#: Made-up workers fed to the server and the engine (see tests/_pids.py).
P100, P101, P102 = map(fake_pid, (100, 101, 102))
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
    """``batch`` applied to ``live`` as the engine applies it with :func:`fold`: the
    timers the batch ends first, then the applied requests in order."""
    result = fold(batch)
    live = {key: t for key, t in live.items() if not result.ends(*key)}
    ended = result.pairs  # blocks, recorded with their duration
    for i in result.apply:
        r = batch[i]
        key = (r.pid, r.scope_id)
        if r.is_release:
            ended += live.pop(key, None) is not None
        else:
            live[key] = r.expiration_time
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


def fates(batch: list[Request]) -> list[str]:
    """Each request's fate, from a naive model: "pa"/"pr" a paired acquire/release,
    "sup" a superseded acquire, "apply" the rest."""
    out = ["apply"] * len(batch)
    open_acquire: dict[tuple[int, str], int] = {}
    for i, r in enumerate(batch):
        key = (r.pid, r.scope_id)
        if r.is_release:
            j = open_acquire.pop(key, None)
            if j is not None:
                out[j], out[i] = "pa", "pr"
        else:
            if key in open_acquire:
                out[open_acquire[key]] = "sup"
            open_acquire[key] = i
    return out


@given(requests)
def test_fold_finds_the_fates_of_a_naive_model(batch: list[Request]) -> None:
    result, want = fold(batch), fates(batch)
    assert result.apply == [i for i, fate in enumerate(want) if fate == "apply"]
    assert result.superseded == want.count("sup")
    assert result.pairs == want.count("pr") == want.count("pa")
    pr = [r.scope_id for r, f in zip(batch, want, strict=True) if f == "pr"]
    assert result.paired == Counter(pr)
    assert set(result.pids()) == {r.pid for r in batch}
    for pid in (1, 2, 3):
        assert set(result.scopes(pid)) == {r.scope_id for r in batch if r.pid == pid}


@given(requests)
def test_a_live_timer_is_ended_by_a_first_request_that_is_a_paired_acquire(
    batch: list[Request],
) -> None:
    """:meth:`Fold.ends`: the key's first request is an acquire, folded (paired, or
    superseded by the acquires up to a paired one)."""
    result, want = fold(batch), fates(batch)
    for pid, scope in itertools.product((1, 2, 3), ("a", "b", "c")):
        mine = [i for i, r in enumerate(batch) if (r.pid, r.scope_id) == (pid, scope)]
        chain = list(itertools.takewhile(lambda i: want[i] == "sup", mine))
        rest = mine[len(chain) :]
        ends = bool(mine) and not batch[mine[0]].is_release and want[rest[0]] == "pa"
        assert result.ends(pid, scope) is ends


def test_fold_examples() -> None:
    a, r = Request(1, "s", 5.0, KILL), Request(1, "s", -1, 0)
    other = Request(2, "s", 5.0, KILL)
    assert fold([a, r]).apply == []
    assert fold([a, other, r]).apply == [1]
    assert (fold([a, a, r]).apply, fold([a, a, r]).superseded) == ([], 1)
    assert (fold([a, a]).apply, fold([a, a]).superseded) == ([1], 1)
    assert fold([r, a]).apply == [0, 1]
    assert fold([a, r, a, r]).pairs == 2
    assert fold([a, r]).ends(1, "s") and fold([a, a, r]).ends(1, "s")
    assert not fold([r, a, r]).ends(1, "s")
    assert not fold([a, a]).ends(1, "s")
    assert not fold([a, r]).ends(2, "s")


@pytest.mark.asyncio
async def test_a_block_begun_and_ended_in_one_batch_never_reaches_the_table() -> None:
    source, reaper = MemorySource(), RecordingReaper()
    async with TimerServer(sources=[source], clock=FakeClock(), reaper=reaper) as server:
        source.push(Request(P100, "x.py:1#1", FAR, KILL), Request(P100, "x.py:1#1", -1, 0))
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
        source.push(Request(P100, "s", FAR, KILL))
        [first] = srv.get_state().timers
        source.push(Request(P100, "s", FAR + 50, KILL), Request(P100, "s", -1, 0))
        assert srv.get_state().timers == ()
        source.push(Request(P100, "s", FAR, KILL), Request(P100, "s", FAR + 50, KILL))
        [timer] = srv.get_state().timers  # the later acquire replaced the superseded one
        assert timer.deadline == pytest.approx(first.deadline + 50)


# -- the engine: a folded batch leaves what applying its requests one by one leaves --------

SOON = 5.0  # seconds: "soon" acquires expire when the clock moves past it
ALL_PIDS = (P100, P101, P102)
ALL_SCOPES = ("a.py:1#1", "a.py:1#2", "b.py:2#1")  # two sites
pids = st.sampled_from(ALL_PIDS)
scopes = st.sampled_from(ALL_SCOPES)
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
    max_size=8,
)
# Single requests, and blocks (an acquire and its release, next to each other), so that a
# worker often sends nothing but blocks the batch folds.
batch_requests = st.lists(
    st.builds(
        lambda pid, scope, kind, t: {
            "acquire": [Request(pid, scope, FAR + t, KILL)],
            "release": [Request(pid, scope, -1.0, KILL)],
            "block": [Request(pid, scope, FAR + t, KILL), Request(pid, scope, -1.0, KILL)],
        }[kind],
        pids,
        scopes,
        st.sampled_from(["acquire", "release", "block"]),
        st.floats(0, 100),
    ),
    max_size=10,
).map(lambda groups: [req for group in groups for req in group])


def _engine_state(
    prior: list[Request],
    restored: list[Request],
    batch: list[Request],
    caps: tuple[int, int],
    *,
    one_by_one: bool,
) -> tuple[object, ...]:
    """Apply ``prior`` and ``restored`` (alike for both ways), advance past the soon
    deadlines, apply ``batch`` (as one batch, or one request at a time), then release
    every key one by one (an overdue block left behind shows in the statistics). The
    engine has a journal, and the caps ``caps`` (max_timers, max_timers_per_worker)."""

    async def run() -> tuple[object, ...]:
        clock = FakeClock(wall_offset=1e9)
        events: list[Event] = []
        async with anyio.create_task_group() as tg:
            journal = Journal(Path("never-written.journal"))  # its task does not run
            engine = Engine(
                task_group=tg,
                clock=clock,
                reaper=RecordingReaper(),
                policy=ReapPolicy(),
                emit=events.append,
                retry=ReapRetry(),
                request_events=False,
                self_kill_after_reap=False,
                journal=journal,
                max_timers=caps[0],
                max_timers_per_worker=caps[1],
            )
            for req in prior:
                engine.submit(Decoded([req]), "test")
            engine.restore(restored, "journal")
            clock.advance(SOON + 1)
            engine.submit(Decoded([Request(fake_pid(999), "tick", -1.0, 0)]), "test")  # expire now
            if one_by_one:
                for req in batch:
                    engine.submit(Decoded([req]), "test")
            else:
                engine.submit(Decoded(list(batch)), "test")
            timers = [(t.pid, t.scope_id, t.deadline, t.signal) for t in engine.table.snapshot()]
            # What the journal's next write would say: each worker's earliest deadline (of
            # timers with equal deadlines, it may name either).
            journal._update(engine.table, 0.0)
            journaled = {pid: entry.mono for pid, entry in journal._entries.items()}
            during = (
                timers,
                astuple(engine.counts),
                engine.scope_stats(),
                len(engine.overdue),
                journaled,
            )
            ends = [Request(p, s, -1.0, 0) for p in ALL_PIDS for s in ALL_SCOPES]
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


@settings(max_examples=400, deadline=None)
@given(
    prior_requests,
    st.lists(st.builds(Request, pids, scopes, st.just(FAR), st.just(KILL)), max_size=3),
    batch_requests,
    st.tuples(st.integers(1, 24), st.integers(1, 24)) | st.just((MAX_TIMERS, MAX_TIMERS)),
)
def test_the_engine_applies_a_folded_batch_like_its_requests_one_by_one(
    prior: list[Request], restored: list[Request], batch: list[Request], caps: tuple[int, int]
) -> None:
    """Same timers, counters, statistics, journal and events, before and after the
    overdue blocks and the journal's restored timers come into play, near the caps too."""
    folded_state = _engine_state(prior, restored, batch, caps, one_by_one=False)
    assert folded_state == _engine_state(prior, restored, batch, caps, one_by_one=True)


@pytest.mark.parametrize("caps", [(24, 2), (2, 24)])
def test_near_a_cap_a_batch_is_applied_one_by_one(caps: tuple[int, int]) -> None:
    """An open block counts toward the caps while it is open: here it fills worker P100's
    (or the table's) last place, so the acquire that comes next is rejected."""
    prior = [Request(P100, "a.py:1#1", FAR, KILL)]
    batch = [
        Request(P100, "a.py:1#2", FAR, KILL),
        Request(P100, "b.py:2#1", FAR, KILL),  # no room while a.py:1#2 is open
        Request(P100, "a.py:1#2", -1.0, 0),
    ]
    folded = _engine_state(prior, [], batch, caps, one_by_one=False)
    assert folded == _engine_state(prior, [], batch, caps, one_by_one=True)
    during, _, kinds = folded
    assert [t[1] for t in during[0]] == ["a.py:1#1"]
    assert ("RequestRejected", P100, None) in kinds  # a cap names the worker


@settings(max_examples=100, deadline=None)
@given(requests)
def test_paired_blocks_are_the_blocks_begun_and_ended_within_the_batch(
    batch: list[Request],
) -> None:
    """Each pair is an acquire and the release that ends it, in the batch's order: as
    many as the fold counts, each the last acquire of its key before its release."""
    result = fold(batch)
    pairs = paired_blocks(batch, result)
    assert len(pairs) == result.pairs
    assert Counter(rel.scope_id for _, rel in pairs) == Counter(result.paired)
    position = {id(r): i for i, r in enumerate(batch)}
    for acquire, release in pairs:
        a, r = position[id(acquire)], position[id(release)]
        assert not acquire.is_release and release.is_release and a < r
        assert (acquire.pid, acquire.scope_id) == (release.pid, release.scope_id)
        between = batch[a + 1 : r]
        assert not any((q.pid, q.scope_id) == (acquire.pid, acquire.scope_id) for q in between)
