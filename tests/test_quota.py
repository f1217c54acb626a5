"""Who makes room in a full timer table (``server._quota``): pure, on a real table,
against a naive model that recounts everything at every step."""

from __future__ import annotations

import math
from collections.abc import Mapping
from itertools import count

from hypothesis import given, settings
from hypothesis import strategies as st

from aiotimer.core._table import Timer, TimerTable
from aiotimer.server._quota import Admission, Quota

ROOT, NOBODY = 0, 65534
VICTIM, LEAKER = 7, 8
_seq = count()


def _add(table: TimerTable, quota: Quota, pid: int, scope: str | None = None) -> None:
    """Add a new timer of ``pid``, counted as the caller of a Quota counts them."""
    scope = scope if scope is not None else f"{pid}-new-{next(_seq)}"
    if table.acquire(Timer(pid, scope, 100.0, 9)) is None:
        quota.added += 1


def _setup(
    holdings: Mapping[int, tuple[int | None, int]], max_timers: int, max_per_worker: int = 1000
) -> tuple[TimerTable, Quota]:
    """A table whose workers (pid -> (uid, timers)) hold their timers, oldest first."""
    table = TimerTable()
    quota = Quota(table, max_timers=max_timers, max_per_worker=max_per_worker)
    for pid, (uid, n) in holdings.items():
        quota.own(pid, uid)
        for i in range(n):
            _add(table, quota, pid, f"{pid}-{i}")
    return table, quota


def _carry_out(table: TimerTable, quota: Quota, pid: int, admission: Admission) -> None:
    if admission.evict is not None:
        assert table.release(*admission.evict) is not None
    _add(table, quota, pid)


def test_another_users_flood_neither_refuses_nor_evicts_a_users_blocks() -> None:
    """The shapes found: 4 blocks each for many processes of another user against a
    victim with 3, then 3 blocks each; the victim's next block always gets room, and
    its oldest (hung) block is never the one that makes room."""
    attackers = {100 + i: (NOBODY, 4) for i in range(49)}
    table, quota = _setup({VICTIM: (ROOT, 3), **attackers, 999: (NOBODY, 1)}, max_timers=200)
    admission = quota.admit(VICTIM)
    assert admission.refused is None and admission.evict is not None
    assert admission.evict[0] != VICTIM
    _carry_out(table, quota, VICTIM, admission)
    for pid in range(300, 370):  # more of them, 3 blocks each: refused, or among them
        quota.own(pid, NOBODY)
        for _ in range(3):
            admission = quota.admit(pid)
            if admission.refused is None:
                assert admission.evict is not None and admission.evict[0] != VICTIM
                _carry_out(table, quota, pid, admission)
    assert table.get(VICTIM, f"{VICTIM}-0") is not None
    assert table.worker_size(VICTIM) == 4


def test_a_full_table_evicts_the_largest_holders_oldest_timers_one_by_one() -> None:
    table, quota = _setup({LEAKER: (ROOT, 8), 2: (ROOT, 1), 3: (ROOT, 1)}, max_timers=10)
    quota.own(4, ROOT)
    evicted = []
    for _ in range(3):
        admission = quota.admit(4)
        assert admission.refused is None and admission.evict is not None
        evicted.append(admission.evict)
        _carry_out(table, quota, 4, admission)
    assert evicted == [(LEAKER, f"{LEAKER}-{i}") for i in range(3)]


def test_the_refusal_says_what_is_true_of_the_user_and_of_the_worker() -> None:
    holdings = {LEAKER: (ROOT, 4), 2: (ROOT, 3), 3: (NOBODY, 4), 4: (NOBODY, 2)}
    _table, quota = _setup(holdings, max_timers=13)
    refused = quota.admit(3).refused or ""  # root holds 7, not 8: room only inside
    assert "uid 65534 holds 6 of them and no other user holds 8 or more (the most: 7" in refused
    assert "worker 3 holds 4 and no worker of uid 65534 holds 6 or more (the most: 4)" in refused
    assert quota.admit(4).evict == (3, "3-0")  # its own user's largest worker makes room
    refused = quota.admit(LEAKER).refused or ""
    assert "uid 0 holds 7 of them and no other user holds 9 or more (the most: 6" in refused
    assert quota.admit(2).refused is not None  # 3 against 4: a tie, give or take one


def test_the_per_worker_cap_comes_first() -> None:
    _table, quota = _setup({LEAKER: (ROOT, 3)}, max_timers=10, max_per_worker=3)
    assert "max_timers_per_worker=3" in (quota.admit(LEAKER).refused or "")
    assert quota.admit(2) == Admission()


def test_the_tally_follows_changes_made_outside_the_admissions() -> None:
    table, quota = _setup({1: (ROOT, 5), 2: (NOBODY, 5)}, max_timers=10)
    assert quota.admit(1).refused is not None
    for i in range(3):  # root's worker releases three, nobody's takes their place
        table.release(1, f"1-{i}")
        _add(table, quota, 2)
    admission = quota.admit(1)  # root: 2, nobody: 8
    assert admission.evict is not None and admission.evict[0] == 2


def _model(
    table: TimerTable, owners: dict[int, int | None], pid: int, max_timers: int, cap: int
) -> tuple[bool, set[int]]:
    """Refused?, and the workers one of which must make room (empty: none needed)."""
    own = table.worker_size(pid)
    if own >= cap:
        return True, set()
    if len(table) < max_timers:
        return False, set()
    totals: dict[int | None, int] = {}
    for worker in table.workers():
        totals[owners.get(worker)] = totals.get(owners.get(worker), 0) + table.worker_size(worker)
    uid = owners.get(pid)
    mine = totals.get(uid, 0)
    others = {u: t for u, t in totals.items() if u != uid}
    if others and max(others.values()) >= mine + 2:
        users = {u for u, t in others.items() if t == max(others.values())}
    else:
        users = {uid}
    donors: set[int] = set()  # each user's largest workers
    for user in users:
        workers = [w for w in table.workers() if owners.get(w) == user]
        top = max((table.worker_size(w) for w in workers), default=0)
        if user == uid and top < own + 2:
            return True, set()
        donors |= {w for w in workers if table.worker_size(w) == top}
    return False, donors


_PIDS = st.integers(1, 9)
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), _PIDS),
        st.tuples(st.just("release"), _PIDS),
        st.tuples(st.just("exit"), _PIDS),
    ),
    max_size=80,
)


@settings(max_examples=300)
@given(
    st.dictionaries(_PIDS, st.sampled_from([0, 1, 2, None]), min_size=1),
    st.integers(1, 12),
    st.integers(1, 6),
    _OPS,
)
def test_admissions_match_a_naive_model_that_recounts_everything(
    owners: dict[int, int | None], max_timers: int, cap: int, ops: list[tuple[str, int]]
) -> None:
    table = TimerTable()
    quota = Quota(table, max_timers=max_timers, max_per_worker=cap)
    for pid, uid in owners.items():
        quota.own(pid, uid)
    users = set(owners.values())
    for op, pid in ops:
        if op == "release" and table.worker_size(pid):
            table.release(pid, next(iter(table.live_scopes(pid))))
            continue
        if op == "exit":
            table.drop_worker(pid)
            quota.disown(pid)
            owners.pop(pid, None)
            continue
        if op != "acquire":
            continue
        if pid not in owners:  # a new worker (or a pid reused): pinned, then owned
            owners[pid] = quota_uid = (pid % 3) or None
            quota.own(pid, quota_uid)
            users.add(quota_uid)
        refused, donors = _model(table, owners, pid, max_timers, cap)
        before = {
            u: sum(table.worker_size(w) for w in table.workers() if owners.get(w) == u)
            for u in users
        }
        admission = quota.admit(pid)
        assert (admission.refused is not None) == refused, admission
        if refused:
            continue
        if donors:
            assert admission.evict is not None
            donor, scope_id = admission.evict
            assert donor in donors
            assert scope_id == next(iter(table.live_scopes(donor)))  # its oldest
            giver = owners.get(donor)
            if giver != owners.get(pid):  # never below an equal share, by another user
                held = sum(1 for t in before.values() if t)
                assert before[giver] - 1 >= math.ceil(max_timers / held) - 1
        else:
            assert admission.evict is None
        _carry_out(table, quota, pid, admission)
        assert len(table) <= max_timers
