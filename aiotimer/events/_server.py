"""The server's own life and health: started, stopped, a source or the event log failing, a
busy loop, a refused control connection; and the run's :class:`ServerCounters`."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from aiotimer.events._base import Event

if TYPE_CHECKING:
    from aiotimer.core import ScopeStats

__all__ = [
    "ControlRefused",
    "EventsLost",
    "LoopLagged",
    "ServerCounters",
    "ServerStarted",
    "ServerStopped",
    "SourceFailed",
]


@dataclass(slots=True)
class ServerCounters:
    """What a server run has done so far (the server counts into one; snapshots are copies).

    ``requests`` counts valid requests received; ``acquired``/``released`` the timers set
    and released in time; ``cancelled`` the ``async with`` blocks that ended at their own
    deadline, their task cancelled in the worker (the first tier; such a block is also
    ``released``); ``expired`` the timers whose deadline passed (each of a reaped
    worker's timers that fell due, not only the one that began the reap); ``reaped`` the
    signals delivered; ``reap_failed`` the failed signal attempts; ``rejected`` the bad
    inputs (and acquires refused by a cap, also counted in ``cap_rejected``); ``evicted``
    the timers dropped to make room in a full table; ``workers_exited`` the workers seen
    exiting; ``wakeups`` the times the expiry task woke up; ``events_dropped`` the events
    the event log had no room for.
    """

    requests: int = 0
    acquired: int = 0
    released: int = 0
    cancelled: int = 0
    expired: int = 0
    reaped: int = 0
    reap_failed: int = 0
    rejected: int = 0
    workers_exited: int = 0
    wakeups: int = 0
    events_dropped: int = 0
    cap_rejected: int = 0
    evicted: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerStarted(Event):
    """The server is running: its sources accept requests."""

    kind: ClassVar[str] = "server_started"
    pid: int
    sources: tuple[str, ...]

    def describe(self) -> str:
        """One human-readable line."""
        where = ", ".join(self.sources) or "in-process API only"
        return f"timer server started (pid {self.pid}) on {where}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerStopped(Event):
    """The server stopped with ``timers`` live timers.

    They were dropped, unless the server kept its ``journal`` (a planned stop while
    timers that would signal were live): it names the earliest such timer of
    ``journaled`` workers, which the next server on the same FIFO restores.
    ``scopes`` holds the run's duration statistics, one summary per scope site (see
    :meth:`aiotimer.server.TimerServer.scope_stats`).
    """

    kind: ClassVar[str] = "server_stopped"
    timers: int
    counters: dict[str, int]
    scopes: tuple[ScopeStats, ...] = ()
    journal: str | None = None
    journaled: int = 0

    def describe(self) -> str:
        """One human-readable line."""
        sites = f", statistics of {len(self.scopes)} scope site(s)" if self.scopes else ""
        if self.journal is None:
            return f"timer server stopped ({self.timers} live timers dropped{sites})"
        return (
            f"timer server stopped ({self.timers} live timers; the journal {self.journal} "
            f"keeps the earliest of {self.journaled} worker(s) for the next server on this "
            f"FIFO{sites})"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceFailed(Event):
    """A source failed while serving; the server keeps running without it."""

    kind: ClassVar[str] = "source_failed"
    level: ClassVar[int] = logging.ERROR
    source: str
    error: str

    def describe(self) -> str:
        """One human-readable line."""
        return f"source {self.source} failed and was dropped: {self.error}"


@dataclass(frozen=True, slots=True, kw_only=True)
class EventsLost(Event):
    """The event log could not write ``count`` events (``error`` says why).

    Written into the event log as the first record once writing works again; the
    server went on reaping meanwhile.
    """

    kind: ClassVar[str] = "events_lost"
    level: ClassVar[int] = logging.ERROR
    count: int
    error: str

    def describe(self) -> str:
        """One human-readable line."""
        return f"the event log lost {self.count} event(s): {self.error}"


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopLagged(Event):
    """Expiries were handled ``lag`` seconds after their deadline because the event loop
    was busy elsewhere (the host program blocked it); ``expired`` timers were due. For a
    timer that arrived already past its deadline, ``lag`` runs from its arrival.

    Reported when ``lag`` exceeds the server's ``lag_threshold``; every lag is also in the
    ``aiotimer_loop_lag_seconds`` histogram.
    """

    kind: ClassVar[str] = "loop_lagged"
    level: ClassVar[int] = logging.WARNING
    lag: float
    expired: int

    def describe(self) -> str:
        """One human-readable line."""
        return (
            f"the event loop delayed {self.expired} expiry(ies) by {self.lag * 1000:.0f} ms: "
            "something blocks the loop the timer server runs in"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlRefused(Event):
    """A process of another user (``uid``, ``pid`` as the kernel reports them) connected
    to the control socket and was refused."""

    kind: ClassVar[str] = "control_refused"
    level: ClassVar[int] = logging.WARNING
    pid: int
    uid: int

    def describe(self) -> str:
        """One human-readable line."""
        return f"refused control connection from pid {self.pid} (uid {self.uid})"
