"""Who makes room in a full timer table (``server._quota``): pure, on a real table."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aiotimer.core._table import Timer, TimerTable
from aiotimer.server._quota import Quota

LEAKER = 7


def _table(sizes: dict[int, int]) -> TimerTable:
    table = TimerTable()
    for pid, n in sizes.items():
        for i in range(n):
            table.acquire(Timer(pid, f"{pid}-{i}", 100.0 + i, 9))
    return table


def test_a_full_table_evicts_the_largest_holders_oldest_timers_one_by_one() -> None:
    table = _table({LEAKER: 8, 2: 1, 3: 1})
    quota = Quota(table, max_timers=10, max_per_worker=100)
    evicted = []
    for n in range(3):
        admission = quota.admit(4)
        assert admission.refused is None and admission.evict is not None
        evicted.append(admission.evict)
        table.release(*admission.evict)
        table.acquire(Timer(4, f"new-{n}", 1.0, 9))
    assert evicted == [(LEAKER, f"{LEAKER}-{i}") for i in range(3)]


def test_the_largest_holder_itself_is_refused_and_so_is_a_tie() -> None:
    table = _table({LEAKER: 5, 2: 5})
    quota = Quota(table, max_timers=10, max_per_worker=100)
    assert "as many as any other worker" in (quota.admit(LEAKER).refused or "")
    assert quota.admit(2).refused is not None
    assert quota.admit(3).evict is not None  # a newcomer still gets room


def test_the_per_worker_cap_comes_first() -> None:
    quota = Quota(_table({LEAKER: 3}), max_timers=10, max_per_worker=3)
    assert "max_timers_per_worker=3" in (quota.admit(LEAKER).refused or "")
    assert quota.admit(2).refused is None and quota.admit(2).evict is None


@given(
    st.dictionaries(st.integers(1, 6), st.integers(0, 12), min_size=1),
    st.lists(st.integers(1, 8), max_size=40),
)
def test_a_worker_holding_two_fewer_than_another_is_never_refused_for_room(
    sizes: dict[int, int], acquirers: list[int]
) -> None:
    table = _table(sizes)
    limit = max(1, len(table))
    quota = Quota(table, max_timers=limit, max_per_worker=1000)
    for n, pid in enumerate(acquirers):
        most = max((table.worker_size(w) for w in table.workers()), default=0)
        admission = quota.admit(pid)
        if admission.refused is not None:
            assert len(table) >= limit and table.worker_size(pid) + 2 > most
            continue
        if admission.evict is not None:
            holder, scope_id = admission.evict
            assert table.worker_size(holder) >= table.worker_size(pid) + 2
            assert table.release(holder, scope_id) is not None
        table.acquire(Timer(pid, f"n{n}", 1.0, 9))
        assert len(table) <= limit
