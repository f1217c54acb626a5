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
  other one read in the last one to two :data:`LEAD_WINDOW` (:class:`Leads`: a job's
  blocks tend to keep their timeouts): that one is applied up to the interval late,
  and shortens the intervals that follow. An acquire already due when read says
  nothing about the others (a late write) and is left out. aiotimer's client rings the
  bell beside the FIFO after an acquire with a lead under :func:`bell_lead`
  (:mod:`aiotimer.sources._bell`), which ends the interval at once: its acquires are
  read in time from the first one on.
* **Durations** (the scope statistics) are timed by when the server applies the
  acquire and the release, so while input trickles in each is off by up to an
  interval.
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
    "LEAD_WINDOW",
    "MIN_INTERVAL",
    "READ_INTERVAL",
    "Leads",
    "bell_lead",
    "paced",
    "shortest_lead",
    "trickle_interval",
]

#: The longest interval between two reads of a trickle, in seconds.
READ_INTERVAL: Final[float] = 0.25
#: The interval is at most this share of the shortest lead read in the trickle.
LEAD_SHARE: Final[float] = 0.8
#: An interval shorter than this is not worth a timer: read at every line instead.
MIN_INTERVAL: Final[float] = 0.002
#: Reads in a row that find the pipe empty before the reader waits for input again.
EMPTY_READS: Final[int] = 2
#: Seconds a lead is remembered: :class:`Leads` holds the shortest of the last one to
#: two such windows.
LEAD_WINDOW: Final[float] = 60.0


class Leads:
    """The shortest lead of the acquires read in the current and the previous
    :data:`LEAD_WINDOW` (``math.inf``: none)."""

    __slots__ = ("_current", "_previous", "_until")

    def __init__(self) -> None:
        self._current = self._previous = math.inf
        self._until = -math.inf

    def note(self, lead: float) -> None:
        """An acquire read now had ``lead`` seconds to its deadline."""
        self._current = min(self._current, lead)

    def shortest(self, now: float) -> float:
        """The shortest lead noted in the window of ``now`` (monotonic) and the one
        before it."""
        if now >= self._until:
            recent = now < self._until + LEAD_WINDOW
            self._previous = self._current if recent else math.inf
            self._current = math.inf
            self._until = now + LEAD_WINDOW
        return min(self._current, self._previous)


def trickle_interval(limit: float, lead: float) -> float:
    """The interval before the next read of a trickle: at most ``limit`` seconds and
    :data:`LEAD_SHARE` of ``lead``; ``0.0`` (read at every line) below
    :data:`MIN_INTERVAL`."""
    interval = min(limit, lead * LEAD_SHARE)
    return interval if interval >= MIN_INTERVAL else 0.0


def bell_lead(limit: float) -> float:
    """The lead below which a client rings the bell after an acquire, for intervals of
    at most ``limit`` seconds: a longer lead leaves ``1 - LEAD_SHARE`` of it to spare
    after one interval."""
    return limit / LEAD_SHARE


def paced(elapsed: float, read: int, room: int) -> float:
    """The interval after which input that brought ``read`` bytes in ``elapsed``
    seconds fills ``room`` bytes of the pipe (the next read comes no later: writers
    keep room for a burst)."""
    return elapsed * room / read if read > 0 else math.inf


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
