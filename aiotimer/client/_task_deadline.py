"""Cancel a task at its block's deadline: the first tier of an ``async with`` block.

The rules are ``asyncio.timeout``'s (CPython ``Lib/asyncio/timeouts.py``), kept exactly:
at the deadline the loop cancels the task and tells the block (which goes from
``active`` to ``expiring``, see :mod:`aiotimer.client._expires`); on leaving the block,
a cancellation that the deadline caused, and that no one else also asked for, becomes
``TimeoutError`` (chained from the ``CancelledError``); any other cancellation, such as
an outer scope's or a caller's ``task.cancel()``, propagates untouched.
``task.cancelling()`` and ``task.uncancel()`` tell the two apart, so nested blocks,
``asyncio.timeout`` and anyio's cancel scopes compose.

How it works: the block is its own deadline. Its ``_entry`` is its deadline (on
``time.monotonic()``) while it is armed, ``None`` once it ended or fired. The armed
blocks of one loop wait under one loop timer armed for the earliest deadline (a timer
that fires before the earliest is due, as uvloop's can by up to a millisecond, only
arms it again: no task is cancelled before its deadline), in two places:

* a **stack** of the blocks armed since the timer last fired: :func:`arm` appends the
  block, :func:`disarm` drops the ended blocks at its top. Blocks mostly end in the
  reverse order they began (one after another, or nested), so a block that starts and
  ends between two firings costs an append and a pop; ended blocks under a live one
  wait for it (the stack is swept when it grows past twice its live size at its last
  sweep + 1000);
* a **heap** (trio's ``Deadlines``, with lazy deletion) of ``(when, n, block)`` for the
  blocks that outlived a firing: the timer, when it fires, moves the stack's live
  blocks into it, cancels the tasks of the live items that are due, drops the ended
  ones it meets, and re-arms for the next live deadline (rebuilt by a firing that
  finds it past twice its live size at its last rebuild + 1000). Both stay within a
  few times the most blocks in flight at once.

A timer handle per block (what ``asyncio.timeout`` does, plus two coroutines) costs ~2 us
with its cancel in asyncio's Python ``call_at``; arming and disarming a block costs a
fraction of that, and makes no object.
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

_heappush = heapq.heappush
_heappop = heapq.heappop
#: The least bound past which a loop's stack or heap is swept of ended blocks.
_SWEEP_FLOOR = 1000


class Deadlined(Protocol):
    """A block with a deadline for its task (an ``async with`` block of two tiers)."""

    #: Names the block in a stack dump (:func:`open_blocks`).
    scope: str
    #: The task to cancel at the deadline.
    _task: asyncio.Task[Any] | None
    #: ``task.cancelling()`` as the block was entered (what :func:`timed_out` compares).
    _cancelling: int
    #: The block's deadline while it is armed; ``None`` once it ended or fired.
    _entry: float | None
    #: Where it waits (set by :func:`arm`).
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
    block._entry = when
    stack = deadlines.stack
    stack.append(block)
    if when < deadlines.armed_at:
        deadlines.arm_timer(when)
    if len(stack) > deadlines.stack_bound:
        deadlines.sweep_stack()


def disarm(block: Deadlined) -> None:
    """The block's body has ended: its deadline can no longer cancel the task (so what
    the block does on its way out, such as a release that has to wait, runs
    uninterrupted)."""
    deadlines = block._deadlines
    if block._entry is None:  # its deadline passed: no longer open
        deadlines.fired.discard(block)
        return
    block._entry = None
    stack = deadlines.stack
    while stack and stack[-1]._entry is None:  # it, and any ended blocks under it
        stack.pop()


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
    by task: every loop's armed blocks and the blocks whose deadline passed. Safe from
    a signal handler: it copies each stack, heap and set in one step."""
    found: dict[asyncio.Task[Any], list[str]] = {}
    for ref in list(_every):
        deadlines = ref()
        if deadlines is None:
            continue
        armed = {id(b): b for b in list(deadlines.stack) if b._entry is not None}
        armed.update((id(i[2]), i[2]) for i in list(deadlines.heap) if i[2]._entry == i[0])
        for block in [*armed.values(), *list(deadlines.fired)]:
            task = block._task
            if task is not None:
                found.setdefault(task, []).append(block.scope)
    return found


class _LoopDeadlines:
    """The armed blocks of one event loop, under one timer armed for the earliest
    deadline (see the module docs)."""

    __slots__ = (
        "__weakref__",
        "_handle",
        "_heap_bound",
        "armed_at",
        "fired",
        "heap",
        "loop",
        "seq",
        "stack",
        "stack_bound",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.stack: list[Deadlined] = []  # armed since the last firing, in that order
        self.stack_bound = _SWEEP_FLOOR
        self.heap: list[tuple[float, int, Deadlined]] = []  # outlived a firing
        self._heap_bound = _SWEEP_FLOOR
        self.seq = itertools.count()  # ties in the heap never compare blocks
        self.fired: set[Deadlined] = set()  # blocks whose deadline passed, still open
        self._handle: asyncio.TimerHandle | None = None
        self.armed_at = math.inf  # when the timer fires

    def sweep_stack(self) -> None:
        """Drop the ended blocks from anywhere in the stack."""
        self.stack = [block for block in self.stack if block._entry is not None]
        self.stack_bound = 2 * len(self.stack) + _SWEEP_FLOOR

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
        heap, seq = self.heap, self.seq
        for block in self.stack:  # the stack's armed blocks wait in the heap from now on
            when = block._entry
            if when is not None:
                _heappush(heap, (when, next(seq), block))
        self.stack.clear()
        # An item is live while its block is armed for its time (a rescheduled block's
        # earlier items are not).
        while heap and (heap[0][2]._entry != heap[0][0] or heap[0][0] <= due):
            when, _, block = _heappop(heap)
            if block._entry == when:
                block._entry = None
                self.fired.add(block)
                task = block._task
                assert task is not None
                task.cancel()
                block._on_deadline()
        if len(heap) > self._heap_bound:
            self.heap = heap = [item for item in heap if item[2]._entry == item[0]]
            heapq.heapify(heap)
            self._heap_bound = 2 * len(heap) + _SWEEP_FLOOR
        if heap:
            self.arm_timer(heap[0][0])


_local = threading.local()  # a thread runs one loop at a time
#: The deadlines of the loop that armed one last (any thread's: each loop has its own).
_recent: _LoopDeadlines | None = None
#: Every loop's deadlines, for :func:`open_blocks` (weakly: a loop's go with its thread);
#: replaced whole under the lock, so a reader copies it in one step.
_every: list[weakref.ref[_LoopDeadlines]] = []
_every_lock = threading.Lock()


def _deadlines_of(loop: asyncio.AbstractEventLoop) -> _LoopDeadlines:
    global _recent, _every
    deadlines: _LoopDeadlines | None = getattr(_local, "deadlines", None)
    if deadlines is None or deadlines.loop is not loop:
        deadlines = _local.deadlines = _LoopDeadlines(loop)
        with _every_lock:  # a new loop in this thread: rare
            _every = [ref for ref in _every if ref() is not None] + [weakref.ref(deadlines)]
    _recent = deadlines
    return deadlines
