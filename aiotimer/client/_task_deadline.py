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
only arms it again: no task is cancelled before its deadline). The block is its own
deadline: :func:`arm` pushes a heap item ``(when, n, block)`` and keeps it as the
block's ``_entry``; an item is live while it is its block's ``_entry``, so
:func:`disarm` (the block's body ended) or a later :func:`arm` (a new deadline) kill it
by replacing that, and the ended items at the head of the heap are dropped at once
(blocks mostly end in the order they began). The timer, when it fires, cancels the
tasks of the live items that are due, drops the ended ones it meets, and re-arms for
the next live deadline. The heap is rebuilt when ended items outnumber live ones (more
than ``2 * live + 1000``), so its size stays proportional to the blocks in flight. A
timer handle per block (what ``asyncio.timeout`` does, plus two coroutines) costs ~2 us
with its cancel in asyncio's Python ``call_at``; an item costs a fraction of that, and
no object is made for it but the tuple.
"""

from __future__ import annotations

import heapq
import itertools
import math
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import asyncio

__all__ = ["Deadlined", "arm", "disarm", "open_blocks", "timed_out"]

#: A deadline in a loop's heap: (when, a tie-breaker, the block).
_Item = tuple[float, int, "Deadlined"]
_heappush = heapq.heappush
_heappop = heapq.heappop


class Deadlined(Protocol):
    """A block with a deadline for its task (an ``async with`` block of two tiers)."""

    #: Names the block in a stack dump (:func:`open_blocks`).
    scope: str
    #: The task to cancel at the deadline.
    _task: asyncio.Task[Any] | None
    #: ``task.cancelling()`` as the block was entered (what :func:`timed_out` compares).
    _cancelling: int
    #: The block's live item in its loop's heap; ``None`` once stopped or fired.
    _entry: _Item | None
    #: The heap it is in.
    _deadlines: _LoopDeadlines

    def _on_deadline(self) -> None:
        """The deadline passed: the block's task has just been cancelled."""


def arm(block: Deadlined, when: float) -> None:
    """Cancel ``block._task`` at ``when`` (``time.monotonic()``), never before, unless
    :func:`disarm` comes first; then tell ``block``. A block armed again (rescheduled)
    keeps only its new deadline."""
    task = block._task
    assert task is not None
    loop = task.get_loop()
    deadlines = _recent
    if deadlines is None or deadlines.loop is not loop:
        deadlines = _deadlines_of(loop)
    block._deadlines = deadlines
    if block._entry is not None:  # rescheduled: the old deadline no longer counts
        block._entry = None
        deadlines.discard()
    item = block._entry = (when, next(deadlines.seq), block)
    _heappush(deadlines.heap, item)
    deadlines.live += 1
    if when < deadlines.armed_at:
        deadlines.arm_timer(when)


def disarm(block: Deadlined) -> None:
    """The block's body has ended: its deadline can no longer cancel the task (so what
    the block does on its way out, such as a release that has to wait, runs
    uninterrupted)."""
    if block._entry is not None:
        block._entry = None
        block._deadlines.discard()
    else:  # its deadline passed: no longer open
        block._deadlines.fired.discard(block)


def timed_out(
    block: Deadlined, exc_type: type[BaseException] | None, exc: BaseException | None
) -> None:
    """The block, whose deadline passed, ends with ``exc`` (after :func:`disarm`): raise
    ``TimeoutError`` if the deadline's cancellation is what ends it."""
    task = block._task
    assert task is not None
    if (
        task.uncancel() <= block._cancelling
        # asyncio is loaded (a task exists); this module does not import it, so a
        # worker that never runs a loop never loads it.
        and exc_type is sys.modules["asyncio"].CancelledError
    ):
        raise TimeoutError from exc


def open_blocks() -> dict[asyncio.Task[Any], list[str]]:
    """The scope ids of the ``async with`` blocks open now (with a cancellation tier),
    by task: the live items of every loop's heap and the blocks whose deadline passed.
    Safe from a signal handler: it copies each heap and set in one step."""
    found: dict[asyncio.Task[Any], list[str]] = {}
    for ref in list(_every):
        deadlines = ref()
        if deadlines is None:
            continue
        live = [item[2] for item in list(deadlines.heap) if item[2]._entry is item]
        for block in live + list(deadlines.fired):
            task = block._task
            if task is not None:
                found.setdefault(task, []).append(block.scope)
    return found


class _LoopDeadlines:
    """The pending deadlines of one event loop, under one timer armed for the earliest
    (:func:`arm` adds to it)."""

    __slots__ = (
        "__weakref__",
        "_dead",
        "_handle",
        "armed_at",
        "fired",
        "heap",
        "live",
        "loop",
        "seq",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.heap: list[_Item] = []
        self.seq = itertools.count()
        self.live = 0  # items in the heap that are their block's entry
        self._dead = 0  # items in the heap that are not (lazy deletion)
        self._handle: asyncio.TimerHandle | None = None
        self.armed_at = math.inf  # when the timer fires
        self.fired: set[Deadlined] = set()  # blocks whose deadline passed, still open

    def discard(self) -> None:
        """One block's item ended (it is no longer its block's entry): count it, drop
        the ended items at the head of the heap, compact if due."""
        self.live -= 1
        self._dead += 1
        heap = self.heap
        while heap and heap[0][2]._entry is not heap[0]:  # ended first, as blocks mostly do
            _heappop(heap)
            self._dead -= 1
        if self._dead > 2 * self.live + 1000:
            self.heap = [item for item in self.heap if item[2]._entry is item]
            heapq.heapify(self.heap)
            self._dead = 0

    def arm_timer(self, when: float) -> None:
        """Fire at ``when`` (``time.monotonic()``) instead."""
        if self._handle is not None:
            self._handle.cancel()
        loop = self.loop
        self._handle = loop.call_at(loop.time() + (when - time.monotonic()), self._fire)
        self.armed_at = when

    def _fire(self) -> None:
        # A loop may run a timer early: by its clock's resolution (asyncio), or as
        # uvloop, whose time is cached per iteration and in whole milliseconds. What is
        # not due yet on the monotonic clock waits: the timer is armed again for it.
        due = time.monotonic()
        self._handle, self.armed_at = None, math.inf
        heap = self.heap
        while heap and (heap[0][2]._entry is not heap[0] or heap[0][0] <= due):
            item = _heappop(heap)
            block = item[2]
            if block._entry is not item:
                self._dead -= 1
            else:
                self.live -= 1
                block._entry = None
                self.fired.add(block)
                task = block._task
                assert task is not None
                task.cancel()
                block._on_deadline()
        if heap:
            self.arm_timer(heap[0][0])


_local = threading.local()  # a thread runs one loop at a time
#: The deadlines of the loop that armed one last (any thread's: each loop has its own).
_recent: _LoopDeadlines | None = None


#: Every loop's deadlines, for :func:`open_blocks` (weakly: a loop's go with its thread).
_every: list[weakref.ref[_LoopDeadlines]] = []


def _deadlines_of(loop: asyncio.AbstractEventLoop) -> _LoopDeadlines:
    global _recent
    deadlines: _LoopDeadlines | None = getattr(_local, "deadlines", None)
    if deadlines is None or deadlines.loop is not loop:
        deadlines = _local.deadlines = _LoopDeadlines(loop)
        _every[:] = [ref for ref in _every if ref() is not None] + [weakref.ref(deadlines)]
    _recent = deadlines
    return deadlines
