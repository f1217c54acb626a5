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
  *lead*), and at most a limit: :data:`BELL_INTERVAL` while every acquire read in the
  last one to two :data:`LEAD_WINDOW` came from a client that rings the bell (it sends
  the ``mono`` key: aiotimer's), :data:`READ_INTERVAL` once one came from a client
  that does not (torch's) (:func:`next_interval`). An acquire is therefore applied with
  at least ``1 - LEAD_SHARE`` of its lead left, unless its lead is shorter than every
  other one read in that window (:class:`Leads`: a job's blocks tend to keep their
  timeouts): that one is applied up to the interval late, and shortens the intervals
  that follow. An acquire already due when read says nothing about the others (a late
  write) and is left out. aiotimer's client rings the bell beside the FIFO after an
  acquire with a lead under :func:`bell_lead` of the longest interval, a byte that
  says its lead (:mod:`aiotimer._edges.ring`), unless it rang for a lead as short in
  the last :data:`LEAD_WINDOW` (the server still paces by it): the ring ends the
  interval at once (unless it ends within :data:`LEAD_SHARE` of the lead anyway) and
  the lead it says bounds the intervals that follow, so its acquires are read in time
  from the first one on, and a steady job rings about once a minute per client.
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
    "BELL_INTERVAL",
    "EMPTY_READS",
    "LEAD_SHARE",
    "LEAD_WINDOW",
    "MIN_INTERVAL",
    "READ_INTERVAL",
    "Leads",
    "bell_lead",
    "next_interval",
    "paced",
    "shortest_lead",
    "trickle_interval",
]

#: The longest interval between two reads of a trickle, in seconds, once an acquire from
#: a client that does not ring the bell (torch's) was read lately.
READ_INTERVAL: Final[float] = 0.25
#: The longest interval while every acquire read lately came from a client that rings
#: the bell (seconds): a training loop's blocks of a minute are read every 2 s, not 4
#: times a second.
BELL_INTERVAL: Final[float] = 2.0
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
    """The shortest lead of the acquires read (or rung for) in the current and the
    previous :data:`LEAD_WINDOW` (``math.inf``: none), and whether one of them came from
    a client that does not ring the bell (*mute*)."""

    __slots__ = ("_current", "_current_mute", "_previous", "_previous_mute", "_until")

    def __init__(self) -> None:
        self._current = self._previous = math.inf
        self._current_mute = self._previous_mute = False
        self._until = -math.inf

    def note(self, lead: float, now: float, *, mute: bool = False) -> None:
        """An acquire read (or rung for) at ``now`` (monotonic) had ``lead`` seconds to
        its deadline; ``mute``: there was an acquire from a client that does not ring
        among them. It is remembered for at least :data:`LEAD_WINDOW` seconds."""
        self._roll(now)
        self._current = min(self._current, lead)
        self._current_mute = self._current_mute or mute

    def _roll(self, now: float) -> None:
        if now >= self._until:
            recent = now < self._until + LEAD_WINDOW
            self._previous = self._current if recent else math.inf
            self._previous_mute = self._current_mute and recent
            self._current, self._current_mute = math.inf, False
            self._until = now + LEAD_WINDOW

    def shortest(self, now: float) -> float:
        """The shortest lead noted in the window of ``now`` (monotonic) and the one
        before it."""
        self._roll(now)
        return min(self._current, self._previous)

    def mute(self, now: float) -> bool:
        """Whether an acquire from a client that does not ring was noted in the window
        of ``now`` or the one before it."""
        self._roll(now)
        return self._current_mute or self._previous_mute


def trickle_interval(limit: float, lead: float) -> float:
    """The interval before the next read of a trickle: at most ``limit`` seconds and
    :data:`LEAD_SHARE` of ``lead``; ``0.0`` (read at every line) below
    :data:`MIN_INTERVAL`."""
    interval = min(limit, lead * LEAD_SHARE)
    return interval if interval >= MIN_INTERVAL else 0.0


def next_interval(read_interval: float, bell_interval: float, lead: float, mute: bool) -> float:
    """The pacing rule: the interval before the next read of a trickle, given the
    shortest ``lead`` noted lately and whether a client that does not ring sent one of
    them (``mute``): at most :data:`LEAD_SHARE` of ``lead``, at most ``read_interval``
    when ``mute``, else at most ``bell_interval`` (never less than ``read_interval``);
    ``0.0`` (read at every line) below :data:`MIN_INTERVAL` or when ``read_interval`` is
    ``0``."""
    if read_interval <= 0.0:
        return 0.0
    return trickle_interval(read_interval if mute else max(read_interval, bell_interval), lead)


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


def shortest_lead(requests: Iterable[Request], since: float = math.inf) -> tuple[float, bool]:
    """The shortest lead of the acquires among ``requests`` not yet due (``math.inf``:
    none), and whether one of those came from a client that does not ring the bell (no
    ``mono`` key: torch's).

    An acquire's lead is the time it had to its deadline when written, which the reader
    does not know: it was written at most ``since`` (monotonic: when the pipe was last
    read) and at least now. For a client that does not ring, the lead is taken from
    now (the least it can be). Not so for one that rings, which rang for every lead
    shorter than those the server paces by (:mod:`aiotimer._edges.ring`): its lead is
    taken from ``since`` (the most it can be: at most one interval more than it was, or
    less when it waited in the pipe longer), so that the wait in the pipe does not
    shorten the leads read, and with them the interval, read after read.
    """
    mono, wall = time.monotonic(), time.time()
    # One pass over every line of a read, inlined (Request.is_release and
    # Request.deadline without the calls): the earliest deadline of each kind.
    rung = mute_deadline = math.inf
    for req in requests:
        expiration = req.expiration_time
        if expiration >= 0.0:
            deadline = req.mono
            if deadline is not None:
                if mono < deadline < rung:
                    rung = deadline
            elif wall < expiration < mute_deadline:
                mute_deadline = expiration
    lead = rung - min(since, mono)
    if mute_deadline < math.inf:
        return min(lead, mute_deadline - wall), True
    return lead, False
