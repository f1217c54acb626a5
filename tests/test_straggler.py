"""The straggler detector (aiotimer.core._straggler): simulated ranks, plain and coupled."""

from __future__ import annotations

import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiotimer.core._straggler import StragglerChange, StragglerDetector, Timing, compare_ranks

Block = tuple[float, int, float]  # (end, rank, start)


def plain(
    nranks: int, steps: int, slow: dict[int, float], sigma: float, seed: int, *, base: float = 0.04
) -> list[Block]:
    """Ranks that do not wait for each other: rank r's blocks last ``base * slow[r]``
    with lognormal jitter, a short gap between them; each runs for as long as a rank
    at ``base`` takes for ``steps`` blocks."""
    rng = random.Random(seed)
    out: list[Block] = []
    for rank in range(nranks):
        t = rng.random() * base
        while t < steps * base:
            d = base * slow.get(rank, 1.0) * rng.lognormvariate(0, sigma)
            out.append((t + d, rank, t))
            t += d + 0.0002 * rng.lognormvariate(0, sigma)
    out.sort()
    return out


def coupled(
    nranks: int, steps: int, extra: dict[int, float], sigma: float, seed: int
) -> list[Block]:
    """Ranks in a collective: each computes ~30 ms outside the scope (``extra[r]`` more),
    then the scope (the collective) ends for all when the last one has entered it."""
    rng = random.Random(seed)
    out: list[Block] = []
    t = 0.0
    for _ in range(steps):
        starts = [
            t + (0.03 + extra.get(r, 0.0)) * rng.lognormvariate(0, sigma) for r in range(nranks)
        ]
        end = max(starts) + 0.001 * rng.lognormvariate(0, sigma)
        out.extend((end + 1e-5 * r, r, s) for r, s in enumerate(starts))
        t = end + 1e-5 * nranks
    out.sort()
    return out


def feed(det: StragglerDetector, blocks: list[Block], site: str = "step") -> list[StragglerChange]:
    changes = []
    for end, rank, start in blocks:
        changes += det.block(rank, site, start, end)
    return changes


@settings(max_examples=25, deadline=None)
@given(
    nranks=st.integers(2, 8),
    sigma=st.floats(0.0, 0.2),
    seed=st.integers(0, 2**32),
    mode=st.sampled_from(["plain", "coupled"]),
)
def test_equal_ranks_with_jitter_are_never_flagged(
    nranks: int, sigma: float, seed: int, mode: str
) -> None:
    det = StragglerDetector()
    blocks = (
        plain(nranks, 150, {}, sigma, seed)
        if mode == "plain"
        else coupled(nranks, 150, {}, sigma, seed)
    )
    assert feed(det, blocks) == []
    assert det.stragglers() == {}


@settings(max_examples=25, deadline=None)
@given(
    nranks=st.integers(2, 8),
    factor=st.floats(1.6, 4.0),
    sigma=st.floats(0.0, 0.2),
    seed=st.integers(0, 2**32),
    data=st.data(),
)
def test_a_rank_slowed_by_1_6x_is_flagged_within_the_window(
    nranks: int, factor: float, sigma: float, seed: int, data: st.DataObject
) -> None:
    slow = data.draw(st.integers(0, nranks - 1))
    det = StragglerDetector()
    # Flagged once its window is full and `confirm` evaluations (about one per
    # iteration) agree: by its window + confirm + 2 blocks (+1: a window of cycles).
    blocks = plain(nranks, int((det.window + 10) * factor), {slow: factor}, sigma, seed)
    changes, own, flagged_at = [], 0, None
    for end, rank, start in blocks:
        own += rank == slow
        new = det.block(rank, "step", start, end)
        if new and flagged_at is None:
            flagged_at = own
        changes += new
    assert flagged_at is not None and flagged_at <= det.window + 1 + 3 + 2
    assert [(c.rank, c.slow) for c in changes] == [(slow, True)]
    assert changes[0].ratio >= 1.3 and changes[0].basis == "cycle"
    assert set(det.stragglers()) == {slow}


@settings(max_examples=25, deadline=None)
@given(
    nranks=st.integers(2, 8),
    extra=st.floats(0.02, 0.1),
    sigma=st.floats(0.0, 0.2),
    seed=st.integers(0, 2**32),
    data=st.data(),
)
def test_a_rank_slow_outside_its_collective_is_named_not_its_waiting_peers(
    nranks: int, extra: float, sigma: float, seed: int, data: st.DataObject
) -> None:
    slow = data.draw(st.integers(0, nranks - 1))
    det = StragglerDetector()
    changes = feed(det, coupled(nranks, det.window + 6, {slow: extra}, sigma, seed))
    assert [(c.rank, c.slow, c.basis) for c in changes] == [(slow, True, "own")]


@settings(max_examples=15, deadline=None)
@given(nranks=st.integers(2, 6), sigma=st.floats(0.0, 0.2), seed=st.integers(0, 2**32))
def test_recovery_clears_the_flag(nranks: int, sigma: float, seed: int) -> None:
    det = StragglerDetector()
    slow_part = plain(nranks, 60, {1: 2.0}, sigma, seed)
    assert [(c.rank, c.slow) for c in feed(det, slow_part)] == [(1, True)]
    # Then every rank runs at the same speed again, each after its own last block.
    last = {rank: end for end, rank, _ in slow_part}
    rng = random.Random(seed)
    recovered: list[Block] = []
    for rank in range(nranks):
        t = last[rank] + 0.0002
        for _ in range(80):
            d = 0.04 * rng.lognormvariate(0, sigma)
            recovered.append((t + d, rank, t))
            t += d + 0.0002
    recovered.sort()
    assert [(c.rank, c.slow) for c in feed(det, recovered)] == [(1, False)]
    assert det.stragglers() == {}


def test_forget_clears_a_straggler_and_ratios_say_how_slow() -> None:
    det = StragglerDetector()
    feed(det, plain(4, 40, {2: 1.6}, 0.0, 1))
    ratios = det.ratios()
    assert ratios[2] == pytest.approx(1.6, rel=0.02)
    assert ratios[0] == pytest.approx(1.0, rel=0.02)
    assert list(det.stragglers()) == [2]
    (change,) = det.forget(2)
    assert (change.rank, change.slow, change.site) == (2, False, "step")
    assert det.stragglers() == {}


def test_tiny_differences_are_not_slowness() -> None:
    """Gaps of 20 vs 60 microseconds around instant blocks: a large ratio, no excess."""
    det = StragglerDetector()
    blocks: list[Block] = []
    for rank in range(3):
        t = 0.0
        for _ in range(60):
            blocks.append((t + 1e-5, rank, t))
            t += 1e-5 + (6e-5 if rank == 0 else 2e-5)
    blocks.sort()
    assert feed(det, blocks) == []


def test_a_stale_rank_is_left_out() -> None:
    det = StragglerDetector(stale_after=1.0)
    blocks = plain(3, 30, {}, 0.0, 3)
    feed(det, blocks)
    # Rank 0 stops; ranks 1 and 2 go on for 5 s, rank 2 at half speed: with rank 0
    # left out, rank 2 is compared with rank 1 alone.
    later = [b for b in plain(3, 150, {2: 2.0}, 0.0, 4) if b[1] != 0]
    start = max(b[0] for b in blocks)
    assert [
        (c.rank, c.slow) for c in feed(det, [(e + start, r, s + start) for e, r, s in later])
    ] == [(2, True)]
    assert set(det.ratios()) == {0, 1, 2}


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="recover"):
        StragglerDetector(threshold=1.2, recover=1.3)
    with pytest.raises(ValueError, match="window"):
        StragglerDetector(window=2)
    with pytest.raises(ValueError, match="threshold"):
        StragglerDetector(threshold=1.0)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.001, 1.0), st.floats(0.0, 0.1), st.floats(0.0, 1.0)),
        min_size=2,
        max_size=12,
    )
)
def test_compare_ranks_is_each_rank_against_the_median_of_the_others(
    rows: list[tuple[float, float, float]],
) -> None:
    """Against a naive model: the peers' medians taken by leaving the rank out."""
    timings = {i: Timing(*row) for i, row in enumerate(rows)}
    floor = min(t.duration for t in timings.values())
    got = compare_ranks(timings)
    for i, t in timings.items():
        peers = [p for j, p in timings.items() if j != i]
        cycle = t.cycle / statistics.median(p.cycle for p in peers)
        peer_own = statistics.median(p.gap + floor for p in peers)
        own = (t.gap + floor) / peer_own if peer_own > 0 else got[i][0]
        assert got[i][0] == pytest.approx(min(max(cycle, own), 1000.0), rel=1e-9)
