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
  and counted, and the count is logged when the stream moves again.
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
#: Seconds the log writer lets records gather once one arrives (see :class:`_Writer`).
GATHER_SECONDS: Final[float] = 0.02


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


class _DroppingQueueHandler(logging.handlers.QueueHandler):
    """Puts records on a bounded queue; drops and counts them when it is full."""

    def __init__(self, records: queue.Queue[logging.LogRecord | None]) -> None:
        super().__init__(records)
        self.dropped = 0

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1


class _Writer(threading.Thread):
    """Writes queued records to the real handler; reports the records dropped.

    Woken by a record, it first sleeps :data:`GATHER_SECONDS`, then writes what has
    queued up meanwhile in one go: a reap logs a few lines at once, and a writer that
    woke at each would contend with the loop for the interpreter lock at each. Nothing
    queued, it sleeps without a timeout (no idle wake-ups).
    """

    def __init__(
        self,
        records: queue.Queue[logging.LogRecord | None],
        front: _DroppingQueueHandler,
        handler: logging.StreamHandler[IO[str]],
    ) -> None:
        super().__init__(name="aiotimer-log-writer", daemon=True)
        self._records = records
        self._front = front
        self._handler = handler
        self._reported = 0

    def run(self) -> None:
        stopping = False
        while not stopping:
            batch = [self._records.get()]
            if batch[0] is not None:
                time.sleep(GATHER_SECONDS)
            with contextlib.suppress(queue.Empty):
                while True:
                    batch.append(self._records.get_nowait())
            records = [r for r in batch if r is not None]
            stopping = len(records) < len(batch)  # None: queued_logging is ending
            self._write(records)

    def _write(self, records: list[logging.LogRecord]) -> None:
        dropped = self._front.dropped
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
    records: queue.Queue[logging.LogRecord | None] = queue.Queue(MAX_QUEUED_RECORDS)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(logging.Formatter(fmt or "%(asctime)s %(levelname)-8s %(message)s"))
    front = _DroppingQueueHandler(records)
    writer = _Writer(records, front, handler)
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
        with contextlib.suppress(queue.Full):
            records.put(None, timeout=1.0)
        writer.join(timeout=1.0)
