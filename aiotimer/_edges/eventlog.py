"""The JSON-lines event log: one JSON object per event, appended by one writer task.

How this works
--------------
The loop never waits for the disk. :meth:`EventLog.put` appends the event to an
in-memory queue and returns; the :meth:`EventLog.run` task encodes what is queued, in
slices of :data:`MAX_BATCH` events, and writes each slice with one unbuffered append in
a worker thread (``aiofiles``), so a slow or hung disk holds up only the log. The file
is opened through :func:`~aiotimer._edges.files.open_owned_append`: a symlink, a FIFO,
a device or another user's file in its place is refused at start, never written to or
waited on.

Bounded noise, unbounded audit: events that outsiders can cause at any rate
(:data:`NOISE`: rejected input, unknown workers, refused control connections, timers
evicted from a full table, per-request events) take at most ``max_queued`` places in
the queue, and all but the per-request events at most ``max_noise_rate`` per second;
past that they are dropped and counted (:attr:`EventLog.dropped`), and each second
that dropped some is followed by an :class:`~aiotimer.events.EventsLost` record saying
how many. Every other event
(expiries, reaps, failed reaps, stops) is an audit record and is always queued,
whatever the noise.

A write error (a full disk, a read-only remount, an I/O error) never stops the server:
the log reports it once on the ``aiotimer`` logger (ERROR), counts the events of the
failed write and every event put while it is failing as lost
(:attr:`EventLog.lost`), and tries again every :data:`RETRY_INTERVAL` seconds. The first
write that succeeds starts with an :class:`~aiotimer.events.EventsLost` record saying how
many events are missing and why. A line cut short by the failure is ended before that
record, so every complete line stays valid JSON.

:meth:`EventLog.close` ends the queue; ``run`` then writes what is left and returns.
"""

from __future__ import annotations

import collections
import errno
import functools
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable
from typing import Final

import aiofiles
import anyio
import anyio.abc
import msgspec

from aiotimer._edges.files import open_owned_append
from aiotimer.errors import EventLogError, UnsafePathError
from aiotimer.events import (
    ControlRefused,
    Event,
    EventsLost,
    RequestRejected,
    TimerAcquired,
    TimerEvicted,
    TimerReleased,
    WorkerUnknown,
)

__all__ = ["MAX_BATCH", "NOISE", "RETRY_INTERVAL", "EventLog"]

logger = logging.getLogger("aiotimer")

_encode = msgspec.json.Encoder().encode

#: Event classes that are bounded in the log (dropped and counted when too many queue).
NOISE: Final[tuple[type[Event], ...]] = (
    RequestRejected,
    WorkerUnknown,
    ControlRefused,
    TimerEvicted,
    TimerAcquired,
    TimerReleased,
)
#: Noise whose rate is bounded too (a flood of garbage must not keep the log busy).
_FLOOD: Final[tuple[type[Event], ...]] = (
    RequestRejected,
    WorkerUnknown,
    ControlRefused,
    TimerEvicted,
)
#: The most events encoded and written in one go (bounds the loop's work per slice).
MAX_BATCH: Final[int] = 512
_NEWLINE: Final[int] = ord("\n")
#: Seconds between attempts to write again after a write error.
RETRY_INTERVAL: Final[float] = 5.0


class EventLog:
    """Appends events to ``path`` as JSON lines without ever blocking the caller.

    Args:
        path: the file (opened for appending, created with mode 0644 minus umask); it
            must be a regular file of this user if it exists.
        max_queued: the most noise events (see :data:`NOISE`) waiting to be written.
        max_noise_rate: the most rejected-input, unknown-worker, refused-connection and
            evicted-timer events logged per second.
        retry_interval: seconds between attempts to write after a write error.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_queued: int = 10_000,
        max_noise_rate: int = 1000,
        retry_interval: float = RETRY_INTERVAL,
    ) -> None:
        self.path = os.fspath(path)
        #: Noise events dropped (``max_queued`` waiting, or over ``max_noise_rate``).
        self.dropped = 0
        #: Events lost to write errors (reported in the file once writing works again).
        self.lost = 0
        self._max_noise = max_queued
        self._max_rate = max_noise_rate
        self._second = -math.inf  # when the current one-second window of noise began
        self._in_second = 0  # rate-bounded noise queued in that window
        self._dropped_in_second = 0
        self._retry_interval = retry_interval
        self._queue: collections.deque[Event] = collections.deque()
        self._noise = 0  # noise events in the queue
        self._wakeup = anyio.Event()
        self._closed = False
        self._failure: str | None = None  # the error writing fails with, while it does
        self._retry_at = 0.0  # monotonic time of the next attempt while failing
        self._unreported = 0  # events lost since the last EventsLost record
        self._partial = False  # the last write ended mid-line

    def put(self, event: Event) -> None:
        """Queue ``event`` for writing (never blocks; see the module docs for drops)."""
        if self._closed:
            return  # the server is stopping and the log is being flushed
        if self._failure is not None and time.monotonic() < self._retry_at:
            self._lose(1)
            return
        if isinstance(event, NOISE):
            if isinstance(event, _FLOOD):
                now = time.monotonic()
                if now - self._second >= 1.0:
                    self._report_drops()
                    self._second, self._in_second = now, 0
                if self._in_second >= self._max_rate:
                    self.dropped += 1
                    self._dropped_in_second += 1
                    return
                self._in_second += 1
            if self._noise >= self._max_noise:
                self.dropped += 1
                self._dropped_in_second += 1
                return
            self._noise += 1
        self._queue.append(event)
        self._wakeup.set()

    def _report_drops(self) -> None:
        if self._dropped_in_second:
            reason = (
                f"dropped: more noise (rejected input, unknown workers, refused connections, "
                f"evicted timers) than "
                f"{self._max_rate}/s or {self._max_noise} queued"
            )
            self._queue.append(
                EventsLost(time=time.time(), count=self._dropped_in_second, error=reason)
            )
            self._dropped_in_second = 0
            self._wakeup.set()

    def close(self) -> None:
        """End the queue: :meth:`run` writes what is queued and returns."""
        if not self._closed:
            self._report_drops()
        self._closed = True
        self._wakeup.set()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        """Open the file (append), then write queued events until :meth:`close`.

        Raises:
            EventLogError: the file cannot be opened, or is refused (not a regular file
                of this user), before ``task_status.started()``.
        """
        try:
            fd = await anyio.to_thread.run_sync(
                functools.partial(open_owned_append, self.path, 0o644, what="event log")
            )
        except UnsafePathError as exc:
            raise EventLogError(str(exc)) from exc
        except OSError as exc:
            raise EventLogError(
                f"cannot append to the event log {self.path}: {_why(exc)}; give a "
                "writable file path in an existing directory"
            ) from exc
        try:
            f = await aiofiles.open(fd, "ab", buffering=0)
        except BaseException:
            os.close(fd)
            raise
        try:
            task_status.started()
            while True:
                if not self._queue:
                    if self._closed:
                        if self._failure is not None and self._unreported:
                            await self._write(f.write, b"", 0)  # a last try to report it
                        return
                    await self._wakeup.wait()
                    self._wakeup = anyio.Event()
                    continue
                if self._failure is not None and not self._closed:
                    wait = self._retry_at - time.monotonic()
                    if wait > 0:  # still failing: what is queued is lost, then try again
                        self._lose(len(self._queue))
                        self._queue.clear()
                        self._noise = 0
                        await anyio.sleep(wait)
                        continue
                await self._write(f.write, *self._take())
        finally:
            with anyio.CancelScope(shield=True):
                await f.close()

    def _take(self) -> tuple[bytes, int]:
        """Encode up to :data:`MAX_BATCH` queued events, oldest first; and their number."""
        queue, lines = self._queue, []
        for _ in range(min(MAX_BATCH, len(queue))):
            event = queue.popleft()
            if isinstance(event, NOISE):
                self._noise -= 1
            lines.append(_encode(event.to_dict()))
        return b"\n".join(lines) + b"\n", len(lines)

    async def _write(
        self, write: Callable[[memoryview], Awaitable[int]], data: bytes, count: int
    ) -> None:
        """Append ``count`` encoded events (``data``), after a loss record if one is due."""
        if self._failure is not None:
            lost = EventsLost(time=time.time(), count=self._unreported, error=self._failure)
            data = (b"\n" if self._partial else b"") + _encode(lost.to_dict()) + b"\n" + data
        view, written = memoryview(data), 0
        try:
            while written < len(data):
                n = await write(view[written:])
                if n:
                    written += n
                    self._partial = data[written - 1] != _NEWLINE
        except OSError as exc:
            if self._failure is None:
                self._failure = _why(exc)
                logger.error(
                    "event log %s: write failed (%s); events are counted as lost until a "
                    "write succeeds, tried again every %g s; reaping goes on",
                    self.path,
                    self._failure,
                    self._retry_interval,
                )
            # Every event whose line was not written whole is lost.
            self._lose(min(count, data.count(b"\n", written)))
            self._retry_at = time.monotonic() + self._retry_interval
            return
        if self._failure is not None:
            logger.warning(
                "event log %s: writing again; %d event(s) were lost", self.path, self._unreported
            )
            self._failure = None
            self._unreported = 0

    def _lose(self, count: int) -> None:
        self.lost += count
        self._unreported += count


def _why(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0, "")
    reason = exc.strerror or str(exc)
    return f"{reason} ({name})" if name else reason
