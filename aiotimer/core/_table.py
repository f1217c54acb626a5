"""The timer table: every live timer, ordered by deadline. Pure: no I/O, no clock reads.

How this works
--------------
Timers (:class:`~aiotimer.core._timer.Timer`, re-exported here) are keyed by
``(pid, scope_id)``. Two structures hold them:

* ``_by_pid``: ``pid -> {scope_id -> entry}``, the source of truth for what is live;
  it makes acquire/release O(1) dict work and dropping a worker one dict ``pop``.
* ``_heap``: a ``heapq`` of entries ``(deadline, seq, timer)`` ordered by deadline, ties
  broken by acquisition order (``seq``, unique, so timers themselves are never compared).

An entry is *live* while the index maps its key to that very entry (``is``); otherwise it
is *stale*. Removing from the middle of a heap is O(n), so we never do it: a release, a
replacement or a worker drop only updates the index, which makes the old entry stale
where it lies (lazy deletion; ``stale = heap_size - len``). Stale entries are discarded
when they surface at the top of the heap (``pop_expired`` and ``next_deadline``).

Compaction, deamortised. When stale entries dominate (more than ``min_stale`` of them
*and* more than half of the heap, as asyncio does for cancelled timer handles) a new heap
is built *incrementally* while the old one stays authoritative for pops and peeks:

1. Start: copy the list of pids (O(workers)) and remember the current ``seq``.
2. Every mutating call then does at most ``rebuild_step`` units of the scan: take the
   next worker's entries (a C-level copy of its dict's items), and for each entry that
   is still live and not newer than the start, ``heappush`` it into the new heap.
3. An acquire during the scan pushes its entry into *both* heaps. Anything released,
   replaced, dropped or expired meanwhile is stale in both, since liveness is decided by
   the index, not by the heap an entry sits in. Whenever entries leave the old heap's
   top (``pop_expired``, ``next_deadline``), the new heap drops its entries that precede
   the old top too: they are stale, and the work matches the old heap's pops.
4. When the scan is done the new heap replaces the old one, and the rule is checked again.
   The old heap is *retired*: every mutating call frees ``4 * rebuild_step`` of its
   entries, since freeing the stale ones all at once costs as much as a rebuild did.

Why every live entry is in the new heap exactly once at the swap: an entry live at the
swap was either live at the start (its seq is not newer; its worker was in the pid list;
it was live when its worker was scanned, since an entry never comes back to life) and
pushed by the scan, or acquired during the scan (newer seq, so skipped by the scan) and
pushed by its acquire. The new heap holds nothing else but entries gone stale since.

The scan is O(live + workers) in all, O(1) per call plus one worker's dict copy; it is
spread over about ``(live + workers) / rebuild_step`` calls, so no call stalls the loop
for a whole rebuild. Each entry costs one push and is discarded once, so every
operation stays O(log n) amortised, independent of how many timers have come and gone.

The bound on ``heap_size``. After any call that ends with no compaction in progress,
``heap_size <= max(2 * len, len + min_stale)``: the rule is checked after every call that
can break it (a new-key acquire and a stale pop cannot). While compactions run (back to
back, when one ends with stale entries dominating again), let ``P`` be the largest live
count since the table was last not compacting, ``s = rebuild_step`` and
``B = max(2P, P + min_stale) + 1``. A compaction starts from at most ``B`` entries (the
rule held before the call that started it, which added at most one). It scans
``U <= 2P + A + 1`` units (at most ``P`` workers and ``P`` entries live at its start, the
``A`` entries acquired during it, the swap), and every acquire does ``s`` of them, so
``A <= U / s + 1``, i.e. ``A <= (2P + 1 + s) // (s - 1)``. Hence, always,
``heap_size <= B + (2P + 1 + s) // (s - 1)`` (at the default ``s`` about ``B + P / 7``),
and with ``s >= 4`` the next compaction again starts from at most ``P + A <= B``
entries. The state machine in tests/test_table.py pins both bounds.

Time is an argument (``pop_expired(now)``), never read here: the caller owns the clock.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, KeysView

from aiotimer.core._timer import Timer, TimerKey

__all__ = ["MIN_STALE", "REBUILD_STEP", "Timer", "TimerKey", "TimerTable"]

#: Default ``min_stale``: compact when more entries than this are stale *and* they are
#: over half the heap.
MIN_STALE = 100
#: Default ``rebuild_step``: units of an incremental compaction done per mutating call
#: (a unit is one entry or one worker). Larger finishes a compaction in fewer calls;
#: smaller makes the worst call cheaper. Each unit is ~0.1-0.3 us.
REBUILD_STEP = 16
#: Entries of a replaced heap freed per unit of ``rebuild_step`` (about 0.1 us each).
_FREED_PER_UNIT = 4


# A heap entry: (deadline, seq, timer). Live while the index maps the key to it (``is``).
# A tuple of untracked objects, so the garbage collector untracks it too.
_Entry = tuple[float, int, Timer]
_NO_SCOPES: KeysView[str] = {}.keys()


class TimerTable:
    """Live timers keyed by ``(pid, scope_id)``, ordered by deadline.

    ``min_stale`` and ``rebuild_step`` tune compaction (see the module docs): how many
    stale entries are always tolerated, and how much of an incremental rebuild each
    mutating call does (at least 4).

    >>> t = TimerTable()
    >>> t.acquire(Timer(pid=42, scope_id="load", deadline=10.0, signal=9))
    >>> t.next_deadline()
    10.0
    >>> [x.scope_id for x in t.pop_expired(now=10.0)]
    ['load']
    >>> len(t)
    0
    """

    __slots__ = (
        "_by_pid",
        "_count",
        "_heap",
        "_min_stale",
        "_next_heap",
        "_retired",
        "_scan_items",
        "_scan_pid",
        "_scan_pids",
        "_scan_seq",
        "_seq",
        "_step",
    )

    def __init__(self, *, min_stale: int = MIN_STALE, rebuild_step: int = REBUILD_STEP) -> None:
        if min_stale < 0:
            raise ValueError(f"min_stale must not be negative: {min_stale}")
        if rebuild_step < 4:
            raise ValueError(f"rebuild_step must be at least 4: {rebuild_step}")
        self._min_stale = min_stale
        self._step = rebuild_step
        self._by_pid: dict[int, dict[str, _Entry]] = {}
        self._heap: list[_Entry] = []
        self._count = 0
        self._seq = 0
        # The compaction in progress: None when there is none (see the module docs).
        self._scan_pids: list[int] | None = None
        self._scan_pid = 0
        self._scan_items: list[tuple[str, _Entry]] = []
        self._scan_seq = 0
        self._next_heap: list[_Entry] = []
        # Replaced heaps, freed a slice per mutating call (see _background_step).
        self._retired: list[list[_Entry]] = []

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
        if old_entry is None:
            self._count += 1
        self._seq += 1
        entry: _Entry = (timer.deadline, self._seq, timer)
        scopes[timer.scope_id] = entry
        heapq.heappush(self._heap, entry)
        if self._scan_pids is not None:
            heapq.heappush(self._next_heap, entry)
            self._background_step(replaced=old_entry is not None)
        elif old_entry is not None or self._retired:
            self._background_step(replaced=old_entry is not None)
        return None if old_entry is None else old_entry[2]

    def release(self, pid: int, scope_id: str) -> Timer | None:
        """Remove the timer ``(pid, scope_id)``; releasing an unknown key is a no-op.

        Returns the removed timer, or ``None``. O(1) plus a bounded compaction step.
        """
        scopes = self._by_pid.get(pid)
        if scopes is None:
            return None
        entry = scopes.pop(scope_id, None)
        if entry is None:
            return None
        if not scopes:
            del self._by_pid[pid]
        self._count -= 1
        self._background_step(replaced=True)
        return entry[2]

    def drop_worker(self, pid: int, *, sample: int = 0) -> tuple[int, list[str]]:
        """Remove every timer of worker ``pid`` in O(1) (their heap entries go stale and
        are discarded as they surface); return how many, and up to ``sample`` of their
        scope ids (any order)."""
        scopes = self._by_pid.pop(pid, None)
        if not scopes:
            return 0, []
        self._count -= len(scopes)
        self._background_step(replaced=True)
        return len(scopes), list(itertools.islice(scopes, sample))

    def pop_expired(self, now: float, *, budget: int | None = None) -> list[Timer]:
        """Remove and return every timer with ``deadline <= now``, in deadline order.

        O(log n) per expired (or stale) entry popped. With a ``budget``, at most that many
        heap entries (expired or stale) are popped: the caller asks again for the rest,
        so one call's work is bounded however many timers fall due at once.
        """
        heap, by_pid = self._heap, self._by_pid
        expired: list[Timer] = []
        left = -1 if budget is None else budget
        popped = False
        while heap and heap[0][0] <= now and left:
            left -= 1
            popped = True
            entry = heapq.heappop(heap)
            timer = entry[2]
            scopes = by_pid.get(timer.pid)
            if scopes is None or scopes.get(timer.scope_id) is not entry:
                continue  # stale
            del scopes[timer.scope_id]
            if not scopes:
                del by_pid[timer.pid]
            expired.append(timer)
        if self._scan_pids is not None:
            self._trim_next_heap()
        if expired:
            self._count -= len(expired)
            self._background_step(replaced=True)
        elif popped and self._scan_pids is not None:
            # Only stale entries: let the compaction go on, or a worker dropped with
            # 100k timers leaves them all to be popped here before a live one surfaces.
            self._background_step(replaced=False)
        return expired

    # -- queries --------------------------------------------------------------------

    def next_deadline(self, *, budget: int | None = None) -> float | None:
        """The earliest live deadline, or ``None`` when the table is empty. O(1) amortised.

        With a ``budget``, at most that many stale entries are discarded; when it runs
        out, the deadline of the stale entry on top is returned: never later than the
        earliest live one, and :meth:`pop_expired` discards the entry when it is due.
        """
        heap, by_pid = self._heap, self._by_pid
        left = -1 if budget is None else budget
        while heap and left:
            left -= 1
            entry = heap[0]
            timer = entry[2]
            scopes = by_pid.get(timer.pid)
            if scopes is not None and scopes.get(timer.scope_id) is entry:  # live
                break
            heapq.heappop(heap)
        if self._scan_pids is not None:
            self._trim_next_heap()
        return heap[0][0] if heap else None

    def get(self, pid: int, scope_id: str) -> Timer | None:
        """The live timer ``(pid, scope_id)``, or ``None``."""
        scopes = self._by_pid.get(pid)
        if scopes is None:
            return None
        entry = scopes.get(scope_id)
        return None if entry is None else entry[2]

    def worker_size(self, pid: int) -> int:
        """How many live timers worker ``pid`` has. O(1)."""
        scopes = self._by_pid.get(pid)
        return 0 if scopes is None else len(scopes)

    def live_scopes(self, pid: int) -> KeysView[str]:
        """The scope ids of worker ``pid``'s live timers. O(1): a read-only view that
        follows the table for as long as the worker has timers (an empty one if it has
        none now)."""
        scopes = self._by_pid.get(pid)
        return _NO_SCOPES if scopes is None else scopes.keys()

    def worker_timers(self, pid: int) -> list[Timer]:
        """The live timers of worker ``pid`` (any order)."""
        scopes = self._by_pid.get(pid)
        return [] if scopes is None else [e[2] for e in scopes.values()]

    def workers(self) -> KeysView[int]:
        """A live read-only view of the pids that have at least one timer."""
        return self._by_pid.keys()

    def worker_sizes(self) -> Iterator[tuple[int, int]]:
        """``(pid, how many live timers it has)`` for every worker with one; a scan at
        C speed (for the quota's tally of a full table)."""
        by_pid = self._by_pid
        return zip(by_pid.keys(), map(len, by_pid.values()), strict=True)

    def snapshot(self) -> tuple[Timer, ...]:
        """An immutable copy of every live timer, in expiry order (deadline, then age)."""
        entries = sorted(e for scopes in self._by_pid.values() for e in scopes.values())
        return tuple(e[2] for e in entries)

    def earliest(self, n: int) -> list[Timer]:
        """Up to ``n`` live timers with the earliest deadlines, in expiry order.

        A best-first walk from the heap's root, so it costs O(k log k) for the k entries
        it visits, not O(len): made for bounded views of a big table. Stale entries are
        skipped but visited; at most ``4 * n + 64`` entries are, so the result may hold
        fewer than ``n`` timers when stale entries crowd the top of the heap.
        """
        heap, by_pid = self._heap, self._by_pid
        size = len(heap)
        out: list[Timer] = []
        # (deadline, seq, index): seq is unique, so the index never decides an order.
        frontier: list[tuple[float, int, int]] = [(*heap[0][:2], 0)] if size and n > 0 else []
        push, pop = heapq.heappush, heapq.heappop
        budget = 4 * n + 64
        while frontier and len(out) < n and budget > 0:
            budget -= 1
            i = pop(frontier)[2]
            entry = heap[i]
            timer = entry[2]
            scopes = by_pid.get(timer.pid)
            if scopes is not None and scopes.get(timer.scope_id) is entry:
                out.append(timer)
            child = 2 * i + 1
            if child < size:
                c = heap[child]
                push(frontier, (c[0], c[1], child))
                if child + 1 < size:
                    c = heap[child + 1]
                    push(frontier, (c[0], c[1], child + 1))
        return out

    def due_pids(self, now: float, *, limit: int) -> set[int] | None:
        """The pids of the live timers with ``deadline <= now``, without removing
        anything; ``None`` when more than ``limit`` heap entries (live or stale) are due.

        A walk of the heap as a tree from its root that descends only into entries with
        ``deadline <= now`` (every entry below one that is not due is not due either), so
        it costs O(min(due, limit)), never O(len). Whenever it answers, the answer covers
        every timer ``pop_expired(now, budget=limit)`` would return now.
        """
        heap, by_pid = self._heap, self._by_pid
        due: set[int] = set()
        if not heap or heap[0][0] > now:
            return due
        size = len(heap)
        stack = [0]
        visited = 0
        while stack:
            i = stack.pop()
            visited += 1
            if visited > limit:
                return None
            entry = heap[i]
            timer = entry[2]
            scopes = by_pid.get(timer.pid)
            if scopes is not None and scopes.get(timer.scope_id) is entry:  # live
                due.add(timer.pid)
            child = 2 * i + 1
            if child < size and heap[child][0] <= now:
                stack.append(child)
            if child + 1 < size and heap[child + 1][0] <= now:
                stack.append(child + 1)
        return due

    def worker_scopes(self, pid: int, limit: int) -> tuple[list[str], int]:
        """Up to ``limit`` scope ids of worker ``pid``'s live timers (any order), and how
        many it has in all. O(limit)."""
        scopes = self._by_pid.get(pid)
        if scopes is None:
            return [], 0
        return list(itertools.islice(scopes, limit)), len(scopes)

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
        """Entries in the (authoritative) heap, live and stale, for diagnostics and tests.

        Bounded as the module docs derive.
        """
        return len(self._heap)

    @property
    def compacting(self) -> bool:
        """Whether an incremental compaction is in progress (for diagnostics and tests)."""
        return self._scan_pids is not None

    # -- internals ------------------------------------------------------------------

    def _background_step(self, *, replaced: bool) -> None:
        """After a mutating call (``replaced``: it made an entry stale): free some retired
        entries, and scan some of the compaction in progress or check whether to start one."""
        retired = self._retired
        if retired:
            # Freeing a whole retired heap at once would cost ~0.1 us per stale entry,
            # tens of ms at 100k timers: free it in bounded slices instead.
            del retired[-1][-self._step * _FREED_PER_UNIT :]
            if not retired[-1]:
                retired.pop()
        if self._scan_pids is not None:
            self._compact_step()
        elif replaced:
            self._maybe_compact()

    def _maybe_compact(self) -> None:
        heap_size = len(self._heap)
        stale = heap_size - self._count
        if stale > self._min_stale and stale * 2 > heap_size:
            self._scan_pids = list(self._by_pid)
            self._scan_seq = self._seq

    def _trim_next_heap(self) -> None:
        """Pop the new heap's entries that precede the old heap's top: they were popped
        from the old heap already, so they are stale (every live entry is in the old
        heap). Without this, the twins of timers that expired during the scan would all
        surface at once after the swap."""
        heap, new_heap = self._heap, self._next_heap
        while new_heap and (not heap or new_heap[0] < heap[0]):
            heapq.heappop(new_heap)

    def _compact_step(self) -> None:
        """Scan up to ``rebuild_step`` units; swap in the new heap when the scan is done."""
        pids = self._scan_pids
        assert pids is not None
        pending, new_heap, by_pid = self._scan_items, self._next_heap, self._by_pid
        newest, push = self._scan_seq, heapq.heappush
        budget = self._step
        while budget > 0:
            if pending:  # the rest of one worker's (scope_id, entry) pairs
                chunk = pending[-budget:]
                del pending[-budget:]
                budget -= len(chunk)
                scopes = by_pid.get(self._scan_pid)
                if scopes is not None:
                    for scope_id, entry in chunk:
                        if entry[1] <= newest and scopes.get(scope_id) is entry:  # live, old
                            push(new_heap, entry)
            elif pids:
                budget -= 1
                pid = pids.pop()
                scopes = by_pid.get(pid)
                if scopes:
                    self._scan_pid = pid
                    pending = self._scan_items = list(scopes.items())
            else:
                self._retired.append(self._heap)
                self._heap = new_heap
                self._next_heap = []
                self._scan_pids = None
                self._maybe_compact()
                return
