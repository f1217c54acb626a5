"""Cancel a task at its block's deadline: the first tier of an ``async with`` block.

The rules are ``asyncio.timeout``'s (CPython ``Lib/asyncio/timeouts.py``), kept exactly:
at the deadline the loop cancels the task and tells the block (which goes from
``active`` to ``expiring``, see :mod:`aiotimer.client._expires`); on leaving the block,
a cancellation that the deadline caused, and that no one else also asked for, becomes
``TimeoutError`` (chained from the ``CancelledError``); any other cancellation, such as
an outer scope's or a caller's ``task.cancel()``, propagates untouched.
``task.cancelling()`` and ``task.uncancel()`` tell the two apart, so nested blocks,
``asyncio.timeout`` and anyio's cancel scopes compose.

How it works: the deadlines of one loop (on ``time.monotonic()``) live in one heap with
lazy deletion (trio's ``Deadlines``), under one loop timer armed for the earliest (a
timer that fires before the earliest is due, as uvloop's can by up to a millisecond,
only arms it again: no task is cancelled before its deadline): a block adds an entry (a
heap push) and marks it done when its body ends (the done entries at the head of the
heap are dropped then: blocks mostly end in the order they began); the timer, when it
fires, cancels the tasks of the live entries that are due, drops the done ones it
meets, and re-arms for the next live deadline. The heap is rebuilt when done entries
outnumber live ones (more than ``2 * live + 1000``), so its size stays proportional to
the blocks in flight. A
timer handle per block (what ``asyncio.timeout`` does, plus two coroutines) costs ~2 us
with its cancel in asyncio's Python ``call_at``; an entry costs a fraction of that.
"""

from __future__ import annotations

import heapq
import itertools
import math
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import asyncio

__all__ = ["Deadlined", "TaskDeadline", "open_blocks"]

#: Every block between entry and :meth:`TaskDeadline.stop`, in any thread: what a stack
#: dump lists per task (a set: ~0.3 us per block to add and discard, no weak references).
_open: set[TaskDeadline] = set()


class Deadlined(Protocol):
    """The block a :class:`TaskDeadline` belongs to."""

    #: Names the block in a stack dump (:func:`open_blocks`).
    scope: str

    def _on_deadline(self) -> None:
        """The deadline passed: the block's task has just been cancelled."""


class TaskDeadline:
    """Cancel ``task`` at ``when`` (``time.monotonic()``), never before, unless
    :meth:`stop` comes first, and then tell ``block``. ``cancelling`` is
    ``task.cancelling()`` as the block was entered (what :meth:`timed_out` compares
    with)."""

    __slots__ = ("_block", "_cancelling", "_deadlines", "_done", "_task", "when")

    def __init__(
        self, task: asyncio.Task[Any], when: float, block: Deadlined, cancelling: int
    ) -> None:
        self._task = task
        self._block = block
        self.when = when
        self._cancelling = cancelling
        self._done = False  # out of the running: stopped, or fired
        self._deadlines = _deadlines_of(task.get_loop())
        self._deadlines.add(self)
        _open.add(self)

    def _expire(self) -> None:
        self._done = True
        self._task.cancel()
        self._block._on_deadline()

    def stop(self) -> None:
        """The block's body has ended: the deadline can no longer cancel the task (so
        what the block does on its way out, such as a release that has to wait, runs
        uninterrupted)."""
        _open.discard(self)
        if not self._done:
            self._done = True
            self._deadlines.discard()

    def moved(self, when: float) -> TaskDeadline:
        """This deadline moved to ``when``: stopped, and a new one for the same task and
        block returned."""
        self.stop()
        return TaskDeadline(self._task, when, self._block, self._cancelling)

    def timed_out(self, exc_type: type[BaseException] | None, exc: BaseException | None) -> None:
        """The block, whose deadline passed, ends with ``exc`` (after :meth:`stop`):
        raise ``TimeoutError`` if the deadline's cancellation is what ends it."""
        if (
            self._task.uncancel() <= self._cancelling
            # asyncio is loaded (a task exists); this module does not import it, so a
            # worker that never runs a loop never loads it.
            and exc_type is sys.modules["asyncio"].CancelledError
        ):
            raise TimeoutError from exc


def open_blocks() -> dict[asyncio.Task[Any], list[str]]:
    """The scope ids of the ``async with`` blocks open now (with a cancellation tier),
    by task. Safe from a signal handler: it copies the set in one step."""
    found: dict[asyncio.Task[Any], list[str]] = {}
    for deadline in list(_open):
        found.setdefault(deadline._task, []).append(deadline._block.scope)
    return found


class _LoopDeadlines:
    """The pending deadlines of one event loop, under one timer armed for the earliest."""

    __slots__ = ("_armed_at", "_dead", "_handle", "_heap", "_live", "_seq", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._heap: list[tuple[float, int, TaskDeadline]] = []
        self._seq = itertools.count()
        self._live = 0  # entries in the heap whose block is still running
        self._dead = 0  # entries in the heap whose block ended (lazy deletion)
        self._handle: asyncio.TimerHandle | None = None
        self._armed_at = math.inf

    def add(self, entry: TaskDeadline) -> None:
        heapq.heappush(self._heap, (entry.when, next(self._seq), entry))
        self._live += 1
        if entry.when < self._armed_at:
            self._arm(entry.when)

    def discard(self) -> None:
        """One entry's block ended (the entry is marked done): count it, drop the ended
        entries at the head of the heap, compact if due."""
        self._live -= 1
        self._dead += 1
        heap = self._heap
        while heap and heap[0][2]._done:  # ended first, as blocks mostly do: dropped now
            heapq.heappop(heap)
            self._dead -= 1
        if self._dead > 2 * self._live + 1000:
            self._heap = [item for item in self._heap if not item[2]._done]
            heapq.heapify(self._heap)
            self._dead = 0

    def _arm(self, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        loop = self.loop
        self._handle = loop.call_at(loop.time() + (when - time.monotonic()), self._fire)
        self._armed_at = when

    def _fire(self) -> None:
        # A loop may run a timer early: by its clock's resolution (asyncio), or as
        # uvloop, whose time is cached per iteration and in whole milliseconds. What is
        # not due yet on the monotonic clock waits: the timer is armed again for it.
        due = time.monotonic()
        self._handle, self._armed_at = None, math.inf
        heap = self._heap
        while heap and (heap[0][2]._done or heap[0][0] <= due):
            _, _, entry = heapq.heappop(heap)
            if entry._done:
                self._dead -= 1
            else:
                self._live -= 1
                entry._expire()
        if heap:
            self._arm(heap[0][0])


_local = threading.local()  # a thread runs one loop at a time


def _deadlines_of(loop: asyncio.AbstractEventLoop) -> _LoopDeadlines:
    deadlines: _LoopDeadlines | None = getattr(_local, "deadlines", None)
    if deadlines is None or deadlines.loop is not loop:
        deadlines = _local.deadlines = _LoopDeadlines(loop)
    return deadlines
