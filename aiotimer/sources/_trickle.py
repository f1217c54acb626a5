"""Reading input that trickles in once per interval rather than at every line.

A server that sleeps between lines pays for each wake-up far more than for the lines it
reads (a wake-up costs it ~100-400 us of CPU, a line ~2-5 us: ``python -m
benchmarks.bench_server_cpu``). So after a read that found a trickle (some input, and
it emptied the pipe), a reader reads the pipe again only after an interval, as long as
input keeps trickling in, then goes back to waking at the next line.

What that interval may cost:

* **A release** is never held up past a deadline: before every expiry the server's drain
  reads what the pipe holds for the due workers.
* **An acquire** is applied up to an interval after it was written: it must be read
  before its deadline. So the interval is at most :data:`LEAD_SHARE` of the shortest
  time to its deadline of an acquire read since the reader last waited for input (its
  *lead*), and at most :data:`READ_INTERVAL`. An acquire is therefore applied with at
  least ``1 - LEAD_SHARE`` of its lead left, unless its lead is shorter than every
  other one read in the trickle: that one is applied up to the interval late, and
  shortens the intervals that follow. An acquire already due when read says nothing
  about the others (a late write) and is left out.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import Final

from aiotimer.wire import Request

__all__ = [
    "EMPTY_READS",
    "LEAD_SHARE",
    "MIN_INTERVAL",
    "READ_INTERVAL",
    "shortest_lead",
    "trickle_interval",
]

#: The longest interval between two reads of a trickle, in seconds.
READ_INTERVAL: Final[float] = 0.25
#: The interval is at most this share of the shortest lead read in the trickle.
LEAD_SHARE: Final[float] = 0.5
#: An interval shorter than this is not worth a timer: read at every line instead.
MIN_INTERVAL: Final[float] = 0.002
#: Reads in a row that find the pipe empty before the reader waits for input again.
EMPTY_READS: Final[int] = 2


def trickle_interval(limit: float, lead: float) -> float:
    """The interval before the next read of a trickle: at most ``limit`` seconds and
    :data:`LEAD_SHARE` of ``lead``; ``0.0`` (read at every line) below
    :data:`MIN_INTERVAL`."""
    interval = min(limit, lead * LEAD_SHARE)
    return interval if interval >= MIN_INTERVAL else 0.0


def shortest_lead(requests: Iterable[Request]) -> float:
    """The shortest time to its deadline, in seconds from now, of the acquires among
    ``requests`` not yet due (``math.inf``: none)."""
    mono, wall = time.monotonic(), time.time()
    lead = math.inf
    for req in requests:
        if not req.is_release:
            left = req.deadline(mono, wall) - mono
            if 0.0 < left < lead:
                lead = left
    return lead
