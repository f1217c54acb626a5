"""Bounded views of the timer table: the earliest timers, a worker's scopes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from aiotimer.core._table import Timer, TimerTable

ops = st.lists(
    st.tuples(
        st.sampled_from(["acquire", "release", "pop"]),
        st.integers(1, 4),  # pid
        st.integers(0, 6),  # scope
        st.floats(0, 100, allow_nan=False),  # deadline / now
    ),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(ops, st.integers(0, 12))
def test_earliest_is_a_prefix_of_the_expiry_order(steps: list, n: int) -> None:
    table = TimerTable(min_stale=2, rebuild_step=4)
    for op, pid, scope, x in steps:
        if op == "acquire":
            table.acquire(Timer(pid, f"s{scope}", x, 9))
        elif op == "release":
            table.release(pid, f"s{scope}")
        else:
            table.pop_expired(x)
    got = table.earliest(n)
    want = list(table.snapshot())[:n]
    # Stale entries may crowd the top: never wrong, at most shorter than asked.
    assert got == want[: len(got)]
    assert len(got) == min(n, len(table)) or table.heap_size > 4 * n + 64


def test_earliest_visits_a_bounded_part_of_a_big_heap() -> None:
    table = TimerTable()
    for i in range(10_000):
        table.acquire(Timer(1 + i % 100, f"s{i}", float(i), 9))
    assert [t.deadline for t in table.earliest(3)] == [0.0, 1.0, 2.0]
    assert table.earliest(0) == []


def test_worker_scopes_are_cut_with_an_exact_count() -> None:
    table = TimerTable()
    for i in range(20):
        table.acquire(Timer(7, f"s{i}", float(i), 9))
    scopes, total = table.worker_scopes(7, 5)
    assert len(scopes) == 5 and total == 20 and set(scopes) <= {f"s{i}" for i in range(20)}
    assert table.worker_scopes(8, 5) == ([], 0)
