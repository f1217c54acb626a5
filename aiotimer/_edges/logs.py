"""Logging that never blocks the server's loop.

Two parts:

* :class:`EventLogger` sends the server's events to the ``aiotimer`` logger, each at
  its :attr:`~aiotimer.events.Event.level`, except *noise*: events outsiders can cause
  at any rate (rejected input, requests naming unknown workers, connections to the
  control socket refused to another user, timers evicted from a full table). Of those,
  the first of each kind per :data:`NOISE_INTERVAL` is logged; the others are counted
  and summed up in one line per interval, with a sample (:class:`NoiseLimiter`, a pure
  core). A cap's refusals and evictions are kinds per worker: the first refusal of
  every worker is logged, whatever another worker floods. A flood of
  garbage therefore costs one log line per kind per interval, not one per line.
* :func:`queued_logging` installs a handler that only puts records on a bounded queue; a
  thread writes them to the real stream. A stream nobody drains (a full stderr pipe)
  then blocks that thread, never the loop: once the queue is full, records are dropped
  and counted, and the count is logged when the stream moves again. Records logged in
  the loop's thread are handed over once per turn of the loop, so a reap's few lines
  wake the writer once and are written in one call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import logging.handlers
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Final

from aiotimer.events import ControlRefused, Event, RequestRejected, TimerEvicted, WorkerUnknown

__all__ = [
    "NOISE_INTERVAL",
    "EventLogger",
    "NoiseLimiter",
    "NoiseSummary",
    "queued_logging",
]

logger = logging.getLogger("aiotimer")

#: Seconds over which noise of one kind is summed up in one log line.
NOISE_INTERVAL: Final[float] = 5.0
#: The event classes whose log lines are rate-limited.
_NOISE: Final[tuple[type[Event], ...]] = (
    RequestRejected,
    WorkerUnknown,
    ControlRefused,
    TimerEvicted,
)
#: The most records waiting for a slow stream before new ones are dropped.
MAX_QUEUED_RECORDS: Final[int] = 10_000


@dataclass(frozen=True, slots=True)
class NoiseSummary:
    """``count`` events of ``kind`` were not logged over ``seconds``; ``sample`` is one."""

    kind: str
    count: int
    seconds: float
    sample: str

    def describe(self) -> str:
        """One human-readable line."""
        return (
            f"{self.count:,} more {self.kind} event(s) in the last {self.seconds:.1f} s "
            f"were not logged one by one; e.g. {self.sample}"
        )


@dataclass(slots=True)
class _Window:
    start: float
    count: int = 0
    sample: str = ""

    def summary(self, kind: str, now: float) -> NoiseSummary:
        return NoiseSummary(kind, self.count, now - self.start, self.sample)


@dataclass(slots=True)
class NoiseLimiter:
    """Per kind: the first event of each ``interval`` is logged, the rest summed up.

    Pure: the caller passes the time. :meth:`offer` says whether to log an event;
    :meth:`due` returns the summaries of the windows that have ended with events left
    unlogged; :meth:`next_due` is when the next one ends.
    """

    interval: float = NOISE_INTERVAL
    _windows: dict[str, _Window] = field(default_factory=dict)

    def offer(
        self, kind: str, now: float, describe: Callable[[], str]
    ) -> tuple[bool, NoiseSummary | None]:
        """Count one event of ``kind`` at ``now``.

        Returns whether to log it now, and the summary of the window it ends, if that
        window left events unlogged. ``describe()`` gives its log line; it is called
        only for the window's sample (the first event not logged).
        """
        window = self._windows.get(kind)
        if window is not None and now - window.start < self.interval:
            window.count += 1
            if window.count == 1:
                window.sample = describe()
            return False, None
        self._windows[kind] = _Window(now)
        ended = None if window is None or not window.count else window.summary(kind, now)
        return True, ended

    def due(self, now: float, *, everything: bool = False) -> list[NoiseSummary]:
        """The summaries of every window ended by ``now`` (``everything``: every window)
        with unlogged events; those windows end."""
        out = []
        for kind, window in list(self._windows.items()):
            if everything or now - window.start >= self.interval:
                del self._windows[kind]
                if window.count:
                    out.append(window.summary(kind, now))
        return out

    def next_due(self) -> float | None:
        """When the earliest window with unlogged events ends, or ``None``."""
        ends = [w.start + self.interval for w in self._windows.values() if w.count]
        return min(ends) if ends else None


class EventLogger:
    """Logs events on the ``aiotimer`` logger, rate-limiting noise (see the module docs).

    Call :meth:`log` in the event loop's thread; summaries are logged by a timer on that
    loop, and by :meth:`flush` (call it when the server stops).
    """

    def __init__(self, interval: float = NOISE_INTERVAL) -> None:
        self._limiter = NoiseLimiter(interval)
        self._timer: asyncio.TimerHandle | None = None

    def log(self, event: Event) -> None:
        """Log ``event`` (or count it, if it is noise over its rate)."""
        level = event.log_level()
        if not logger.isEnabledFor(level):
            return
        if isinstance(event, _NOISE):
            log, ended = self._limiter.offer(_noise_kind(event), time.monotonic(), event.describe)
            if ended is not None:
                _log_summary(ended)
            if not log:
                self._schedule()
                return
        logger.log(level, event.describe(), extra={"aiotimer": event.to_dict()})

    def flush(self, *, everything: bool = False) -> None:
        """Log the summaries that are due (``everything``: of every open window)."""
        for summary in self._limiter.due(time.monotonic(), everything=everything):
            _log_summary(summary)

    def _schedule(self) -> None:
        if self._timer is not None:
            return
        when = self._limiter.next_due()
        if when is None:
            return
        with contextlib.suppress(RuntimeError):  # no running loop: flush() will do it
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(max(0.0, when - time.monotonic()), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.flush()
        self._schedule()

    def close(self) -> None:
        """Cancel the summary timer and log what is left."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.flush(everything=True)


def _noise_kind(event: Event) -> str:
    """What ``event`` is rate-limited as: its kind, and for a cap's refusal or eviction
    the worker too, so that one worker's flood of them never hides another's."""
    pid = event.pid if isinstance(event, RequestRejected | TimerEvicted) else None
    return event.kind if pid is None else f"{event.kind} (worker {pid})"


def _log_summary(summary: NoiseSummary) -> None:
    extra = {"event": "noise_summary", "kind": summary.kind, "count": summary.count}
    logger.warning(summary.describe(), extra={"aiotimer": {**extra, "seconds": summary.seconds}})


# -- queued handlers --------------------------------------------------------------------


class _Batches:
    """The queue between the handler and the writer thread: batches of records, at most
    :data:`MAX_QUEUED_RECORDS` records in all; what does not fit is dropped and counted."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[list[logging.LogRecord] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._queued = 0  # records in the queue
        self.dropped = 0

    def put(self, batch: list[logging.LogRecord]) -> None:
        """Queue ``batch`` (or what of it fits)."""
        with self._lock:
            room = MAX_QUEUED_RECORDS - self._queued
            if len(batch) > room:
                self.dropped += len(batch) - room
                batch = batch[:room]
            self._queued += len(batch)
        if batch:
            self.queue.put(batch)

    def taken(self, count: int) -> None:
        """The writer took ``count`` records out of the queue."""
        with self._lock:
            self._queued -= count


class _BatchingQueueHandler(logging.handlers.QueueHandler):
    """Queues records for the writer thread. Records logged in a thread that runs an
    event loop are handed over once per turn of the loop, as one batch (one wake-up of
    the writer for a reap's few lines, not one per line); others at once."""

    def __init__(self, batches: _Batches) -> None:
        super().__init__(batches.queue)
        self._batches = batches
        self._local = threading.local()  # this thread's records not handed over yet
        self._pending: list[list[logging.LogRecord]] = []  # every thread's, for close()
        self._pending_lock = threading.Lock()

    def enqueue(self, record: logging.LogRecord) -> None:
        loop = asyncio.events._get_running_loop()
        pending: list[logging.LogRecord] | None = getattr(self._local, "pending", None)
        if loop is None:
            if pending:  # held by a loop that has stopped: they come first
                self._hand_over(pending)
            self._batches.put([record])
            return
        if pending is None:
            pending = self._local.pending = []
            with self._pending_lock:
                self._pending.append(pending)
        if not pending:
            loop.call_soon(self._hand_over, pending)
        pending.append(record)

    def _hand_over(self, pending: list[logging.LogRecord]) -> None:
        """Queue the records ``pending`` holds as one batch (at the end of a turn)."""
        if pending:
            batch = pending[:]
            del pending[: len(batch)]  # what another thread appends meanwhile stays
            self._batches.put(batch)

    def close(self) -> None:
        """Hand over what any thread still holds (its loop may have closed first)."""
        with self._pending_lock:
            for pending in self._pending:
                self._hand_over(pending)
        super().close()


class _Writer(threading.Thread):
    """Writes queued records to the real handler; reports the records dropped.

    Woken by a batch, it writes it, with whatever else has queued up meanwhile, in one
    call. Nothing queued, it sleeps without a timeout (no idle wake-ups).
    """

    def __init__(self, batches: _Batches, handler: logging.StreamHandler[IO[str]]) -> None:
        super().__init__(name="aiotimer-log-writer", daemon=True)
        self._batches = batches
        self._handler = handler
        self._reported = 0

    def run(self) -> None:
        batches = self._batches.queue
        stopping = False
        while not stopping:
            taken = [batches.get()]
            with contextlib.suppress(queue.Empty):
                while True:
                    taken.append(batches.get_nowait())
            records = [r for batch in taken if batch is not None for r in batch]
            stopping = None in taken  # queued_logging is ending
            self._batches.taken(len(records))
            self._write(records)

    def _write(self, records: list[logging.LogRecord]) -> None:
        dropped = self._batches.dropped
        if dropped != self._reported:
            note = logging.LogRecord(
                "aiotimer",
                logging.WARNING,
                __file__,
                0,
                "%d log record(s) were dropped: the log stream was not read fast enough",
                (dropped - self._reported,),
                None,
            )
            self._reported = dropped
            records.insert(0, note)
        handler = self._handler
        lines = []
        for record in records:
            if record.levelno >= handler.level:
                try:
                    lines.append(handler.format(record) + handler.terminator)
                except Exception:
                    handler.handleError(record)
        if not lines:
            return
        with handler.lock or contextlib.nullcontext():
            try:
                handler.stream.write("".join(lines))
                handler.flush()
            except Exception:
                handler.handleError(records[-1])


@contextlib.contextmanager
def queued_logging(
    level: int | str, stream: IO[str] | None = None, *, fmt: str | None = None
) -> Iterator[None]:
    """Log to ``stream`` (default stderr) through a bounded queue and a writer thread.

    Replaces the root logger's handlers for the duration; on exit, waits a little (at
    most a second) for the queued records to be written, then restores them.
    """
    batches = _Batches()
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(logging.Formatter(fmt or "%(asctime)s %(levelname)-8s %(message)s"))
    front = _BatchingQueueHandler(batches)
    writer = _Writer(batches, handler)
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    root.handlers[:] = [front]
    root.setLevel(level)
    writer.start()
    try:
        yield
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        front.close()
        batches.queue.put(None)
        writer.join(timeout=1.0)
