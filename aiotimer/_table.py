"""The timer table: every live timer, ordered by deadline. Pure: no I/O, no clock reads.

How this works
--------------
Timers are keyed by ``(pid, scope_id)``. Two structures hold them:

* ``_by_pid``: ``pid -> {scope_id -> entry}``, the source of truth for what is live;
  it makes acquire/release O(1) dict work and "clear this worker" O(timers of the worker).
* ``_heap``: a ``heapq`` of entries ``[deadline, seq, timer]`` ordered by deadline, ties
  broken by acquisition order (``seq``).

Removing from the middle of a heap is O(n), so we never do it. A release, a replacement
or a worker clear only *tombstones* the entry (sets its timer slot to ``None``) and counts
it as stale. Stale entries are discarded when they surface at the top of the heap
(``pop_expired`` and ``next_deadline``), and when they dominate (more than 100 of them
*and* more than half of the heap, as asyncio does for cancelled timer handles) the heap is
rebuilt from the live entries of ``_by_pid``. That rebuild costs O(live), less than the
O(stale) deletions that triggered it, and removes every stale entry, so it amortises to
O(1) per deletion. Every operation is therefore O(log n) amortised, independent of how
many timers have come and gone.

The check runs after every operation that creates stale entries or removes live ones
(``pop_expired`` too: expiring the live entries in front of a heap whose tail is stale
would otherwise leave a heap of tombstones). Hence, after every public call, either
``stale <= 100`` or ``stale <= live``, i.e. ``heap_size <= max(2 * len, len + 100)``.

Time is an argument (``pop_expired(now)``), never read here: the caller owns the clock.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, KeysView
from dataclasses import dataclass
from typing import Any

__all__ = ["Timer", "TimerKey", "TimerTable"]

TimerKey = tuple[int, str]

#: Compact when more than this many entries are stale *and* they are over half the heap.
_COMPACT_MIN_STALE = 100


@dataclass(frozen=True, slots=True)
class Timer:
    """One live timer: worker ``pid``, its ``scope_id``, and what to do at ``deadline``.

    ``deadline`` and ``acquired_at`` are on the server's monotonic clock. ``signal`` is
    the signal the request named (``<= 0`` means report only). ``options`` carries the
    request's extension data (escalation, process-group kill, ...) opaquely: the table
    never looks at it.
    """

    pid: int
    scope_id: str
    deadline: float
    signal: int
    acquired_at: float = 0.0
    options: Any = None

    @property
    def key(self) -> TimerKey:
        """The ``(pid, scope_id)`` key of this timer."""
        return (self.pid, self.scope_id)


# A heap entry: [deadline, seq, timer-or-None]. A list so it can be tombstoned in place.
_Entry = list[Any]


class TimerTable:
    """Live timers keyed by ``(pid, scope_id)``, ordered by deadline.

    >>> t = TimerTable()
    >>> t.acquire(Timer(pid=42, scope_id="load", deadline=10.0, signal=9))
    >>> t.next_deadline()
    10.0
    >>> [x.scope_id for x in t.pop_expired(now=10.0)]
    ['load']
    >>> len(t)
    0
    """

    __slots__ = ("_by_pid", "_count", "_heap", "_seq", "_stale")

    def __init__(self) -> None:
        self._by_pid: dict[int, dict[str, _Entry]] = {}
        self._heap: list[_Entry] = []
        self._count = 0
        self._stale = 0
        self._seq = 0

    # -- mutation -------------------------------------------------------------------

    def acquire(self, timer: Timer) -> Timer | None:
        """Add ``timer``, replacing any live timer with the same key.

        Returns the replaced timer, or ``None`` if the key was new. O(log n).

        Raises:
            ValueError: ``timer.deadline`` is NaN (it would corrupt the heap order).
        """
        if timer.deadline != timer.deadline:
            raise ValueError(f"timer deadline must not be NaN: {timer!r}")
        scopes = self._by_pid.get(timer.pid)
        if scopes is None:
            scopes = self._by_pid[timer.pid] = {}
        old_entry = scopes.get(timer.scope_id)
        old: Timer | None = None
        if old_entry is not None:
            old = old_entry[2]
            self._tombstone(old_entry)
        else:
            self._count += 1
        self._seq += 1
        entry: _Entry = [timer.deadline, self._seq, timer]
        scopes[timer.scope_id] = entry
        heapq.heappush(self._heap, entry)
        if old is not None:
            self._maybe_compact()
        return old

    def release(self, pid: int, scope_id: str) -> Timer | None:
        """Remove the timer ``(pid, scope_id)``; releasing an unknown key is a no-op.

        Returns the removed timer, or ``None``. O(1) plus amortised compaction.
        """
        scopes = self._by_pid.get(pid)
        if scopes is None:
            return None
        entry = scopes.pop(scope_id, None)
        if entry is None:
            return None
        if not scopes:
            del self._by_pid[pid]
        timer: Timer = entry[2]
        self._count -= 1
        self._tombstone(entry)
        self._maybe_compact()
        return timer

    def clear_worker(self, pid: int) -> list[Timer]:
        """Remove every timer of worker ``pid``; return them in deadline order."""
        scopes = self._by_pid.pop(pid, None)
        if not scopes:
            return []
        removed = sorted((e for e in scopes.values()), key=lambda e: (e[0], e[1]))
        timers: list[Timer] = [e[2] for e in removed]
        for entry in removed:
            self._tombstone(entry)
        self._count -= len(timers)
        self._maybe_compact()
        return timers

    def pop_expired(self, now: float) -> list[Timer]:
        """Remove and return every timer with ``deadline <= now``, in deadline order.

        O(log n) per expired (or stale) entry popped.
        """
        heap = self._heap
        expired: list[Timer] = []
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            timer: Timer | None = entry[2]
            if timer is None:
                self._stale -= 1
                continue
            scopes = self._by_pid[timer.pid]
            del scopes[timer.scope_id]
            if not scopes:
                del self._by_pid[timer.pid]
            self._count -= 1
            expired.append(timer)
        if expired:
            self._maybe_compact()
        return expired

    # -- queries --------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """The earliest live deadline, or ``None`` when the table is empty. O(1) amortised."""
        heap = self._heap
        while heap and heap[0][2] is None:
            heapq.heappop(heap)
            self._stale -= 1
        return heap[0][0] if heap else None

    def get(self, pid: int, scope_id: str) -> Timer | None:
        """The live timer ``(pid, scope_id)``, or ``None``."""
        scopes = self._by_pid.get(pid)
        if scopes is None:
            return None
        entry = scopes.get(scope_id)
        return None if entry is None else entry[2]

    def worker_timers(self, pid: int) -> list[Timer]:
        """The live timers of worker ``pid`` (any order)."""
        scopes = self._by_pid.get(pid)
        return [] if scopes is None else [e[2] for e in scopes.values()]

    def workers(self) -> KeysView[int]:
        """A live read-only view of the pids that have at least one timer."""
        return self._by_pid.keys()

    def timers(self) -> Iterator[Timer]:
        """Iterate over the live timers (any order). Do not mutate the table meanwhile."""
        for scopes in self._by_pid.values():
            for entry in scopes.values():
                yield entry[2]

    def snapshot(self) -> tuple[Timer, ...]:
        """An immutable copy of every live timer, in expiry order (deadline, then age)."""
        entries = [e for scopes in self._by_pid.values() for e in scopes.values()]
        entries.sort(key=lambda e: (e[0], e[1]))
        return tuple(e[2] for e in entries)

    def __len__(self) -> int:
        return self._count

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, tuple) or len(key) != 2:
            return False
        pid, scope_id = key
        scopes = self._by_pid.get(pid)
        return scopes is not None and scope_id in scopes

    def __repr__(self) -> str:
        nd = self.next_deadline()
        when = "none" if nd is None else f"{nd:.3f}"
        return (
            f"<TimerTable {self._count:,} timers, {len(self._by_pid):,} workers, "
            f"next deadline {when}>"
        )

    @property
    def heap_size(self) -> int:
        """Entries in the heap, live and stale (for diagnostics and tests)."""
        return len(self._heap)

    # -- internals ------------------------------------------------------------------

    def _tombstone(self, entry: _Entry) -> None:
        entry[2] = None
        self._stale += 1

    def _maybe_compact(self) -> None:
        if self._stale > _COMPACT_MIN_STALE and self._stale * 2 > len(self._heap):
            # From the index, not by filtering the heap: O(live), and live < stale here.
            self._heap = [e for scopes in self._by_pid.values() for e in scopes.values()]
            heapq.heapify(self._heap)
            self._stale = 0
