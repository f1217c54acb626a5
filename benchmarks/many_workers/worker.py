"""What runs in each forked worker process, and the shared slots it reports through.

A worker runs its slot's blocks open loop: each acquire is sent at its planned start
(never later than half the timeout past it: a block that late is skipped and counted)
with its *planned* deadline, so how late the worker itself runs never moves a deadline.
Releases go out at planned times too; blocks overlap freely. At a hanging block the
worker first releases its other open blocks (their deadlines would come first), marks
the hang in its slot, sends the acquire and sleeps until it is reaped.

Observing the reap: the workers ask to be reaped with ``SIGTERM`` (catchable; torch's
``LocalTimerServer`` can only ``SIGKILL``). A worker keeps ``SIGTERM`` blocked for its
whole life and does all its waiting in ``sigtimedwait``/``sigwaitinfo``, which return
at once for a signal already pending; in a hanging block it waits at a real-time
priority where permitted (:func:`~benchmarks._util.wake_first`). On the signal it
stores ``time.monotonic()`` (``CLOCK_MONOTONIC``, one clock for every process on the
host) in the slot and exits; the parent sees the exit through a pidfd. Not a Python
signal handler: CPython runs one only when its interpreter loop next checks for
signals, so a ``SIGTERM`` that
lands between that check and the ``clock_nanosleep`` of ``time.sleep`` is taken by
the C-level handler (no longer pending) and its Python handler waits until the sleep
ends. An ingest probe is signalled microseconds after its acquire is written, right
in that gap: the worker then slept on for an hour, a "missed" reap the server was
not to blame for. A slot is a row of doubles in a shared file mapping (under
``/dev/shm`` when there is one), written only by its worker while it lives and by the
parent between workers.
"""

from __future__ import annotations

import heapq
import math
import mmap
import os
import signal
import time
from collections.abc import Callable
from typing import Protocol

from benchmarks._util import wake_first, woken
from benchmarks.many_workers.plan import Block

__all__ = ["REAP_SIGNAL", "Sender", "Slots", "run_worker"]

#: The signal workers ask to be reaped with.
REAP_SIGNAL = signal.SIGTERM

# Fields of a slot (doubles).
SIGNAL_TIME = 0  # monotonic time the reap signal arrived (nan: none)
SIGNUM = 1
HANG_DEADLINE = 2  # deadline of the hanging block the worker sits in (nan: none)
HANG_PROBE = 3  # 1.0 when that hang is an ingest probe
HANG_BLOCK = 4  # its index in the slot's plan (-1: none)
MIN_OPEN_DEADLINE = 5  # earliest deadline of a block not yet released (inf: none)
REQUESTS = 6  # requests sent
FAILED = 7  # requests whose write failed
DONE = 8  # 1.0 once the worker finished its blocks
READY = 9  # 1.0 once the worker's client is set up
SKIPPED = 10  # blocks skipped because the worker reached them too late
LATE = 11  # releases the worker itself sent after their deadline
CRASHED = 12  # 1.0 when the worker died of an exception (traceback on stderr)
REALTIME = 13  # 1.0 when the worker waited for its reap at a real-time priority
NEXT_BLOCK = 14  # index in the slot's plan of the first block the worker has not reached
SKIPPED_HANGS = 15  # hanging blocks among SKIPPED
FIELDS = 16
_HEADER = FIELDS  # the first row holds the run's start time (T0)
T0 = 0


class Slots:
    """Shared rows of doubles, one per worker slot, plus a header row, in the file
    ``path`` (created and initialised when ``count`` is given, else opened)."""

    def __init__(self, path: str, count: int | None = None) -> None:
        if count is not None:
            with open(path, "wb") as f:
                f.truncate(8 * FIELDS * (count + 1))
        with open(path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), 0)
        self._cells = memoryview(self._map).cast("d")
        self.path = path
        self.count = len(self._cells) // FIELDS - 1
        if count is not None:
            for slot in range(count):
                self.reset(slot)
            self._cells[T0] = math.nan

    def reset(self, slot: int) -> None:
        """Clear ``slot`` for a new worker (the parent, with no worker in it)."""
        base = _HEADER + slot * FIELDS
        for field in range(FIELDS):
            self._cells[base + field] = 0.0
        self._cells[base + SIGNAL_TIME] = math.nan
        self._cells[base + HANG_DEADLINE] = math.nan
        self._cells[base + HANG_BLOCK] = -1.0
        self._cells[base + MIN_OPEN_DEADLINE] = math.inf

    def get(self, slot: int, field: int) -> float:
        return self._cells[_HEADER + slot * FIELDS + field]

    def set(self, slot: int, field: int, value: float) -> None:
        self._cells[_HEADER + slot * FIELDS + field] = value

    def add(self, slot: int, field: int, value: float = 1.0) -> None:
        self._cells[_HEADER + slot * FIELDS + field] += value

    @property
    def t0(self) -> float:
        """The run's start on ``time.monotonic()`` (nan until the parent sets it)."""
        return self._cells[T0]

    @t0.setter
    def t0(self, value: float) -> None:
        self._cells[T0] = value


class Sender(Protocol):
    """A server's own client, reduced to what a worker does with it. Each method
    returns False when the request could not be written (the worker goes on)."""

    def acquire(self, scope: str, deadline: float) -> bool: ...

    def release(self, scope: str) -> bool: ...

    def finish(self) -> None:
        """Flush what is still buffered before the worker exits."""


def _reaped(slots: Slots, slot: int, signum: int) -> None:
    slots.set(slot, SIGNAL_TIME, time.monotonic())
    slots.set(slot, SIGNUM, signum)
    woken()  # the exit itself need not run first
    os._exit(0)


def _sleep_until(slots: Slots, slot: int, when: float | None) -> None:
    """Sleep until ``when`` (None: for ever), or exit as reaped when the (blocked) reap
    signal is or becomes pending before then."""
    info: signal.struct_siginfo | None
    if when is None:
        info = signal.sigwaitinfo({REAP_SIGNAL})
    else:
        info = signal.sigtimedwait({REAP_SIGNAL}, max(when - time.monotonic(), 0.0))
    if info is not None:
        _reaped(slots, slot, info.si_signo)


def run_worker(
    slots: Slots,
    *,
    slot: int,
    blocks: list[Block],
    first: int,
    timeout: float,
    make_sender: Callable[[], Sender],
    go_fd: int,
) -> None:
    """The worker's whole life (in the forked child); returns when its blocks are done.

    ``go_fd``: read until EOF before starting (the parent closes its end once every
    worker is ready); -1 for a replacement worker, which starts at once.
    """

    # Blocked, a reap signal stays pending until a wait below takes it (see the top).
    signal.pthread_sigmask(signal.SIG_BLOCK, {REAP_SIGNAL})
    sender = make_sender()
    slots.set(slot, READY, 1.0)
    if go_fd >= 0:
        while os.read(go_fd, 1):
            pass
        os.close(go_fd)
    t0 = slots.t0
    slots.set(slot, NEXT_BLOCK, first)
    # (when, order, block index): releases (order 0) before acquires (order 1).
    events = [(t0 + blocks[k].start, 1, k) for k in range(first, len(blocks))]
    heapq.heapify(events)
    open_deadlines: dict[int, float] = {}

    def sent(ok: bool) -> bool:
        slots.add(slot, REQUESTS)
        if not ok:
            slots.add(slot, FAILED)
        return ok

    def release(k: int) -> None:
        # A release sent in time no longer counts as open when a kill is judged; one
        # sent late stays open for good (a kill after its deadline is then deserved).
        if time.monotonic() < open_deadlines[k]:
            del open_deadlines[k]
        else:
            slots.add(slot, LATE)
            open_deadlines[k] = -math.inf
        slots.set(slot, MIN_OPEN_DEADLINE, min(open_deadlines.values(), default=math.inf))
        sent(sender.release(f"b{k}"))

    while events:
        when, order, k = heapq.heappop(events)
        _sleep_until(slots, slot, when)
        block = blocks[k]
        if order == 0:
            release(k)
            continue
        if time.monotonic() > t0 + block.start + timeout / 2:
            slots.add(slot, SKIPPED)
            slots.add(slot, SKIPPED_HANGS, block.hang)
            slots.set(slot, NEXT_BLOCK, k + 1)
            continue
        if block.hang:
            for j in [j for j, d in open_deadlines.items() if d > -math.inf]:
                release(j)
            deadline = time.monotonic() if block.probe else t0 + block.start + timeout
            slots.set(slot, HANG_PROBE, 1.0 if block.probe else 0.0)
            slots.set(slot, HANG_BLOCK, k)
            slots.set(slot, HANG_DEADLINE, deadline)
            slots.set(slot, NEXT_BLOCK, k + 1)
            sent(sender.acquire(f"b{k}", deadline))
            # Only now: a client may retry or wait for room, never at real-time priority.
            slots.set(slot, REALTIME, 1.0 if wake_first() else 0.0)
            while True:  # hung: only a reap ends this
                _sleep_until(slots, slot, None)
        slots.set(slot, NEXT_BLOCK, k + 1)
        deadline = t0 + block.start + timeout
        open_deadlines[k] = deadline
        slots.set(slot, MIN_OPEN_DEADLINE, min(open_deadlines.values()))
        if sent(sender.acquire(f"b{k}", deadline)):
            heapq.heappush(events, (t0 + block.start + block.work, 0, k))
        else:  # not delivered: the server holds no timer for it, nothing to release
            del open_deadlines[k]
            slots.set(slot, MIN_OPEN_DEADLINE, min(open_deadlines.values(), default=math.inf))
    sender.finish()
    _sleep_until(slots, slot, 0.0)  # a signal that came during the last blocks counts
    slots.set(slot, DONE, 1.0)
