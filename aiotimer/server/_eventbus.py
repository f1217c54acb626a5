"""Where a server's events go besides the log: history, subscribers, an async callback.

:class:`EventBus` is fed every event, in the loop's thread, and never waits:

* it keeps the last ``history`` events, numbered from 1, for ``GET /v1/events?since=N``,
  and apart from them the last ``incidents`` reaps and refusals (the kinds in
  :data:`INCIDENT_KINDS`), what ``aiotimer status`` lists as what happened, so a flood
  of other events cannot push them out;
* each :meth:`subscribe` stream (``TimerServer.events()``) gets every event through a
  bounded buffer; when a slow reader lets its buffer fill, further events are dropped
  for it and counted (``dropped``);
* an ``async def`` ``on_event`` callback is awaited by one task (:meth:`run_callback`),
  one event at a time in order, fed through a bounded buffer with the same drop rule,
  so a slow callback can never stall expiry.

:meth:`close` ends every subscription and, once the callback task has delivered what is
buffered, that task.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectSendStream

from aiotimer._edges.eventlog import EventLog
from aiotimer._edges.logs import EventLogger
from aiotimer.events import Event

__all__ = ["INCIDENT_KINDS", "RECENT_INCIDENTS", "EventBus", "NumberedEvent", "deliver"]

logger = logging.getLogger("aiotimer")

NumberedEvent = tuple[int, Event]

#: The kinds of event that are incidents: a timer expired, what was done about it
#: (signals, failures, refusals), input refused, and timers dropped from a full table.
INCIDENT_KINDS: Final = frozenset(
    {
        "timer_expired",
        "worker_reaped",
        "reap_failed",
        "reap_abandoned",
        "worker_survived",
        "signal_refused",
        "request_rejected",
        "timer_evicted",
        "worker_unknown",
        "control_refused",
    }
)
#: How many incidents a server keeps (the newest).
RECENT_INCIDENTS: Final[int] = 20


class EventBus:
    """History, subscriptions and the async callback of one server (see module docs)."""

    def __init__(
        self, *, history: int = 1000, buffer: int = 1000, incidents: int = RECENT_INCIDENTS
    ) -> None:
        self.history: collections.deque[NumberedEvent] = collections.deque(maxlen=history)
        #: The last reaps and refusals, numbered as in the history.
        self.incidents: collections.deque[NumberedEvent] = collections.deque(maxlen=incidents)
        self.last = 0  #: the number of the last event published
        self.dropped = 0  #: events dropped for slow subscribers or a slow callback
        self._buffer = buffer
        self._subscribers: set[MemoryObjectSendStream[Event]] = set()
        self._callback: MemoryObjectSendStream[Event] | None = None

    def publish(self, event: Event) -> None:
        """Record ``event`` and hand it to every subscriber and the callback task."""
        self.last += 1
        self.history.append((self.last, event))
        if event.kind in INCIDENT_KINDS:
            self.incidents.append((self.last, event))
        for send in (*self._subscribers, *([self._callback] if self._callback else [])):
            try:
                send.send_nowait(event)
            except anyio.WouldBlock:
                self.dropped += 1
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._subscribers.discard(send)

    def since(self, number: int, limit: int) -> tuple[list[NumberedEvent], int]:
        """Up to ``limit`` recorded events numbered above ``number``, oldest first, and
        how many such events the history no longer holds."""
        first = self.history[0][0] if self.history else self.last + 1
        missed = max(0, first - number - 1)
        start = max(0, number + 1 - first)
        out = [self.history[i] for i in range(start, min(len(self.history), start + limit))]
        return out, missed

    async def subscribe(self) -> AsyncIterator[Event]:
        """Every event published from now on, until :meth:`close`."""
        send, receive = anyio.create_memory_object_stream[Event](self._buffer)
        self._subscribers.add(send)
        try:
            async with receive:
                async for event in receive:
                    yield event
        finally:
            self._subscribers.discard(send)
            send.close()

    async def run_callback(
        self,
        callback: Callable[[Event], Awaitable[object]],
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Await ``callback(event)`` for each event in order, until :meth:`close` (then
        deliver what is buffered and return). Exceptions it raises are logged."""
        send, receive = anyio.create_memory_object_stream[Event](self._buffer)
        self._callback = send
        task_status.started()
        async with receive:
            async for event in receive:
                try:
                    await callback(event)
                except Exception:
                    logger.exception("the on_event callback raised on %s; ignored", event.kind)

    def close(self) -> None:
        """End every subscription and the callback task's input."""
        for send in (*self._subscribers, *([self._callback] if self._callback else [])):
            send.close()
        self._subscribers.clear()
        self._callback = None


def deliver(
    event: Event,
    event_logger: EventLogger,
    event_log: EventLog | None,
    bus: EventBus,
    on_event: Callable[[Event], object] | None,
) -> None:
    """Send ``event`` to the logger, the event log file, ``bus``'s subscribers and the
    ``on_event`` callback, in that order; a callback that raises is logged, not raised."""
    event_logger.log(event)
    if event_log is not None:
        event_log.put(event)
    bus.publish(event)
    if on_event is not None:
        try:
            on_event(event)
        except Exception:
            logger.exception("the on_event callback raised on %s; ignored", event.kind)
