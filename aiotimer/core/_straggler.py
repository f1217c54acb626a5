"""Naming the straggler: a rank slower than its peers, per scope. Pure: no I/O, no clock.

How this works
--------------
Each finished block of a rank is fed as ``(rank, site, start, end)``, times on one
monotonic clock (the worker's, as its client sends them; see docs/stragglers.md). Per
site and rank, the detector keeps the last ``window`` values of three series:

* the *cycle*: from the start of the rank's previous block of the site to the start of
  this one (the rank's whole iteration, inside the scope and out);
* the *gap*: from the end of its previous block to the start of this one (the rank's
  own time outside the scope);
* the *duration* of the block.

A rank is judged only once its window is full, against the other ranks of the site
whose windows are full (its *peers*, at least one), by two ratios of medians:

* ``cycle``: its median cycle over the median of its peers' median cycles. Ranks that
  do not wait for each other (no collective) differ here: a rank 1.6x slower has a
  cycle 1.6x longer.
* ``own``: ``(median gap + floor)`` over the median of its peers' ``(median gap +
  floor)``, where ``floor`` is the least median duration of any rank of the site. Ranks
  in a collective wait for the slowest, so their cycles are equal and the slowest
  rank's block is the *shortest* (the others wait inside theirs): what tells it apart
  is its longer time outside the scope. ``floor`` is the part of a block that no rank
  waits out (the collective's own cost), so a rank's own time per iteration is its
  gap plus the floor.

The rank's slowness ratio is the larger of the two, and its *excess* the seconds per
iteration behind that ratio. It is *slow* in an evaluation when its ratio is at least
``threshold`` and its excess at least ``min_excess`` (a ratio of two tiny gaps is
noise, not slowness). It becomes a straggler after ``confirm`` slow evaluations in a
row, and stops being one after ``confirm`` evaluations in a row with a ratio below
``recover`` (hysteresis: ``recover < threshold``). A site is evaluated once its ranks
have, between them, finished as many blocks as there are ranks since the last
evaluation (about once per iteration), so the cost is amortised O(window) per block.

A rank whose last block of a site ended more than ``stale_after`` seconds before the
site's newest one is left out of that site's evaluations (it stopped or hangs: the
timers say so) until it finishes a block again; :meth:`StragglerDetector.forget`
drops a rank (its process was replaced), which clears its flags.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from statistics import median
from typing import Final, NamedTuple, TypeVar

__all__ = [
    "CONFIRM",
    "MAX_RATIO",
    "MIN_EXCESS",
    "RECOVER",
    "STALE_AFTER",
    "THRESHOLD",
    "WINDOW",
    "StragglerChange",
    "StragglerDetector",
    "Timing",
    "compare_ranks",
]

#: A rank whose slowness ratio is at least this is slow (see docs/stragglers.md).
THRESHOLD: Final[float] = 1.3
#: A straggler whose ratio falls below this has recovered.
RECOVER: Final[float] = 1.15
#: Blocks per rank and site whose medians are compared.
WINDOW: Final[int] = 20
#: Evaluations in a row that make (or unmake) a straggler.
CONFIRM: Final[int] = 3
#: Seconds per iteration a rank must be behind its peers to be slow.
MIN_EXCESS: Final[float] = 0.001
#: The largest ratio reported (a rank against peers that take no time at all).
MAX_RATIO: Final[float] = 1000.0
#: Seconds without a block after which a rank is left out of its site's evaluations.
STALE_AFTER: Final[float] = 60.0


@dataclass(frozen=True, slots=True)
class StragglerChange:
    """A rank became a straggler in a site (``slow``) or stopped being one."""

    rank: int
    site: str
    slow: bool
    ratio: float
    #: Which comparison named it: ``"cycle"`` (its whole iteration) or ``"own"`` (its
    #: time outside the scope, the others waiting for it inside).
    basis: str
    #: Seconds per iteration it is behind its peers' median (``ratio``'s numerator
    #: minus its denominator).
    excess: float
    #: Blocks per rank the medians were taken over.
    window: int


class Timing(NamedTuple):
    """A rank's medians in one site, over its window (seconds)."""

    cycle: float
    gap: float
    duration: float


K = TypeVar("K", bound=Hashable)


class _Series:
    __slots__ = ("cycles", "durations", "gaps", "last_end", "last_start", "new")

    def __init__(self, window: int) -> None:
        self.cycles: deque[float] = deque(maxlen=window)
        self.gaps: deque[float] = deque(maxlen=window)
        self.durations: deque[float] = deque(maxlen=window)
        self.last_start: float | None = None
        self.last_end: float | None = None
        self.new = 0


class _Judgement:
    __slots__ = ("flagged", "ratio", "streak")

    def __init__(self) -> None:
        self.flagged = False
        self.streak = 0  # evaluations in a row pointing the other way
        self.ratio = 1.0


class _Site:
    __slots__ = ("judged", "newest", "pending", "ranks")

    def __init__(self) -> None:
        self.ranks: dict[int, _Series] = {}
        self.judged: dict[int, _Judgement] = {}
        self.pending = 0
        self.newest = -math.inf


class StragglerDetector:
    """Per site, each rank's recent blocks against its peers' (see the module docs).

    Feed it with :meth:`block`, which returns the ranks that became or stopped being
    stragglers; read it with :meth:`ratios` and :meth:`stragglers`. Not thread-safe.

    Raises:
        ValueError: a parameter out of its range (``recover`` must lie in
            ``[1, threshold)``, ``window >= 3``, ``confirm >= 1``).
    """

    __slots__ = (
        "_confirm",
        "_min_excess",
        "_recover",
        "_sites",
        "_stale_after",
        "_threshold",
        "_window",
        "max_sites",
    )

    def __init__(
        self,
        *,
        threshold: float = THRESHOLD,
        recover: float = RECOVER,
        window: int = WINDOW,
        confirm: int = CONFIRM,
        min_excess: float = MIN_EXCESS,
        stale_after: float = STALE_AFTER,
        max_sites: int = 64,
    ) -> None:
        if not (threshold > 1 and math.isfinite(threshold)):
            raise ValueError(f"threshold must be a finite number > 1, got {threshold!r}")
        if not 1 <= recover < threshold:
            raise ValueError(f"recover must be in [1, threshold), got {recover!r}")
        if window < 3:
            raise ValueError(f"window must be >= 3 blocks, got {window!r}")
        if confirm < 1:
            raise ValueError(f"confirm must be >= 1, got {confirm!r}")
        if not (min_excess >= 0 and stale_after > 0):
            raise ValueError("min_excess must be >= 0 and stale_after > 0 seconds")
        if max_sites < 1:
            raise ValueError(f"max_sites must be >= 1, got {max_sites!r}")
        self._threshold = threshold
        self._recover = recover
        self._window = window
        self._confirm = confirm
        self._min_excess = min_excess
        self._stale_after = stale_after
        self.max_sites = max_sites
        self._sites: dict[str, _Site] = {}

    @property
    def window(self) -> int:
        """Blocks per rank and site whose medians are compared."""
        return self._window

    @property
    def threshold(self) -> float:
        """The slowness ratio from which a rank is slow."""
        return self._threshold

    def block(self, rank: int, site: str, start: float, end: float) -> list[StragglerChange]:
        """Record that ``rank`` ran a block of ``site`` from ``start`` to ``end``
        (seconds); return the changes this made (usually none).

        A block that ends before it starts, or starts before the rank's previous block
        of the site, is ignored (a clock that is not the others', or a replay).
        """
        entry = self._sites.get(site)
        if entry is None:
            if len(self._sites) >= self.max_sites:
                return []  # bounded: the first sites seen are the ones watched
            entry = self._sites[site] = _Site()
        series = entry.ranks.get(rank)
        if series is None:
            series = entry.ranks[rank] = _Series(self._window)
        if not (start <= end and math.isfinite(start) and math.isfinite(end)):
            return []
        if series.last_start is not None and series.last_end is not None:
            if start < series.last_start:
                return []
            series.cycles.append(start - series.last_start)
            series.gaps.append(max(0.0, start - series.last_end))
        series.durations.append(end - start)
        series.last_start, series.last_end = start, end
        entry.newest = max(entry.newest, end)
        entry.pending += 1
        if entry.pending < len(entry.ranks):
            return []
        entry.pending = 0
        return self._evaluate(site, entry)

    def _evaluate(self, site: str, entry: _Site) -> list[StragglerChange]:
        window = self._window
        horizon = entry.newest - self._stale_after
        full = {
            rank: s
            for rank, s in entry.ranks.items()
            if len(s.cycles) >= window and s.last_end is not None and s.last_end >= horizon
        }
        if len(full) < 2:
            return []
        timings = {
            rank: Timing(median(s.cycles), median(s.gaps), median(s.durations))
            for rank, s in full.items()
        }
        changes = []
        for rank, (ratio, basis, excess) in compare_ranks(timings).items():
            judged = entry.judged.get(rank)
            if judged is None:
                judged = entry.judged[rank] = _Judgement()
            judged.ratio = ratio
            if judged.flagged:
                turning = ratio < self._recover
            else:
                turning = ratio >= self._threshold and excess >= self._min_excess
            judged.streak = judged.streak + 1 if turning else 0
            if judged.streak >= self._confirm:
                judged.flagged = not judged.flagged
                judged.streak = 0
                changes.append(
                    StragglerChange(rank, site, judged.flagged, ratio, basis, excess, window)
                )
        return changes

    def timings(self) -> dict[int, dict[str, Timing]]:
        """Each rank's medians per site, over its window (only full windows): what a
        job-wide view compares across nodes (:func:`compare_ranks`)."""
        out: dict[int, dict[str, Timing]] = {}
        for site, entry in self._sites.items():
            for rank, s in entry.ranks.items():
                if len(s.cycles) >= self._window:
                    out.setdefault(rank, {})[site] = Timing(
                        median(s.cycles), median(s.gaps), median(s.durations)
                    )
        return out

    def forget(self, rank: int) -> list[StragglerChange]:
        """Drop every record of ``rank`` (its process was replaced); return a recovery
        for each site it was a straggler in."""
        changes = []
        for site, entry in self._sites.items():
            entry.ranks.pop(rank, None)
            judged = entry.judged.pop(rank, None)
            if judged is not None and judged.flagged:
                changes.append(StragglerChange(rank, site, False, 1.0, "cycle", 0.0, self._window))
        return changes

    def ratios(self) -> dict[int, float]:
        """Each judged rank's slowness ratio: the largest over the sites it was last
        judged in (``1.0``: as fast as its peers' median)."""
        out: dict[int, float] = {}
        for entry in self._sites.values():
            for rank, judged in entry.judged.items():
                out[rank] = max(out.get(rank, 0.0), judged.ratio)
        return out

    def stragglers(self) -> dict[int, tuple[tuple[str, float], ...]]:
        """Each straggler's sites, with its last ratio in each."""
        out: dict[int, list[tuple[str, float]]] = {}
        for site, entry in self._sites.items():
            for rank, judged in entry.judged.items():
                if judged.flagged:
                    out.setdefault(rank, []).append((site, judged.ratio))
        return {rank: tuple(sites) for rank, sites in sorted(out.items())}

    def __repr__(self) -> str:
        return f"<StragglerDetector {len(self._sites)} sites, {len(self.stragglers())} stragglers>"


def compare_ranks(timings: Mapping[K, Timing]) -> dict[K, tuple[float, str, float]]:
    """Each rank's ``(ratio, basis, excess)`` against the others of ``timings`` (at
    least two; else none): the larger of its cycle ratio and its own ratio (see the
    module docs)."""
    if len(timings) < 2:
        return {}
    floor = min(t.duration for t in timings.values())
    cycles = sorted(t.cycle for t in timings.values())
    owns = sorted(t.gap + floor for t in timings.values())
    out = {}
    for key, mine in timings.items():
        own_time = mine.gap + floor
        best = _compare(mine.cycle, _median_without(cycles, mine.cycle), "cycle")
        own = _compare(own_time, _median_without(owns, own_time), "own")
        out[key] = own if own[0] > best[0] else best
    return out


def _median_without(ordered: list[float], x: float) -> float:
    """The median of sorted ``ordered`` without one occurrence of ``x`` (in it, and not
    alone): O(log n), so comparing every rank of a large job with the others is
    O(n log n), not O(n^2)."""
    i = bisect_left(ordered, x)
    m = len(ordered) - 1

    def kth(k: int) -> float:
        return ordered[k] if k < i else ordered[k + 1]

    if m % 2:
        return kth(m // 2)
    return (kth(m // 2 - 1) + kth(m // 2)) / 2


def _compare(mine: float, peers: float, basis: str) -> tuple[float, str, float]:
    """``(ratio, basis, excess)`` of ``mine`` against ``peers`` (seconds)."""
    excess = mine - peers
    ratio = mine / peers if peers > 0 else (MAX_RATIO if mine > 0 else 1.0)
    return min(ratio, MAX_RATIO), basis, excess
