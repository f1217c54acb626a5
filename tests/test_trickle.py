"""The read interval of a trickle (aiotimer.sources._trickle): pure rules."""

from __future__ import annotations

import math
import time

from aiotimer.sources._trickle import (
    LEAD_SHARE,
    LEAD_WINDOW,
    MIN_INTERVAL,
    READ_INTERVAL,
    Leads,
    paced,
    shortest_lead,
    trickle_interval,
)
from aiotimer.wire import Request
from tests._pids import fake_pid


def _acquire(scope: str, expires_in: float) -> Request:
    return Request(
        pid=fake_pid(1), scope_id=scope, expiration_time=time.time() + expires_in, signal=9
    )


def _release(scope: str) -> Request:
    return Request(pid=fake_pid(1), scope_id=scope, expiration_time=-1, signal=0)


def test_interval_is_capped_by_the_limit_and_the_lead() -> None:
    assert trickle_interval(READ_INTERVAL, math.inf) == READ_INTERVAL
    assert trickle_interval(READ_INTERVAL, 0.1) == 0.1 * LEAD_SHARE
    assert trickle_interval(0.01, 60.0) == 0.01


def test_a_lead_too_short_for_a_timer_means_reading_every_line() -> None:
    assert trickle_interval(READ_INTERVAL, MIN_INTERVAL / LEAD_SHARE / 2) == 0.0
    assert trickle_interval(0.0, math.inf) == 0.0


def test_shortest_lead_counts_acquires_not_yet_due() -> None:
    requests = [_acquire("a", 30.0), _release("a"), _acquire("b", 2.0), _acquire("late", -1.0)]
    assert 1.5 < shortest_lead(requests) <= 2.0
    assert shortest_lead([_release("a"), _acquire("late", -1.0)]) == math.inf


def test_leads_are_remembered_for_one_to_two_windows() -> None:
    leads = Leads()
    assert leads.shortest(0.0) == math.inf
    leads.note(0.3)
    leads.note(2.0)
    assert leads.shortest(1.0) == 0.3
    assert leads.shortest(LEAD_WINDOW + 1.0) == 0.3  # the previous window's
    leads.note(0.5)
    assert leads.shortest(2 * LEAD_WINDOW + 1.0) == 0.5  # 0.3 has aged out
    assert leads.shortest(5 * LEAD_WINDOW) == math.inf  # nothing read for a window


def test_reads_are_paced_to_leave_writers_room() -> None:
    # 64 KiB in 0.25 s fills 16 KiB of room in a quarter of that.
    assert paced(0.25, 65536, 16384) == 0.0625
    assert paced(0.25, 0, 16384) == math.inf
