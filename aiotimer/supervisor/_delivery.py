"""Where the supervisor's events go: the log (at each event's level), the run's event
log file, and the owner's ``on_event`` callback, whose exceptions are logged, never
raised into the run."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import anyio.abc

from aiotimer._edges.eventlog import EventLog
from aiotimer.events import Event

__all__ = ["Delivery"]

logger = logging.getLogger("aiotimer")


class Delivery:
    """The supervisor's event outlets (see the module docstring)."""

    __slots__ = ("_log", "_on_event", "_path")

    def __init__(
        self, path: str | os.PathLike[str] | None, on_event: Callable[[Event], None] | None
    ) -> None:
        self._path = path
        self._on_event = on_event
        self._log: EventLog | None = None

    async def open(self, tg: anyio.abc.TaskGroup) -> None:
        """Open the event log file, if there is one; its writer runs in ``tg``."""
        if self._path is not None:
            self._log = EventLog(self._path)
            await tg.start(self._log.run)

    def close(self) -> None:
        """Close the event log file (after the run's last event)."""
        if self._log is not None:
            self._log.close()

    def emit(self, event: Event) -> None:
        """Log ``event`` at its level, then :meth:`deliver` it."""
        level = event.log_level()
        if logger.isEnabledFor(level):
            logger.log(level, event.describe(), extra={"aiotimer": event.to_dict()})
        self.deliver(event)

    def deliver(self, event: Event) -> None:
        """Write ``event`` to the event log file and hand it to ``on_event`` (an event
        the server logged already)."""
        if self._log is not None:
            self._log.put(event)
        if self._on_event is not None:
            try:
                self._on_event(event)
            except Exception:
                logger.exception("the on_event callback raised on %s; ignored", event.kind)
