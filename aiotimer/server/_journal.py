"""The journal of live timers, so that a restarted server still reaps a hung worker.

Why
---
A client re-sends its open blocks to a new server with its next request, but a hung
worker sends nothing: without a record, a server restarted after a crash would never
reap it. The journal is that record: a small file beside the FIFO naming, per worker,
its earliest live timer that would signal it.

How this works
--------------
The engine tells the journal what happens to timers (:meth:`Journal.acquired`,
:meth:`~Journal.released`, :meth:`~Journal.cleared`): an acquire earlier than a worker's
entry becomes its entry at once; only when the entry's own timer goes is the worker's
earliest timer looked up again, at the next write (one pass over that worker's timers).
The :meth:`Journal.run` task waits until something changed, encodes every entry and
hands the bytes to its writer thread (:mod:`aiotimer.server._journal_writer`: the loop
does not wait for it), which writes a temporary file and renames it over the journal
(:mod:`aiotimer.server._journal_file`, never through a symlink). The task writes once
as it starts (what was restored, or nothing), so that a journal that cannot be written
is said at once; then writes are at least ``interval`` (a second) apart, so a busy
server writes about once a second, an idle one never again. A change within
``interval`` of the last write is written with the first change after the interval, in
the turn of the loop that applies it (a journal write costs the loop no wake-up of its
own), or half an ``interval`` later at the latest. The loop's work per write is
bounded by the number of workers (capped at ``max_workers``).

Each entry carries the worker's start time (its identity) and the deadline on
``CLOCK_MONOTONIC``; the file carries the boot id. :meth:`Journal.load`, at the next
start, drops a journal of another boot, entries of processes that are gone or whose pid
now names another process (a different start time), and returns the rest as requests.
A restored deadline already past is moved ``grace`` seconds ahead, and the engine drops a
worker's restored timers as soon as that worker sends anything: a live client re-sends
the blocks it still has open, so the journal only speaks for workers that stay silent.

Limits: the journal lags the table by up to one and a half ``interval``; a block that
ended in that lag before a crash, or during the downtime, and whose worker then says
nothing until the restored deadline (plus ``grace``) has passed, is reaped as if it had
hung. Only timers that would signal (``signal > 0``) are journaled, and a worker holding
more than :data:`MAX_SCAN` timers drops out when its earliest one goes, until its next
acquire (then journaled by that timer, which may not be its earliest: a later deadline,
never a false one).

Squatting
---------
No other user can switch the journal off (:mod:`aiotimer.server._journal_file`):
whatever another user put at its path (a file, a symlink, a FIFO, in a shared directory
like ``/tmp``) is taken back by the rename, never opened, read, followed or written;
where the kernel refuses that (another user's file in a sticky directory, for a server
that may not override the sticky bit) or a directory is there, the journal goes to a
private directory of this user (said once); a planted journal is never believed. A
server that still cannot journal (neither place can be written, or a full disk) says so
once (one error line, and one when writes work again), and :attr:`Journal.problem` says
why, in ``aiotimer status``; it keeps trying every ``RETRY_INTERVAL``.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import anyio
import anyio.abc
import msgspec

from aiotimer._edges.procfs import boot_id, read_start_time
from aiotimer.core import Timer, TimerTable
from aiotimer.errors import ProcessGoneError
from aiotimer.server._journal_file import JournalFile
from aiotimer.server._journal_writer import JournalWriter
from aiotimer.server._restore import Restored, restore_entries
from aiotimer.wire import Request

__all__ = [
    "JOURNAL_SUFFIX",
    "MAX_SCAN",
    "RETRY_INTERVAL",
    "Journal",
    "JournalKept",
    "journal_path",
]

logger = logging.getLogger("aiotimer")

#: The journal of the FIFO ``P`` is ``P + JOURNAL_SUFFIX``.
JOURNAL_SUFFIX: Final[str] = ".journal"
_FORMAT: Final[str] = "aiotimer-journal-1"
#: A worker with more timers than this is left out of the journal when its earliest
#: timer goes (finding the next one would scan them all in the loop), until its next
#: acquire.
MAX_SCAN: Final[int] = 10_000
#: Bytes per entry a reader accepts at most (an entry is ~150 bytes plus its scope id).
_MAX_ENTRY_BYTES: Final[int] = 1024
#: Seconds between attempts while writing fails (a full disk, a squatted path).
RETRY_INTERVAL: Final[float] = 1.0


def journal_path(
    journal: bool | str | os.PathLike[str] | None,
    fifo: str | os.PathLike[str] | None,
    *,
    default: bool,
) -> Path | None:
    """Where a server keeps its journal: ``journal`` as given (a path, ``True`` for beside
    ``fifo``, ``False`` for none) or, when ``None``, beside ``fifo`` if ``default``.

    Raises:
        ValueError: ``journal=True`` without a ``fifo``.
    """
    if journal is None:
        journal = default and fifo is not None
    if journal is False:
        return None
    if journal is True:
        if fifo is None:
            raise ValueError("journal=True needs a fifo to put the journal beside")
        return Path(f"{os.fspath(fifo)}{JOURNAL_SUFFIX}")
    return Path(journal)


@dataclass(frozen=True, slots=True)
class JournalKept:
    """A journal a planned stop kept for the next server: its ``path`` and how many
    ``workers`` it names."""

    path: str
    workers: int


class _File(msgspec.Struct, frozen=True, kw_only=True):
    """The journal file: one entry per worker, the :class:`~aiotimer.wire.Request` that
    set its earliest signalling timer (:func:`_entry`)."""

    format: str
    boot_id: str | None
    server_pid: int
    entries: list[Request]


class _Read(msgspec.Struct, frozen=True, kw_only=True):
    """The journal file as read: each entry decoded on its own (a bad one is left out,
    not the whole file; :func:`~aiotimer.server._restore.restore_entries`)."""

    format: str
    boot_id: str | None
    server_pid: int
    entries: list[msgspec.Raw]


_decoder: Final = msgspec.json.Decoder(_Read)
_encode: Final = msgspec.json.Encoder().encode


def _entry(timer: Timer, start_time: int | None, mono_to_wall: float) -> Request:
    """The journal's entry for ``timer``: the request that set it, with its deadline on
    both clocks as the timer has it and the worker's start time (its identity)."""
    request = timer.request
    if request is None:  # a timer built by hand: no extension keys
        request = Request(timer.pid, timer.scope_id, 0.0, timer.signal)
    return msgspec.structs.replace(
        request,
        mono=timer.deadline,
        expiration_time=timer.deadline + mono_to_wall,
        start_time=start_time,
    )


class Journal:
    """The journal file ``path`` of one server (see the module docs).

    Args:
        path: the file (mode 0600; whatever else is there is replaced, see the module
            docs).
        interval: the least time between two writes, in seconds.
        max_workers: the most workers journaled; more are left out (and reported once).
        grace: seconds a restored deadline that has already passed is moved ahead.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        interval: float = 1.0,
        max_workers: int = 65536,
        grace: float = 1.0,
    ) -> None:
        self._file = JournalFile(Path(path))
        self._interval = interval
        self._max_workers = max_workers
        self._grace = grace
        self._entries: dict[int, Request] = {}
        self._start_times: dict[int, int | None] = {}
        self._earliest: dict[int, Timer] = {}  # new earliest timers, not yet written
        self._recompute: set[int] = set()  # workers whose earliest timer must be looked up
        self._wakeup = anyio.Event()
        self._dirty = False  # changed since the last write
        self._due = -math.inf  # monotonic: when the next write may come
        self._omitted_reported = False
        self._writer: JournalWriter | None = None
        #: Workers left out because ``max_workers`` were journaled already.
        self.omitted = 0

    # -- the engine's side -----------------------------------------------------------

    def acquired(self, timer: Timer) -> None:
        """``timer`` was set (new or replacing one of the same key)."""
        pid = timer.pid
        if pid in self._recompute:
            return  # the next write looks the worker's earliest timer up anyway
        entry, pending = self._entries.get(pid), self._earliest.get(pid)
        if (entry is not None and entry.scope_id == timer.scope_id) or (
            pending is not None and pending.scope_id == timer.scope_id
        ):
            self._earliest.pop(pid, None)  # the earliest timer moved: look it up again
            self._recompute.add(pid)
        elif timer.signal > 0:
            best = math.inf if entry is None or entry.mono is None else entry.mono
            if pending is not None:
                best = pending.deadline
            if timer.deadline >= best:
                return
            self._earliest[pid] = timer
        else:
            return
        self._changed()

    def released(self, pid: int, scope_id: str) -> None:
        """The timer ``(pid, scope_id)`` is gone (released or expired)."""
        entry = self._entries.get(pid)
        earliest = self._earliest.get(pid)
        if (entry is not None and entry.scope_id == scope_id) or (
            earliest is not None and earliest.scope_id == scope_id
        ):
            self._earliest.pop(pid, None)
            self._recompute.add(pid)
            self._changed()

    def cleared(self, pid: int) -> None:
        """Every timer of worker ``pid`` is gone."""
        self._earliest.pop(pid, None)
        self._recompute.discard(pid)
        if self._entries.pop(pid, None) is not None:
            self._changed()

    def _changed(self) -> None:
        """What the journal holds changed: written now if the last write is at least
        ``interval`` old (this turn of the loop, no wake-up of its own), else at the
        first change after that, or half an ``interval`` later at the latest."""
        if not self._dirty or time.monotonic() >= self._due:
            self._wakeup.set()  # the first change since the last write sets the backstop
        self._dirty = True

    def forget(self, pid: int) -> None:
        """Worker ``pid`` is gone: drop its entry and its remembered start time."""
        self._start_times.pop(pid, None)
        self.cleared(pid)

    @property
    def path(self) -> Path:
        """Where the journal is now: the path given, or its fallback (module docs)."""
        return self._file.where

    @property
    def problem(self) -> str | None:
        """Why the journal cannot be written now (``None``: the last write worked, or no
        write was tried yet)."""
        return None if self._writer is None else self._writer.problem

    # -- restoring -------------------------------------------------------------------

    def load(self, mono_now: float) -> Restored:
        """The requests that restore the journaled timers still valid (see module docs):
        each entry checked with the wire's validator, at most one per worker (its
        earliest), and only for a process that is still the journaled one. Costs one
        ``/proc`` read per distinct pid, whatever the file's size. Blocking: call it in a
        worker thread.

        Never raises: an unreadable or malformed journal is reported and ignored.
        """
        data = self._read()
        if data is None:
            return Restored()
        try:
            journal = _decoder.decode(data)
        except msgspec.DecodeError as exc:
            logger.error("journal %s is malformed (%s); ignored", self.path, exc)
            return Restored()
        if journal.format != _FORMAT or journal.boot_id != boot_id() or boot_id() is None:
            logger.warning("journal %s is of another boot or format; ignored", self.path)
            return Restored()
        return restore_entries(journal.entries, mono_now, self._grace)

    def _read(self) -> bytes | None:
        return self._file.read(4096 + self._max_workers * _MAX_ENTRY_BYTES)

    # -- writing ---------------------------------------------------------------------

    async def run(
        self,
        table: TimerTable,
        mono_to_wall: Callable[[], float],
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Write the journal now, then whenever timers changed, at most every ``interval``
        seconds.

        ``mono_to_wall()`` is the offset from the server's monotonic clock to epoch time.
        """
        writer = JournalWriter(self._file.path, self._file.write, retry=RETRY_INTERVAL)
        self._writer = writer
        # The first write (what was restored, or nothing) does not count against the
        # interval: the first change is written at once all the same.
        self._dirty = False
        self._update(table, mono_to_wall())
        writer.offer(self._encode())
        task_status.started()
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup = anyio.Event()
                if not self._dirty:
                    continue
                if self._due > time.monotonic():  # changed too soon after the last write
                    with anyio.move_on_after(self._due + self._interval / 2 - time.monotonic()):
                        while time.monotonic() < self._due:
                            await self._wakeup.wait()
                            self._wakeup = anyio.Event()
                self._dirty = False
                self._due = time.monotonic() + self._interval
                self._update(table, mono_to_wall())
                writer.offer(self._encode())
        finally:
            writer.close()

    def _update(self, table: TimerTable, mono_to_wall: float) -> None:
        earliest, self._earliest = self._earliest, {}
        for pid in self._recompute:  # O(timers of the worker), only when its earliest went
            if table.worker_size(pid) > MAX_SCAN:
                self._entries.pop(pid, None)  # too many to scan in the loop: left out
                continue
            timer = _earliest_signalling(table.worker_timers(pid))
            if timer is None:
                self._entries.pop(pid, None)
            else:
                earliest[pid] = timer
        self._recompute = set()
        for pid, timer in earliest.items():
            if pid not in self._entries and len(self._entries) >= self._max_workers:
                self.omitted += 1
                if not self._omitted_reported:
                    self._omitted_reported = True
                    logger.warning(
                        "journal %s holds %d workers, its maximum; others are left out",
                        self.path,
                        self._max_workers,
                    )
                continue
            if pid not in self._start_times:
                self._start_times[pid] = _start_time(pid)
            self._entries[pid] = _entry(timer, self._start_times[pid], mono_to_wall)

    def _encode(self) -> bytes:
        body = _File(
            format=_FORMAT,
            boot_id=boot_id(),
            server_pid=os.getpid(),
            entries=list(self._entries.values()),
        )
        return _encode(body)

    def keep(self, table: TimerTable, mono_to_wall: float) -> int:
        """Write the journal complete, now, from ``table`` (a planned stop with live
        timers: the next server on the FIFO restores them); return how many workers it
        names. Every worker's earliest signalling timer is looked up, however many
        timers it holds (the run is over: no loop to keep responsive). Blocking.

        Raises:
            OSError: it cannot be written (the last periodic write is left in place).
        """
        self._earliest, self._recompute, self._entries = {}, set(), {}
        for pid in list(table.workers()):
            timer = _earliest_signalling(table.worker_timers(pid))
            if timer is not None:
                self._earliest[pid] = timer
        self._update(table, mono_to_wall)
        self._file.write(self._encode())
        return len(self._entries)

    def remove(self) -> None:
        """Delete the journal file (a server that stops on purpose with no live timer);
        something else in its place is reported and left alone."""
        try:
            self._file.remove()
        except OSError as exc:
            logger.error("cannot remove journal %s (%s)", self.path, exc)


def _earliest_signalling(timers: Iterable[Timer]) -> Timer | None:
    best: Timer | None = None
    for timer in timers:
        if timer.signal > 0 and (best is None or timer.deadline < best.deadline):
            best = timer
    return best


def _start_time(pid: int) -> int | None:
    try:
        return read_start_time(pid)
    except ProcessGoneError:
        return None
