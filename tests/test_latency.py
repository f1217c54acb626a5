"""The fixed-bucket latency histogram."""

from __future__ import annotations

import doctest

from hypothesis import given
from hypothesis import strategies as st

import aiotimer.core._latency
from aiotimer.core._latency import LATENCY_BUCKETS, LatencyHistogram


def test_doctests() -> None:
    assert doctest.testmod(aiotimer.core._latency).failed == 0


@given(st.lists(st.floats(-1, 100, allow_nan=False)))
def test_cumulative_counts_match_a_naive_count(samples: list[float]) -> None:
    h = LatencyHistogram()
    for x in samples:
        h.observe(x)
    clamped = [max(0.0, x) for x in samples]
    for bound, n in h.cumulative():
        assert n == sum(x <= bound for x in clamped)
    assert h.count == len(samples) and len(h.cumulative()) == len(LATENCY_BUCKETS) + 1
    assert h.max == max(clamped, default=0.0)
    assert abs(h.sum - sum(clamped)) < 1e-6 * max(1.0, sum(clamped))
