"""Tests for the pure timer table (aiotimer/core/_table.py).

Unit tests pin each operation; a hypothesis state machine drives the table against a
naive dict model and checks that both agree after every step, including that the heap
of tombstones stays bounded (the compaction invariant, derived in ``_table``'s
docstring): after every public call ``heap_size <= max(2 * len, len + 100)``.
"""

from __future__ import annotations

import doctest
import math
from dataclasses import dataclass

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import aiotimer.core._table
from aiotimer.core._table import MIN_STALE, REBUILD_STEP, Timer, TimerTable


def heap_bound(live: int, min_stale: int = MIN_STALE) -> int:
    """The largest heap the compaction rule allows for ``live`` timers (no compaction
    in progress)."""
    return max(2 * live, live + min_stale)


def compacting_bound(peak: int, min_stale: int, step: int) -> int:
    """The largest heap while compactions run, ``peak`` being the largest live count
    since the table was last not compacting (derived in ``_table``'s docstring)."""
    b = max(2 * peak, peak + min_stale) + 1
    return b + (2 * peak + 1 + step) // (step - 1)


def timer(pid: int, scope: str, deadline: float, signal: int = 9) -> Timer:
    return Timer(pid=pid, scope_id=scope, deadline=deadline, signal=signal)


def test_docstring_examples() -> None:
    assert doctest.testmod(aiotimer.core._table).failed == 0


def test_acquire_new_and_replace_returns_old() -> None:
    t = TimerTable()
    first = timer(1, "a", 5.0)
    assert t.acquire(first) is None
    second = timer(1, "a", 7.0, signal=15)
    assert t.acquire(second) is first
    assert len(t) == 1
    assert t.get(1, "a") is second
    assert t.next_deadline() == 7.0


def test_release_returns_timer_and_unknown_is_noop() -> None:
    t = TimerTable()
    a = timer(1, "a", 5.0)
    t.acquire(a)
    assert t.release(2, "a") is None  # unknown worker
    assert t.release(1, "b") is None  # known worker, unknown scope
    assert len(t) == 1
    assert t.release(1, "a") is a
    assert t.release(1, "a") is None  # twice
    assert len(t) == 0
    assert list(t.workers()) == []
    assert t.next_deadline() is None


def test_drop_worker_removes_its_timers_and_samples_their_scopes() -> None:
    t = TimerTable()
    for scope, deadline in [("c", 3.0), ("a", 1.0), ("b", 2.0)]:
        t.acquire(timer(1, scope, deadline))
    other = timer(2, "x", 0.5)
    t.acquire(other)
    count, sample = t.drop_worker(1, sample=2)
    assert count == 3 and len(sample) == 2 and set(sample) <= {"a", "b", "c"}
    assert t.drop_worker(1) == (0, [])
    assert t.drop_worker(99, sample=5) == (0, [])
    assert len(t) == 1
    assert t.snapshot() == (other,)
    assert t.next_deadline() == 0.5


def test_pop_expired_in_deadline_order_ties_by_acquisition() -> None:
    t = TimerTable()
    t.acquire(timer(1, "late", 3.0))
    t.acquire(timer(2, "tie-first", 2.0))
    t.acquire(timer(1, "early", 1.0))
    t.acquire(timer(3, "tie-second", 2.0))
    assert [x.scope_id for x in t.pop_expired(2.5)] == ["early", "tie-first", "tie-second"]
    assert [x.scope_id for x in t.pop_expired(10.0)] == ["late"]
    assert len(t) == 0


def test_replacing_a_timer_moves_it_behind_its_ties() -> None:
    t = TimerTable()
    t.acquire(timer(1, "a", 2.0))
    t.acquire(timer(1, "b", 2.0))
    t.acquire(timer(1, "a", 2.0))  # re-acquired: now the younger of the two
    assert [x.scope_id for x in t.pop_expired(2.0)] == ["b", "a"]


def test_deadline_equal_to_now_is_expired() -> None:
    t = TimerTable()
    t.acquire(timer(1, "a", 5.0))
    assert t.pop_expired(math.nextafter(5.0, 0.0)) == []
    assert [x.scope_id for x in t.pop_expired(5.0)] == ["a"]


def test_next_deadline_skips_tombstones() -> None:
    t = TimerTable()
    t.acquire(timer(1, "a", 1.0))
    t.acquire(timer(1, "b", 2.0))
    t.acquire(timer(2, "c", 3.0))
    t.release(1, "a")
    assert t.next_deadline() == 2.0
    t.acquire(timer(1, "b", 9.0))  # replaced: its old entry at 2.0 is a tombstone
    assert t.next_deadline() == 3.0
    t.drop_worker(2)
    assert t.next_deadline() == 9.0
    assert t.heap_size == 1  # every tombstone in front was dropped on the way


def test_views_and_membership() -> None:
    t = TimerTable()
    a, b, c = timer(1, "a", 3.0), timer(1, "b", 1.0), timer(2, "c", 2.0)
    for x in (a, b, c):
        t.acquire(x)
    workers = t.workers()
    assert set(workers) == {1, 2}
    assert sorted(t.worker_timers(1), key=lambda x: x.scope_id) == [a, b]
    assert t.worker_timers(3) == []
    assert t.snapshot() == (b, c, a)
    t.drop_worker(2)
    assert set(workers) == {1}  # a live view
    assert (1, "a") in t
    assert (1, "c") not in t
    assert (3, "a") not in t
    assert "a" not in t
    assert (1, "a", 0) not in t
    assert a.key == (1, "a")


def test_snapshot_orders_ties_like_pop_expired() -> None:
    t = TimerTable()
    for pid in (5, 3, 4, 1):
        t.acquire(timer(pid, "s", 1.0))
    order = [x.pid for x in t.snapshot()]
    assert order == [5, 3, 4, 1]
    assert [x.pid for x in t.pop_expired(1.0)] == order


def test_repr_shows_counts_and_next_deadline() -> None:
    t = TimerTable()
    assert repr(t) == "<TimerTable 0 timers, 0 workers, next deadline none>"
    for i in range(1500):
        t.acquire(timer(i % 3 + 1, f"s{i}", 12.5 + i))
    assert repr(t) == "<TimerTable 1,500 timers, 3 workers, next deadline 12.500>"


def test_nan_deadline_is_refused() -> None:
    t = TimerTable()
    with pytest.raises(ValueError, match="NaN"):
        t.acquire(timer(1, "a", math.nan))
    assert len(t) == 0
    assert t.heap_size == 0
    # Infinite deadlines order fine: they simply never (or always) expire.
    t.acquire(timer(1, "never", math.inf))
    t.acquire(timer(1, "always", -math.inf))
    assert [x.scope_id for x in t.pop_expired(0.0)] == ["always"]
    assert t.next_deadline() == math.inf


def test_compaction_threshold_is_exact() -> None:
    """Up to 100 stale entries are tolerated; beyond that, once they are half the heap."""
    t = TimerTable()
    t.acquire(timer(1, "live", 0.0))
    for _ in range(MIN_STALE):
        t.acquire(timer(1, "live", 0.0))  # each replacement leaves one stale entry
    assert t.heap_size == heap_bound(1) == 1 + MIN_STALE
    assert not t.compacting
    t.acquire(timer(1, "live", 0.0))  # the 101st stale entry: a compaction starts...
    assert t.compacting
    assert t.heap_size == 2 + MIN_STALE  # ...but does no work in this call
    t.acquire(timer(2, "other", 1.0))  # 1 worker + 1 entry + the swap: within one step
    assert not t.compacting
    assert t.heap_size == 2
    assert [x.scope_id for x in t.pop_expired(1.0)] == ["live", "other"]

    t = TimerTable()
    for i in range(400):
        t.acquire(timer(1, f"s{i}", float(i)))
    for i in range(200):
        t.release(1, f"s{i}")
    assert (len(t), t.heap_size) == (200, heap_bound(200))  # stale == live: not yet
    assert not t.compacting
    t.release(1, "s200")
    assert t.compacting
    calls = 0
    while t.compacting:  # 1 worker + 199 entries + the swap, 16 units per call
        calls += 1
        t.release(1, f"s{400 - calls}")
    assert calls == math.ceil((1 + 199 + 1) / REBUILD_STEP)
    assert len(t) == 199 - calls
    # Scanned into the new heap, then released: stale there, but few.
    assert len(t) < t.heap_size <= heap_bound(len(t))


def test_timer_acquired_during_compaction_lands_once_in_the_new_heap() -> None:
    t = TimerTable(min_stale=0, rebuild_step=4)
    for pid, scope in [(1, "a"), (2, "b"), (3, "c")]:
        t.acquire(timer(pid, scope, float(pid)))
    t.release(1, "a")
    t.release(2, "b")  # 2 stale of 3: compact; only worker 3 is left to scan
    assert t.compacting
    # Pushed into both heaps; then the scan of worker 3 must skip it (it is newer).
    t.acquire(timer(3, "d", 0.5))
    assert not t.compacting
    assert (t.heap_size, len(t)) == (2, 2)
    assert [x.scope_id for x in t.pop_expired(9.0)] == ["d", "c"]


def test_rebuild_step_and_min_stale_are_validated() -> None:
    with pytest.raises(ValueError, match="rebuild_step"):
        TimerTable(rebuild_step=3)
    with pytest.raises(ValueError, match="min_stale"):
        TimerTable(min_stale=-1)


def test_compaction_is_spread_over_calls() -> None:
    """No call rebuilds a big heap at once; pops stay right while the rebuild runs."""
    t = TimerTable()
    for i in range(20_000):
        t.acquire(timer(1 + i % 50, f"s{i}", float(i)))
    for i in range(0, 20_000, 2):
        t.release(1 + i % 50, f"s{i}")
    t.release(2, "s1")  # stale now over half the heap
    assert t.compacting
    calls = 0
    while t.compacting:
        calls += 1
        t.acquire(timer(999, f"n{calls}", 0.5 + calls))  # pushed into both heaps
        if calls % 100 == 0:  # expire some of the old and some of the new timers
            before = len(t)
            expired = t.pop_expired(calls / 2)
            assert [x.deadline for x in expired] == sorted(x.deadline for x in expired)
            assert len(t) == before - len(expired)
    # At most 50 workers + 9,999 live entries + the swap, plus the entries acquired
    # meanwhile; fewer when expired before their worker is scanned.
    assert 100 < calls <= (50 + 9_999 + 1 + calls) / REBUILD_STEP + 1
    assert t.heap_size <= heap_bound(len(t))
    remaining = t.pop_expired(math.inf)
    assert len(remaining) == len(t) + len(remaining)  # everything left is poppable
    assert [x.deadline for x in remaining] == sorted(x.deadline for x in remaining)
    assert len(t) == 0


def test_expiring_the_live_front_compacts_a_stale_tail() -> None:
    """pop_expired must not leave a heap of stale entries behind (regression)."""
    t = TimerTable()
    for i in range(1000):
        t.acquire(timer(1, f"soon{i}", float(i)))
        t.acquire(timer(2, f"late{i}", 1e6 + i))
    t.drop_worker(2)  # 1000 stale entries at the back, not yet over half the heap
    assert t.heap_size == 2000
    assert not t.compacting
    assert len(t.pop_expired(1e5)) == 1000
    assert len(t) == 0
    assert t.compacting
    t.acquire(timer(3, "next", 1.0))  # no worker left to scan: the swap
    assert t.heap_size == 1


def test_budgeted_pops_and_peeks_bound_the_work_and_lose_nothing() -> None:
    t = TimerTable()
    for i in range(1000):
        t.acquire(Timer(pid=1, scope_id=f"s{i}", deadline=1.0, signal=9))
        t.acquire(Timer(pid=2, scope_id=f"s{i}", deadline=2.0, signal=9))
    t.acquire(Timer(pid=3, scope_id="other", deadline=2.5, signal=9))
    assert t.drop_worker(2, sample=3) == (1000, ["s0", "s1", "s2"])
    assert t.worker_size(1) == 1000 and t.worker_size(2) == 0
    slices = []
    while (batch := t.pop_expired(3.0, budget=64)) or (t.next_deadline(budget=64) or 9) <= 3.0:
        assert len(batch) <= 64
        slices.append(batch)
    popped = [x for batch in slices for x in batch]
    assert [x.scope_id for x in popped] == [f"s{i}" for i in range(1000)] + ["other"]
    # 1,000 live pops took at least 16 slices; the 1,000 stale entries never one big pop.
    assert len(slices) >= 1000 // 64
    assert t.next_deadline(budget=1) is None and len(t) == 0


def test_a_budgeted_peek_is_never_later_than_the_live_deadline() -> None:
    t = TimerTable()
    for i in range(100):
        t.acquire(Timer(pid=1, scope_id=f"s{i}", deadline=1.0, signal=9))
    t.acquire(Timer(pid=2, scope_id="live", deadline=5.0, signal=9))
    t.drop_worker(1)
    assert t.next_deadline(budget=10) == 1.0  # a stale one: early, never late
    assert t.next_deadline() == 5.0


def test_dropping_workers_with_many_timers_compacts() -> None:
    t = TimerTable()
    for i in range(5000):
        t.acquire(timer(1 + i % 2, f"s{i}", float(i)))
    t.drop_worker(1)
    assert len(t) == 2500
    assert t.heap_size <= heap_bound(2500)
    t.drop_worker(2)
    assert t.compacting
    assert t.next_deadline() is None  # the stale entries are skipped meanwhile
    t.acquire(timer(3, "x", 1.0))
    assert t.heap_size == 1


# -- the model-based state machine ----------------------------------------------------


@dataclass
class ModelTimer:
    timer: Timer
    seq: int


PIDS = st.integers(1, 4)
SCOPES = st.sampled_from(["a", "b", "c", "d", "e"])
# Small integral offsets make equal deadlines (ties) common.
OFFSETS = st.integers(-2, 12).map(float)


class TableMachine(RuleBasedStateMachine):
    """TimerTable against a dict ``key -> (timer, acquisition seq)``.

    The table is built with small compaction tunables (or the defaults), so that
    compactions start often and run across many steps, interleaved with every operation.
    """

    def __init__(self) -> None:
        super().__init__()
        self.table = TimerTable()
        self.min_stale, self.step = MIN_STALE, REBUILD_STEP
        self.model: dict[tuple[int, str], ModelTimer] = {}
        self.seq = 0
        self.now = 0.0
        self.peak = 0  # the largest live count since the table was last seen not compacting

    @initialize(
        tunables=st.one_of(
            st.just((MIN_STALE, REBUILD_STEP)),
            st.tuples(st.integers(0, 6), st.integers(4, 6)),
        )
    )
    def build(self, tunables: tuple[int, int]) -> None:
        self.min_stale, self.step = tunables
        self.table = TimerTable(min_stale=self.min_stale, rebuild_step=self.step)

    def _model_acquire(self, t: Timer) -> Timer | None:
        old = self.model.get(t.key)
        self.seq += 1
        self.model[t.key] = ModelTimer(t, self.seq)
        return None if old is None else old.timer

    def _in_expiry_order(self, items: list[ModelTimer]) -> list[Timer]:
        return [m.timer for m in sorted(items, key=lambda m: (m.timer.deadline, m.seq))]

    @rule(pid=PIDS, scope=SCOPES, offset=OFFSETS, signal=st.integers(-1, 15))
    def acquire(self, pid: int, scope: str, offset: float, signal: int) -> None:
        t = Timer(pid, scope, self.now + offset, signal, acquired_at=self.now)
        expected = self._model_acquire(t)
        assert self.table.acquire(t) == expected

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data(), offset=OFFSETS)
    def replace_live(self, data: st.DataObject, offset: float) -> None:
        key = data.draw(st.sampled_from(sorted(self.model)))
        t = Timer(key[0], key[1], self.now + offset, 9)
        expected = self._model_acquire(t)
        assert expected is not None
        assert self.table.acquire(t) == expected

    @rule(pid=PIDS, count=st.integers(50, 160), offset=OFFSETS)
    def acquire_many(self, pid: int, count: int, offset: float) -> None:
        """Enough timers (and, on repeat, replacements) to cross the compaction threshold."""
        for i in range(count):
            t = Timer(pid, f"bulk{i}", self.now + offset + i % 7, 9)
            assert self.table.acquire(t) == self._model_acquire(t)

    @rule(pid=PIDS, scope=SCOPES)
    def release(self, pid: int, scope: str) -> None:
        old = self.model.pop((pid, scope), None)
        assert self.table.release(pid, scope) == (None if old is None else old.timer)

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def release_live(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.model)))
        assert self.table.release(*key) == self.model.pop(key).timer

    @rule(pid=PIDS, sample=st.integers(0, 3))
    def drop_worker(self, pid: int, sample: int) -> None:
        removed = {key[1] for key in self.model if key[0] == pid}
        for scope in removed:
            del self.model[pid, scope]
        count, scopes = self.table.drop_worker(pid, sample=sample)
        assert count == len(removed)
        assert len(scopes) == min(sample, count) and set(scopes) <= removed

    @rule(step=st.sampled_from([0.0, 0.5, 1.0, 3.0, 20.0]))
    def advance_and_pop_expired(self, step: float) -> None:
        self.now += step
        due = [m for m in self.model.values() if m.timer.deadline <= self.now]
        for m in due:
            del self.model[m.timer.key]
        peeked = self.table.due_pids(self.now, limit=10_000)
        assert peeked == {m.timer.pid for m in due}
        assert self.table.pop_expired(self.now) == self._in_expiry_order(due)

    @rule(step=st.sampled_from([0.0, 1.0, 3.0]), budget=st.integers(1, 40))
    def peek_then_pop_a_budgeted_slice(self, step: float, budget: int) -> None:
        """A bounded peek answers for at least the workers of the slice the same pop
        takes, or says that more entries than its limit are due."""
        self.now += step
        live_due = {m.timer.pid for m in self.model.values() if m.timer.deadline <= self.now}
        size = self.table.heap_size
        peeked = self.table.due_pids(self.now, limit=budget)
        popped = self.table.pop_expired(self.now, budget=budget)
        for t in popped:
            del self.model[t.key]
        if peeked is None:
            assert size > budget  # the heap held more entries than the limit
        else:
            assert peeked == live_due

    @rule()
    def next_deadline(self) -> None:
        expected = min((m.timer.deadline for m in self.model.values()), default=None)
        assert self.table.next_deadline() == expected

    @rule(pid=PIDS, scope=SCOPES)
    def get(self, pid: int, scope: str) -> None:
        m = self.model.get((pid, scope))
        assert self.table.get(pid, scope) == (None if m is None else m.timer)
        assert ((pid, scope) in self.table) == (m is not None)

    @invariant()
    def agrees_with_model(self) -> None:
        assert len(self.table) == len(self.model)
        assert set(self.table.workers()) == {pid for pid, _ in self.model}
        for pid in (*self.table.workers(), -1):
            assert set(self.table.live_scopes(pid)) == {s for p, s in self.model if p == pid}
        assert self.table.snapshot() == tuple(self._in_expiry_order(list(self.model.values())))

    @invariant()
    def next_deadline_is_the_earliest_live(self) -> None:
        expected = min((m.timer.deadline for m in self.model.values()), default=None)
        assert self.table.next_deadline() == expected

    @invariant()
    def heap_stays_bounded(self) -> None:
        """The two bounds derived in ``_table``'s docstring. Within one rule the live
        count only moves one way, so its peak is at a rule boundary, where it is seen."""
        live, size = len(self.model), self.table.heap_size
        assert live <= size
        if self.table.compacting:
            self.peak = max(self.peak, live)
            assert size <= compacting_bound(self.peak, self.min_stale, self.step)
        else:
            self.peak = live
            assert size <= heap_bound(live, self.min_stale)


TableMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
test_table_agrees_with_model = TableMachine.TestCase


def test_due_pids_walks_only_the_due_part_of_the_heap() -> None:
    t = TimerTable()
    for i in range(10_000):
        t.acquire(timer(1000 + i, "s", 100.0 + i))
    t.acquire(timer(1, "a", 1.0))
    t.acquire(timer(2, "b", 2.0))
    t.acquire(timer(3, "c", 2.0))
    t.release(3, "c")  # stale: walked (it may hide due children) but not named
    assert t.due_pids(0.5, limit=2) == set()
    assert t.due_pids(2.0, limit=3) == {1, 2}  # 3 entries due: 2 live, 1 stale
    assert t.due_pids(2.0, limit=2) is None  # more due than the limit
    assert len(t) == 10_002  # nothing removed
    assert [x.pid for x in t.pop_expired(2.0)] == [1, 2]
