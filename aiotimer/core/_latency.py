"""A fixed-bucket latency histogram, in the Prometheus shape. Pure: no I/O, no clock.

The engine records two latencies into it: deadline -> first signal of a reap, and how
late an expiry was handled (the loop lag that delayed it). Buckets are fixed so a scraper
can aggregate them across servers; ``count``, ``sum`` and ``max`` are exact.
"""

from __future__ import annotations

import bisect
from typing import Final

__all__ = ["LATENCY_BUCKETS", "LatencyHistogram"]

#: Upper bounds (seconds, inclusive) of the buckets; one more bucket holds the rest.
LATENCY_BUCKETS: Final[tuple[float, ...]] = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class LatencyHistogram:
    """Counts of observed latencies (seconds) per bucket of :data:`LATENCY_BUCKETS`.

    >>> h = LatencyHistogram()
    >>> h.observe(0.0007); h.observe(3.0)
    >>> h.count, h.max, h.cumulative()[1]
    (2, 3.0, (0.001, 1))
    """

    __slots__ = ("_counts", "count", "max", "sum")

    def __init__(self) -> None:
        self._counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.count = 0
        self.sum = 0.0
        self.max = 0.0

    def observe(self, seconds: float) -> None:
        """Record one latency; a negative one (a clock quirk) counts as zero."""
        seconds = max(0.0, seconds)
        self._counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.count += 1
        self.sum += seconds
        self.max = max(self.max, seconds)

    def copy(self) -> LatencyHistogram:
        """An independent copy (a snapshot's: later observations do not change it)."""
        twin = LatencyHistogram()
        twin._counts = list(self._counts)
        twin.count, twin.sum, twin.max = self.count, self.sum, self.max
        return twin

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations <= it)`` per bucket, ending with ``(inf, count)``."""
        out: list[tuple[float, int]] = []
        total = 0
        for bound, n in zip((*LATENCY_BUCKETS, float("inf")), self._counts, strict=True):
            total += n
            out.append((bound, total))
        return out

    def __repr__(self) -> str:
        return f"<LatencyHistogram {self.count} observations, max {self.max:.6f}s>"
