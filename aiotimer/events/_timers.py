"""What became of the requests: timers set, released and expired, workers found gone or
unknown, and inputs rejected."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar

from aiotimer.core import format_seconds
from aiotimer.events._base import (
    Event,
    clip,
    clip_scope,
    scope_list,
    signal_name,
)

__all__ = [
    "BlockCancelled",
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
            f"worker {self.pid} acquired {clip_scope(self.scope_id)}, expires in "
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
        return f"worker {self.pid} released {clip_scope(self.scope_id)} (via {self.source})"


@dataclass(frozen=True, slots=True, kw_only=True)
class TimerExpired(Event):
    """A timer's deadline passed. ``late`` is seconds past the deadline when handled.

    ``report_only`` is true when nothing will be done to the worker (signal ``<= 0``,
    shadow mode, or the timer belongs to the server's own process, which is never
    signalled). ``action`` says in words what the server does (or, in shadow mode,
    would do).

    ``kill_after > 0``: the timer is the second tier of an ``async with`` block. Its
    deadline is the reap deadline; the block's own deadline, when the worker cancelled
    its task, passed ``kill_after`` seconds earlier (``late + kill_after`` ago), and the
    block has still not ended: its loop is blocked, or the task swallowed its
    cancellation.

    ``learned`` is set when the deadline was a learned timeout's value
    (``expires(after=learned(...))``, :mod:`aiotimer.core._learned`): the value, in
    seconds, learned from ``learned_samples`` durations of the scope.
    """

    kind: ClassVar[str] = "timer_expired"
    level: ClassVar[int] = logging.WARNING
    pid: int
    scope_id: str
    signal: int
    late: float
    report_only: bool
    action: str
    kill_after: float = 0.0
    learned: float | None = None
    learned_samples: int = 0

    def describe(self) -> str:
        """One human-readable line."""
        late = f"{self.late * 1000:.1f} ms"
        what = f"timer {clip_scope(self.scope_id)} of worker {self.pid} expired"
        if self.learned is not None:
            what += (
                f" at its learned timeout {format_seconds(self.learned)} (from "
                f"{self.learned_samples:,} samples)"
            )
        if self.kill_after > 0:
            return (
                f"{what} {late} after its reap deadline: its block outlived its own "
                f"deadline by {format_seconds(self.kill_after)} (kill_after); action: "
                f"{clip(self.action)}"
            )
        return f"{what} ({late} after its deadline); action: {clip(self.action)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockCancelled(Event):
    """An ``async with`` block ended at its own deadline: the worker cancelled its task
    there (``TimeoutError`` out of the block, the first of two tiers) and the block
    ended, so the server does not reap the worker. The worker says so in the block's
    release (the wire's ``cancelled`` key).

    ``late`` is how long after its deadline the block ended (its release arrived), and
    ``kill_after`` how long after its deadline the server would have reaped the worker;
    both ``None`` when the server did not hold the block's timer (its acquire and
    release were read at once, or the server restarted in between).
    """

    kind: ClassVar[str] = "block_cancelled"
    pid: int
    scope_id: str
    late: float | None = None
    kill_after: float | None = None

    def describe(self) -> str:
        """One human-readable line."""
        ended = ""
        if self.late is not None:
            ended = f"; the block ended {format_seconds(self.late)} later"
            if self.kill_after is not None:
                left = format_seconds(max(0.0, self.kill_after - self.late))
                ended += f", {left} before its reap deadline"
        return (
            f"block {clip_scope(self.scope_id)} of worker {self.pid} hit its deadline: "
            f"its task was cancelled (TimeoutError in the worker){ended}"
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
            f"process; timer {clip_scope(self.scope_id)} dropped"
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
        return f"rejected input from {self.source}: {clip(self.reason)}: {clip(repr(self.line))}"


@dataclass(frozen=True, slots=True, kw_only=True)
class TimerEvicted(Event):
    """The server held its maximum of ``max_timers`` timers: timer ``scope_id`` of worker
    ``pid``, which held the most of its user's workers (``holds``, this one included),
    was dropped to make room for a new timer of worker ``for_pid`` (of a user holding at
    least two fewer, or of the same user). It will not be reaped for that block."""

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
            f"timer {clip_scope(self.scope_id)} of worker {self.pid} dropped: the server holds its "
            f"maximum of {self.max_timers:,} timers and worker {self.pid} holds the most "
            f"of its user's workers ({self.holds:,}); a new timer of worker {self.for_pid} "
            "took its place. "
            f"Worker {self.pid} leaks timers, or raise the cap"
        )
