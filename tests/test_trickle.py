"""The read interval of a trickle (aiotimer.sources._trickle): pure rules."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aiotimer.sources._trickle as trickle
from aiotimer.sources._trickle import (
    BELL_INTERVAL,
    LEAD_SHARE,
    LEAD_WINDOW,
    MIN_INTERVAL,
    READ_INTERVAL,
    Leads,
    bell_lead,
    next_interval,
    paced,
    shortest_lead,
    trickle_interval,
)
from aiotimer.wire import Request
from tests._pids import fake_pid


def _acquire(scope: str, expires_in: float, *, mono: bool = False) -> Request:
    return Request(
        pid=fake_pid(1),
        scope_id=scope,
        expiration_time=time.time() + expires_in,
        signal=9,
        mono=time.monotonic() + expires_in if mono else None,
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
    lead, mute = shortest_lead(requests)
    assert 1.5 < lead <= 2.0 and mute
    assert shortest_lead([_release("a"), _acquire("late", -1.0)]) == (math.inf, False)


class _FixedTime:
    """Stands in for the ``time`` module in aiotimer.sources._trickle: fixed readings."""

    def __init__(self, mono: float, wall: float) -> None:
        self._mono, self._wall = mono, wall

    def monotonic(self) -> float:
        return self._mono

    def time(self) -> float:
        return self._wall


def _naive_shortest_lead(
    requests: list[Request], since: float, mono: float, wall: float
) -> tuple[float, bool]:
    """shortest_lead as its docs say it, request by request."""
    lead, mute = math.inf, False
    for req in requests:
        if not req.is_release:
            deadline = req.deadline(mono, wall)
            if deadline > mono:
                if req.mono is None:
                    mute = True
                    lead = min(lead, deadline - mono)
                else:
                    lead = min(lead, deadline - min(since, mono))
    return lead, mute


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(
        st.tuples(
            st.sampled_from(["release", "mute", "rings"]),
            st.floats(-10.0, 100.0),  # seconds from now to the deadline
        ),
        max_size=20,
    ),
    since=st.floats(-5.0, 5.0) | st.just(math.inf),  # the last read, seconds from now
)
def test_shortest_lead_agrees_with_the_request_by_request_rule(
    lines: list[tuple[str, float]], since: float
) -> None:
    mono, wall = 1000.0, 1.7e9
    requests = [
        Request(fake_pid(1), f"s{i}", -1, 0)
        if kind == "release"
        else Request(
            fake_pid(1),
            f"s{i}",
            wall + after,
            9,
            mono=mono + after if kind == "rings" else None,
        )
        for i, (kind, after) in enumerate(lines)
    ]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trickle, "time", _FixedTime(mono, wall))
        lead, mute = shortest_lead(requests, mono + since)
    want_lead, want_mute = _naive_shortest_lead(requests, mono + since, mono, wall)
    assert mute == want_mute
    assert lead == pytest.approx(want_lead, abs=1e-6)


def test_an_acquire_without_the_mono_key_is_from_a_client_that_does_not_ring() -> None:
    lead, mute = shortest_lead([_acquire("a", 30.0, mono=True), _release("a")])
    assert 29.0 < lead <= 30.0 and not mute
    assert shortest_lead([_acquire("a", 30.0, mono=True), _acquire("b", 60.0)])[1]
    assert not shortest_lead([_acquire("a", 30.0, mono=True), _acquire("late", -1.0)])[1]


def test_leads_are_remembered_for_one_to_two_windows() -> None:
    leads = Leads()
    assert leads.shortest(0.0) == math.inf
    leads.note(0.3, 0.0)
    leads.note(2.0, 0.5)
    assert leads.shortest(1.0) == 0.3
    assert leads.shortest(LEAD_WINDOW + 1.0) == 0.3  # the previous window's
    leads.note(0.5, LEAD_WINDOW + 2.0)
    assert leads.shortest(2 * LEAD_WINDOW + 1.0) == 0.5  # 0.3 has aged out
    assert leads.shortest(5 * LEAD_WINDOW) == math.inf  # nothing read for a window


def test_a_ringing_client_s_lead_is_counted_from_the_last_read() -> None:
    # Written since the last read, 2 s ago: at most 32 s of lead for a client that rings
    # (so the wait in the pipe does not shorten the intervals read after read), at
    # least 30 s for one that does not.
    since = time.monotonic() - 2.0
    lead, mute = shortest_lead([_acquire("a", 30.0, mono=True)], since)
    assert 31.5 < lead <= 32.1 and not mute
    lead, mute = shortest_lead([_acquire("a", 30.0)], since)
    assert 29.5 < lead <= 30.0 and mute
    lead, _ = shortest_lead([_acquire("a", 30.0, mono=True), _acquire("b", 31.0)], since)
    assert 30.5 < lead <= 31.0


def test_a_mute_lead_is_remembered_like_the_others() -> None:
    leads = Leads()
    leads.note(60.0, 0.0, mute=True)
    assert leads.mute(1.0)
    leads.note(60.0, LEAD_WINDOW + 2.0)
    assert leads.mute(LEAD_WINDOW + 3.0)  # the previous window's
    assert not leads.mute(2 * LEAD_WINDOW + 3.0)


def test_a_lead_noted_after_a_long_silence_is_not_lost() -> None:
    leads = Leads()
    leads.note(60.0, 0.0)
    leads.note(0.4, 10 * LEAD_WINDOW)  # nothing asked in between
    assert leads.shortest(10 * LEAD_WINDOW + 1.0) == 0.4


@settings(max_examples=200, deadline=None)
@given(
    notes=st.lists(
        st.tuples(
            st.floats(0.0, 1000.0),  # when, seconds after the previous note
            st.floats(0.001, 1e4),  # lead
            st.booleans(),  # mute
        ),
        max_size=12,
    ),
    later=st.floats(0.0, 4 * LEAD_WINDOW),
)
def test_leads_keep_every_note_for_a_window_against_a_naive_model(
    notes: list[tuple[float, float, bool]], later: float
) -> None:
    leads = Leads()
    now, seen = 0.0, []
    for gap, lead, mute in notes:
        now += gap
        leads.note(lead, now, mute=mute)
        seen.append((now, lead, mute))
    now += later
    shortest, mute = leads.shortest(now), leads.mute(now)
    # Everything noted within the last window is remembered; nothing older than three
    # (a window begins at the first look after the one before it ended).
    for when, lead, was_mute in seen:
        if now - when < LEAD_WINDOW:
            assert shortest <= lead
            assert mute or not was_mute
    recent = [(lead, m) for when, lead, m in seen if now - when < 3 * LEAD_WINDOW]
    assert shortest >= min((lead for lead, _ in recent), default=math.inf)
    assert not mute or any(m for _, m in recent)


@settings(max_examples=300, deadline=None)
@given(
    read_interval=st.floats(0.0, 5.0),
    bell_interval=st.floats(0.0, 30.0),
    lead=st.floats(0.0, 1e5) | st.just(math.inf),
    mute=st.booleans(),
)
def test_the_pacing_rule_respects_every_bound(
    read_interval: float, bell_interval: float, lead: float, mute: bool
) -> None:
    interval = next_interval(read_interval, bell_interval, lead, mute)
    assert interval == 0.0 or interval >= MIN_INTERVAL
    assert interval <= LEAD_SHARE * lead  # every lead known keeps 1 - LEAD_SHARE spare
    assert interval <= max(read_interval, bell_interval)
    if mute or read_interval == 0.0:  # a client that cannot ring: today's limit
        assert interval <= read_interval
    # Longer leads never make the server read more often.
    assert next_interval(read_interval, bell_interval, lead * 2, mute) >= interval
    # Clients that all ring never make the server read more often than a mute one.
    assert next_interval(read_interval, bell_interval, lead, False) >= interval


@settings(max_examples=300, deadline=None)
@given(
    read_interval=st.floats(0.001, 5.0),
    bell_interval=st.floats(0.0, 30.0),
    known=st.floats(0.0, 1e5) | st.just(math.inf),
    mute=st.booleans(),
    lead=st.floats(0.0, 1e5),
)
def test_an_acquire_that_need_not_ring_is_read_with_a_share_of_its_lead_to_spare(
    read_interval: float, bell_interval: float, known: float, mute: bool, lead: float
) -> None:
    # aiotimer's client rings below bell_lead of the longest interval; an acquire it
    # does not ring for waits at most one interval, whatever leads the server knows.
    if lead >= bell_lead(max(read_interval, bell_interval)):
        assert next_interval(read_interval, bell_interval, known, mute) <= LEAD_SHARE * lead


def test_a_training_loop_s_leads_are_read_every_bell_interval() -> None:
    assert next_interval(READ_INTERVAL, BELL_INTERVAL, 60.0, False) == BELL_INTERVAL
    assert next_interval(READ_INTERVAL, BELL_INTERVAL, 60.0, True) == READ_INTERVAL
    assert next_interval(READ_INTERVAL, BELL_INTERVAL, 0.5, False) == 0.5 * LEAD_SHARE
    assert next_interval(0.0, BELL_INTERVAL, 60.0, False) == 0.0


def test_reads_are_paced_to_leave_writers_room() -> None:
    # 64 KiB in 0.25 s fills 16 KiB of room in a quarter of that.
    assert paced(0.25, 65536, 16384) == 0.0625
    assert paced(0.25, 0, 16384) == math.inf
