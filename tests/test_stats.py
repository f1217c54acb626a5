"""Duration statistics (pure): the sketch against a naive sorted-list model."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiotimer.core._sketch import MIN_TRACKED, DurationSketch
from aiotimer.core._stats import (
    MIN_SUGGESTION,
    OTHER_SITE,
    SUGGESTION_SAMPLES,
    DurationStats,
    Overdue,
    nice_ceil,
    suggest_timeout,
)
from aiotimer.core._stats_format import format_seconds, format_summaries


def naive_quantile(samples: list[float], q: float) -> float:
    """The exact nearest-rank quantile: the ceil(q * n)-th smallest sample."""
    ordered = sorted(samples)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def within_bound(estimate: float, exact: float, relative_error: float) -> bool:
    # The documented bound, plus a few ulps for the float log/pow of the bucket edges.
    return abs(estimate - exact) <= relative_error * exact * (1 + 1e-9) + MIN_TRACKED


NICE = (1.0, 1.5, 2.0, 3.0, 5.0, 7.5)
durations = st.floats(min_value=0, max_value=1e6, allow_nan=False)
wide = st.one_of(durations, st.floats(min_value=0, max_value=1e-5))


@given(
    st.lists(wide, min_size=1, max_size=300),
    st.floats(min_value=0, max_value=1),
    st.sampled_from([0.001, 0.01, 0.05]),
)
def test_quantile_within_documented_bound(samples: list[float], q: float, alpha: float) -> None:
    sketch = DurationSketch(alpha)
    for x in samples:
        sketch.add(x)
    estimate = sketch.quantile(q)
    assert estimate is not None
    assert within_bound(estimate, naive_quantile(samples, q), alpha)
    assert sketch.count == len(samples)
    assert sketch.max == max(samples)
    assert sketch.quantile(1.0) == max(samples)
    assert sketch.quantile(0.0) == min(samples)


@given(st.lists(st.floats(min_value=1e-3, max_value=1e3), min_size=1, max_size=2000))
def test_memory_bounded_by_range_not_by_samples(samples: list[float]) -> None:
    sketch = DurationSketch(0.01)
    for x in samples:
        sketch.add(x)
    # log(1e6) / log(1.01 / 0.99) = 691 buckets cover [1 ms, 1000 s], whatever the count.
    assert sketch.buckets <= 692


def test_sketch_rejects_bad_input() -> None:
    sketch = DurationSketch()
    assert sketch.quantile(0.5) is None
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="finite number >= 0"):
            sketch.add(bad)
    with pytest.raises(ValueError, match=r"q must be in \[0, 1\]"):
        sketch.quantile(1.5)
    with pytest.raises(ValueError, match="relative_error"):
        DurationSketch(0.0)


@pytest.mark.parametrize(
    ("x", "nice"),
    [
        (0.001, 0.01 / 10),
        (0.42, 0.5),
        (1.0, 1.0),
        (1.01, 1.5),
        (2.5, 3.0),
        (3.1, 5.0),
        (6.0, 7.5),
        (8.0, 10.0),
        (999.0, 1000.0),
        (1234.0, 1500.0),
    ],
)
def test_nice_ceil(x: float, nice: float) -> None:
    assert nice_ceil(x) == nice


@given(st.floats(min_value=1e-9, max_value=1e12))
def test_nice_ceil_is_the_smallest_nice_number_above(x: float) -> None:
    nice = nice_ceil(x)
    exp = math.floor(math.log10(x))
    nice_numbers = sorted(m * 10.0**e for e in range(exp - 1, exp + 2) for m in NICE)
    assert any(math.isclose(nice, n) for n in nice_numbers)
    assert x <= nice
    below = [n for n in nice_numbers if n < nice and not math.isclose(n, nice)]
    assert max(below) < x * (1 + 1e-9)  # no smaller nice number is >= x


def test_nice_ceil_rejects_non_positive() -> None:
    with pytest.raises(ValueError, match="finite number > 0"):
        nice_ceil(0.0)


def test_suggest_timeout_rule() -> None:
    assert suggest_timeout(p99=2.0, maximum=2.2) == 3.0  # 1.5 * p99 = 3.0 dominates
    assert suggest_timeout(p99=1.0, maximum=4.0) == 5.0  # 1.2 * max = 4.8 -> 5
    assert suggest_timeout(p99=0.0, maximum=0.0) == MIN_SUGGESTION


def test_stats_group_default_scopes_by_site() -> None:
    stats = DurationStats()
    for n, d in enumerate([1.0, 2.0, 3.0, 4.0]):
        stats.record(f"load.py:12#{n}", d)
    stats.record("custom-scope", 0.5)
    stats.record("train.py#42", 0.25)  # torch's default scope: already a site
    stats.record_expired("load.py:12#99", elapsed=10.0)
    stats.record_expired("load.py:12#100", elapsed=12.0)
    assert len(stats) == 3
    load = stats.summary("load.py:12")
    assert load is not None
    assert load.count == 4
    assert load.max == 4.0
    assert load.p50 == pytest.approx(2.0, rel=0.01)
    assert load.p99 == 4.0
    assert load.expirations == 2
    assert load.longest_expired == 12.0
    assert load.suggested_timeout is None  # 4 durations: too few to suggest from
    for n in range(SUGGESTION_SAMPLES - 4):
        stats.record(f"load.py:12#{n + 10}", 4.0)
    load = stats.summary("load.py:12")
    assert load is not None
    assert load.suggested_timeout == 7.5  # max(1.5 * 4, 1.2 * 4) = 6 -> 7.5
    assert [s.site for s in stats.summaries()] == ["load.py:12", "custom-scope", "train.py#42"]
    assert stats.summary("nowhere") is None
    assert f"3 sites, {SUGGESTION_SAMPLES + 2} samples" in repr(stats)


def test_the_late_end_of_an_expired_block_is_its_real_duration() -> None:
    """Shadow mode: a block that expired at 1 s and ended at 5 s ran 5 s, which is what
    its site reports as its longest expired block, not the 1 s seen at the expiry."""
    stats = DurationStats()
    stats.record_expired("hang.py:3#1", elapsed=1.0)
    stats.record_late("hang.py:3#1", 5.0)
    summary = stats.summary("hang.py:3")
    assert summary is not None
    assert (summary.count, summary.max, summary.expirations, summary.longest_expired) == (
        1,
        5.0,
        1,
        5.0,
    )


def test_the_table_says_what_longest_and_suggested_mean() -> None:
    stats = DurationStats()
    for n in range(SUGGESTION_SAMPLES):
        stats.record(f"ok.py:1#{n}", 0.5)
    stats.record("few.py:1#1", 0.5)
    table = format_summaries(stats.summaries())
    rows = {line.split()[0]: line.split() for line in table.splitlines()[1:3]}
    assert rows["ok.py:1"][-1] == "750ms" and rows["few.py:1"][-1] == "-"
    assert f"from {SUGGESTION_SAMPLES} durations or more" in table


def test_durations_round_up_to_the_next_unit() -> None:
    assert format_seconds(0.9996) == "1s" and format_seconds(0.0009996) == "1ms"
    assert (format_seconds(0.999), format_seconds(12.34), format_seconds(None)) == (
        "999ms",
        "12.3s",
        "-",
    )


def test_site_with_only_expirations_has_no_suggestion() -> None:
    stats = DurationStats()
    stats.record_expired("hang.py:3#1", elapsed=30.0)
    summary = stats.summary("hang.py:3")
    assert summary is not None
    assert (summary.count, summary.p99, summary.max, summary.suggested_timeout) == (
        0,
        None,
        None,
        None,
    )
    with pytest.raises(ValueError, match="elapsed"):
        stats.record_expired("hang.py:3#2", elapsed=-1.0)


def test_sites_are_bounded() -> None:
    stats = DurationStats(max_sites=3)
    for n in range(10):
        stats.record(f"scope-{n}", 1.0)
    assert len(stats) == 4  # three sites + the pool
    pooled = stats.summary(OTHER_SITE)
    assert pooled is not None
    assert pooled.count == 7
    stats.record("scope-0", 2.0)  # a known site still gets its own samples
    assert stats.summary("scope-0").count == 2  # type: ignore[union-attr]


@given(st.lists(st.tuples(st.sampled_from(["a.py:1#", "b.py:2#", "c"]), durations), max_size=80))
def test_stats_match_a_naive_model_per_site(samples: list[tuple[str, float]]) -> None:
    stats = DurationStats()
    model: dict[str, list[float]] = {}
    for n, (prefix, d) in enumerate(samples):
        scope = prefix + str(n) if prefix.endswith("#") else prefix
        stats.record(scope, d)
        model.setdefault(prefix.rstrip("#"), []).append(d)
    assert {s.site for s in stats.summaries()} == set(model)
    for site, values in model.items():
        summary = stats.summary(site)
        assert summary is not None
        assert summary.count == len(values)
        assert summary.max == max(values)
        assert summary.p50 is not None
        assert summary.p99 is not None
        assert within_bound(summary.p50, naive_quantile(values, 0.5), 0.01)
        assert within_bound(summary.p99, naive_quantile(values, 0.99), 0.01)
        if len(values) < SUGGESTION_SAMPLES:
            assert summary.suggested_timeout is None
        else:
            assert summary.suggested_timeout is not None
            assert summary.suggested_timeout >= 1.2 * max(values)


def test_overdue_remembers_until_release_and_is_bounded() -> None:
    overdue = Overdue(capacity=2)
    overdue.add((1, "a"), 10.0)
    overdue.add((1, "b"), 11.0)
    overdue.add((2, "a"), 12.0)  # forgets the oldest, (1, "a")
    assert len(overdue) == 2
    assert (1, "a") not in overdue
    assert overdue.pop((1, "a")) is None
    assert overdue.pop((2, "a")) == 12.0
    assert overdue.pop((2, "a")) is None
    overdue.add((2, "c"), 13.0)
    assert overdue.clear_worker(1) == 1
    assert list(map(overdue.__contains__, [(1, "b"), (2, "c")])) == [False, True]
    with pytest.raises(ValueError, match="capacity"):
        Overdue(0)


@given(st.floats(0, 100), st.integers(0, 50))
def test_add_many_is_count_adds(duration: float, count: int) -> None:
    one, many = DurationSketch(), DurationSketch()
    for _ in range(count):
        one.add(duration)
    many.add_many(duration, count)
    assert (many.count, many.max, many.min) == (one.count, one.max, one.min)
    assert many.quantile(0.5) == one.quantile(0.5)


def test_record_many_and_the_scope_cache_keep_sites_apart() -> None:
    stats = DurationStats()
    for i in range(3 * 4096):  # past the scope id cache, which then starts over
        stats.record(f"a.py:{i % 2}#{i}", 1.0)
    stats.record_many({"a.py:0#99999": 10, "a.py:1#99998": 2}, 0.0)
    a0, a1 = stats.summary("a.py:0"), stats.summary("a.py:1")
    assert a0 is not None and a1 is not None
    assert (a0.count, a1.count) == (3 * 2048 + 10, 3 * 2048 + 2)


@given(
    before=st.lists(st.sampled_from(["a.py:1#1", "a.py:1#2", "b.py:2#1", "c"]), max_size=6),
    counts=st.dictionaries(
        st.sampled_from(["a.py:1#1", "a.py:1#3", "b.py:2#1", "c", "d.py:4#1"]),
        st.integers(1, 5),
    ),
    duration=st.sampled_from([0.0, 0.5]),
    max_sites=st.integers(1, 4),
)
def test_record_many_is_record_of_each_block(
    before: list[str], counts: dict[str, int], duration: float, max_sites: int
) -> None:
    """Summed per site or not, the same sites (the pool too) and samples."""
    many, one = DurationStats(max_sites=max_sites), DurationStats(max_sites=max_sites)
    for scope_id in before:
        many.record(scope_id, 1.0)
        one.record(scope_id, 1.0)
    many.record_many(counts, duration)
    for scope_id, count in counts.items():
        for _ in range(count):
            one.record(scope_id, duration)
    assert many.summaries() == one.summaries()
