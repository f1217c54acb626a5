"""A sink that shows each batch of requests to an observer before the engine applies it.

The owner of a server may want to see the requests themselves, not only the timers
(the supervisor pairs them into blocks to name stragglers,
:mod:`aiotimer.supervisor._stragglers`). :class:`ObservedSink` stands between a source
and the engine: it calls ``observe(requests, read_at)`` (``read_at``: the server's
monotonic clock when the batch arrived) and then hands the batch to the engine. An
observer that raises is logged once and dropped: it never costs a request. Batches that
the engine's drains read just before an expiry go to the engine directly and are not
observed (a few blocks of a worker that was due anyway).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from aiotimer._edges.clock import Clock
from aiotimer.server._engine import Engine
from aiotimer.sources import Drain
from aiotimer.wire import Decoded, Request

__all__ = ["ObservedSink", "RequestObserver"]

#: ``observe(requests, read_at)``: a batch of requests in arrival order, and when the
#: server read it (its monotonic clock).
RequestObserver = Callable[[Sequence[Request], float], None]

logger = logging.getLogger("aiotimer")


class ObservedSink:
    """``sink`` with ``observe`` called on every batch first (see the module docs)."""

    __slots__ = ("_clock", "_observe", "_sink")

    def __init__(self, sink: Engine, observe: RequestObserver, clock: Clock) -> None:
        self._sink = sink
        self._observe: RequestObserver | None = observe
        self._clock = clock

    def submit(self, batch: Decoded, source: str) -> None:
        """Show ``batch`` to the observer, then hand it to the sink."""
        observe = self._observe
        if observe is not None and batch.requests:
            try:
                observe(batch.requests, self._clock.monotonic())
            except Exception:
                self._observe = None
                logger.exception("the request observer raised; it sees no more requests")
        self._sink.submit(batch, source)

    def add_drain(self, drain: Drain) -> Callable[[], None]:
        """Register ``drain`` with the sink (see :func:`aiotimer.sources._base.draining`)."""
        return self._sink.add_drain(drain)
