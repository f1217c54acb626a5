"""What became of the requests: timers set, released and expired, workers found gone or
unknown, and inputs rejected."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar

from aiotimer.events._base import Event, scope_list, signal_name

__all__ = [
    "RequestRejected",
    "TimerAcquired",
    "TimerEvicted",
    "TimerExpired",
    "TimerReleased",
    "WorkerExited",
    "WorkerUnknown",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class TimerAcquired(Event):
    """A timer was set or replaced (opt-in: ``TimerServer(request_events=True)``)."""

    kind: ClassVar[str] = "timer_acquired"
    level: ClassVar[int] = logging.DEBUG
    pid: int
    scope_id: str
    expires_in: float
    signal: int
    source: str

    def describe(self) -> str:
        """One human-readable line."""
        return (
            f"worker {self.pid} acquired {self.scope_id!r}, expires in "
            f"{self.expires_in:.3f}s ({signal_name(self.signal)}, via {self.source})"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class TimerReleased(Event):
    """A live timer was released in time (opt-in, like :class:`TimerAcquired`)."""

    kind: ClassVar[str] = "timer_released"
    level: ClassVar[int] = logging.DEBUG
    pid: int
    scope_id: str
    source: str

    def describe(self) -> str:
        """One human-readable line."""
        return f"worker {self.pid} released {self.scope_id!r} (via {self.source})"


@dataclass(frozen=True, slots=True, kw_only=True)
class TimerExpired(Event):
    """A timer's deadline passed. ``late`` is seconds past the deadline when handled.

    ``report_only`` is true when nothing will be done to the worker (signal ``<= 0``,
    shadow mode, or the timer belongs to the server's own process, which is never
    signalled). ``action`` says in words what the server does (or, in shadow mode,
    would do).
    """

    kind: ClassVar[str] = "timer_expired"
    level: ClassVar[int] = logging.WARNING
    pid: int
    scope_id: str
    signal: int
    late: float
    report_only: bool
    action: str

    def describe(self) -> str:
        """One human-readable line."""
        return (
            f"timer {self.scope_id!r} of worker {self.pid} expired "
            f"({self.late * 1000:.1f} ms after its deadline); action: {self.action}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerExited(Event):
    """The worker is gone; its remaining timers (``cleared``: the first
    :data:`MAX_REPORTED_SCOPES`; ``omitted`` more) were dropped unsignalled.

    ``reason`` is ``"exited"`` (noticed through its pidfd or equivalent) or
    ``"gone before signal"`` (it had already exited when the server tried to reap it).
    """

    kind: ClassVar[str] = "worker_exited"
    pid: int
    cleared: tuple[str, ...]
    reason: str
    omitted: int = 0

    def describe(self) -> str:
        """One human-readable line."""
        cleared = (
            f"cleared {scope_list(self.cleared, self.omitted)}"
            if self.cleared
            else "no timers left"
        )
        return f"worker {self.pid} {self.reason} ({cleared})"


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerUnknown(Event):
    """A request named a pid with no such process; its timers were dropped."""

    kind: ClassVar[str] = "worker_unknown"
    level: ClassVar[int] = logging.WARNING
    pid: int
    scope_id: str
    source: str

    def describe(self) -> str:
        """One human-readable line."""
        return (
            f"request from {self.source} names pid {self.pid}, which is not a running "
            f"process; timer {self.scope_id!r} dropped"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRejected(Event):
    """One bad input line or object; ``line`` is a (truncated) copy of it. ``pid`` is
    the worker a valid request named when a cap refused it (else ``None``)."""

    kind: ClassVar[str] = "request_rejected"
    level: ClassVar[int] = logging.WARNING
    reason: str
    line: str
    source: str
    pid: int | None = None

    def describe(self) -> str:
        """One human-readable line."""
        return f"rejected input from {self.source}: {self.reason}: {self.line!r}"


@dataclass(frozen=True, slots=True, kw_only=True)
class TimerEvicted(Event):
    """The server held its maximum of ``max_timers`` timers: timer ``scope_id`` of worker
    ``pid``, which held the most (``holds``, this one included), was dropped to make
    room for a new timer of worker ``for_pid``. It will not be reaped for that block."""

    kind: ClassVar[str] = "timer_evicted"
    level: ClassVar[int] = logging.WARNING
    pid: int
    scope_id: str
    holds: int
    for_pid: int
    max_timers: int

    def describe(self) -> str:
        """One human-readable line."""
        return (
            f"timer {self.scope_id!r} of worker {self.pid} dropped: the server holds its "
            f"maximum of {self.max_timers:,} timers and worker {self.pid} holds the most "
            f"({self.holds:,}); a new timer of worker {self.for_pid} took its place. "
            f"Worker {self.pid} leaks timers, or raise the cap"
        )
