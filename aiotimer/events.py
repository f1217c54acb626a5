"""What the server tells the world: typed, immutable event records.

Every event has the wall-clock ``time`` it happened (epoch seconds) and a class-level
``kind`` (a short stable string, also the ``"event"`` key of :meth:`Event.to_dict`).
The server delivers each event to the ``on_event`` callback, to the ``aiotimer`` logger
(at :attr:`Event.level`, with the event's dict as ``extra={"aiotimer": ...}``) and, when
configured, to a JSON-lines event log.

Pids and scope ids are the worker's; ``signal`` values are signal numbers (``0`` or
negative: report only).

Long texts (stack dumps) are kept whole in the event objects; their logged forms
(:meth:`Event.to_dict`, used by the logger and the event log, and :meth:`Event.describe`)
are cut at :data:`MAX_LOGGED_TEXT` characters with a note saying how much was left out.
"""

from __future__ import annotations

import dataclasses
import logging
import signal as _signal
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final

if TYPE_CHECKING:
    from aiotimer._stats import SiteSummary

__all__ = [
    "MAX_LOGGED_TEXT",
    "MAX_REPORTED_SCOPES",
    "ControlRefused",
    "Counters",
    "Event",
    "EventsLost",
    "LoopLagged",
    "ReapAbandoned",
    "ReapFailed",
    "RequestRejected",
    "RestartScheduled",
    "ServerStarted",
    "ServerStopped",
    "SignalRefused",
    "SignalSent",
    "SourceFailed",
    "StacksDumped",
    "SupervisorGaveUp",
    "SupervisorStopped",
    "TimerAcquired",
    "TimerExpired",
    "TimerReleased",
    "WorkerEnded",
    "WorkerExited",
    "WorkerReaped",
    "WorkerRunning",
    "WorkerStarted",
    "WorkerSummary",
    "WorkerSurvived",
    "WorkerUnknown",
    "clip_text",
    "signal_name",
]

#: The most scope ids one event lists (a worker may hold many timers; the rest are
#: counted in the event's ``omitted``).
MAX_REPORTED_SCOPES: Final[int] = 100
#: The most characters of one text field (a stack dump) that logs and the event log get.
MAX_LOGGED_TEXT: Final[int] = 64 * 1024


def signal_name(signum: int) -> str:
    """``"SIGKILL"`` for 9, ``"signal 0"`` for non-signals, ``"signal 77"`` if unknown."""
    try:
        return _signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@dataclass(slots=True)
class Counters:
    """What a server run has done so far (the server counts into one; snapshots are copies).

    ``requests`` counts valid requests received; ``acquired``/``released`` the timers set
    and released in time; ``expired`` the deadlines passed; ``reaped`` the signals
    delivered; ``reap_failed`` the failed signal attempts; ``rejected`` the bad inputs;
    ``workers_exited`` the workers seen exiting; ``wakeups`` the times the expiry task
    woke up; ``events_dropped`` the events the event log had no room for.
    """

    requests: int = 0
    acquired: int = 0
    released: int = 0
    expired: int = 0
    reaped: int = 0
    reap_failed: int = 0
    rejected: int = 0
    workers_exited: int = 0
    wakeups: int = 0
    events_dropped: int = 0


def clip_text(text: str, limit: int = MAX_LOGGED_TEXT) -> str:
    """``text`` cut to ``limit`` characters, with a note saying how many were left out."""
    if len(text) <= limit:
        return text
    return (
        text[:limit] + f"\n[aiotimer: {len(text) - limit:,} more characters not logged; "
        "the event object holds the full text]\n"
    )


def _logged(value: object) -> object:
    """``value`` in its JSON-ready, logged form."""
    if isinstance(value, str):
        return clip_text(value)
    if isinstance(value, tuple):
        return [_logged(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def _scopes(scopes: tuple[str, ...], omitted: int = 0) -> str:
    shown = ", ".join(scopes[:5])
    total = len(scopes) + omitted
    return shown + (f", ... ({total} in all)" if total > 5 else "")


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Base of every event: when it happened (``time``, epoch seconds) and its ``kind``."""

    kind: ClassVar[str] = "event"
    #: The :mod:`logging` level the server logs this kind of event at.
    level: ClassVar[int] = logging.INFO

    time: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: ``{"event": kind, "time": ..., <fields>}``.

        Tuples become lists, records (e.g. :class:`~aiotimer._stats.SiteSummary`) dicts,
        and texts longer than :data:`MAX_LOGGED_TEXT` are clipped (:func:`clip_text`).
        """
        out: dict[str, Any] = {"event": self.kind}
        for f in dataclasses.fields(self):
            out[f.name] = _logged(getattr(self, f.name))
        return out

    def describe(self) -> str:
        """One human-readable line (the log message)."""
        return self.kind


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
    """The server stopped; ``timers`` live timers were dropped.

    ``scopes`` holds the run's duration statistics, one summary per scope site (see
    :meth:`aiotimer.server.TimerServer.scope_stats`).
    """

    kind: ClassVar[str] = "server_stopped"
    timers: int
    counters: dict[str, int]
    scopes: tuple[SiteSummary, ...] = ()

    def describe(self) -> str:
        """One human-readable line."""
        sites = f", statistics of {len(self.scopes)} scope site(s)" if self.scopes else ""
        return f"timer server stopped ({self.timers} live timers dropped{sites})"


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
class WorkerReaped(Event):
    """A signal was delivered to the worker (step ``step`` of ``steps`` of its plan).

    ``scopes`` are the worker's timers that led to or were cleared by this reap, the
    first :data:`MAX_REPORTED_SCOPES` of them; ``omitted`` says how many more there were.
    ``stacks`` is the stack dump taken earlier in the same plan (its
    :class:`StacksDumped` event has it too), ``None`` if the plan took none or none came.
    """

    kind: ClassVar[str] = "worker_reaped"
    level: ClassVar[int] = logging.WARNING
    pid: int
    signal: int
    group: bool
    scopes: tuple[str, ...]
    step: int
    steps: int
    stacks: str | None = None
    omitted: int = 0

    def describe(self) -> str:
        """One human-readable line (the dump itself is in the ``stacks_dumped`` line)."""
        target = f"process group of worker {self.pid}" if self.group else f"worker {self.pid}"
        dumped = "; stack dump attached" if self.stacks is not None else ""
        return (
            f"sent {signal_name(self.signal)} to {target} (step {self.step}/{self.steps}; "
            f"scopes: {_scopes(self.scopes, self.omitted)}{dumped})"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ReapFailed(Event):
    """Signalling the worker failed; ``retry_in`` seconds until the next attempt.

    Never a success: a later :class:`WorkerReaped` or :class:`ReapAbandoned` follows.
    """

    kind: ClassVar[str] = "reap_failed"
    level: ClassVar[int] = logging.ERROR
    pid: int
    signal: int
    error: str
    attempt: int
    retry_in: float

    def describe(self) -> str:
        """One human-readable line."""
        return (
            f"could not send {signal_name(self.signal)} to worker {self.pid} "
            f"(attempt {self.attempt}): {self.error}; retrying in {self.retry_in:.2f}s"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ReapAbandoned(Event):
    """The server gave up signalling the worker (refused target or out of attempts).

    The worker stays watched: its exit is still reported by :class:`WorkerExited`.
    """

    kind: ClassVar[str] = "reap_abandoned"
    level: ClassVar[int] = logging.CRITICAL
    pid: int
    signal: int
    error: str
    attempts: int

    def describe(self) -> str:
        """One human-readable line."""
        return (
            f"gave up sending {signal_name(self.signal)} to worker {self.pid} after "
            f"{self.attempts} attempt(s): {self.error}; the worker may still be running"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSurvived(Event):
    """The worker was still alive ``waited`` seconds after the last signal of its plan.

    ``unkillable`` is true when that signal was SIGKILL (a process stuck in the kernel,
    e.g. in D state); the worker stays watched.
    """

    kind: ClassVar[str] = "worker_survived"
    level: ClassVar[int] = logging.CRITICAL
    pid: int
    signal: int
    unkillable: bool
    waited: float

    def describe(self) -> str:
        """One human-readable line."""
        what = "unkillable" if self.unkillable else "still running"
        return (
            f"worker {self.pid} is {what} {self.waited:g}s after "
            f"{signal_name(self.signal)}; it stays watched"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class StacksDumped(Event):
    """A stack dump was requested from the worker; ``text`` is ``None`` if none came,
    and then ``reason`` says why (no hook in the worker, no py-spy, timed out ...)."""

    kind: ClassVar[str] = "stacks_dumped"
    level: ClassVar[int] = logging.WARNING
    pid: int
    text: str | None
    step: int
    steps: int
    reason: str | None = None

    def describe(self) -> str:
        """One human-readable line."""
        if self.text is None:
            why = f": {self.reason}" if self.reason else ""
            return f"no stack dump from worker {self.pid} (step {self.step}/{self.steps}){why}"
        where = f"worker {self.pid} (step {self.step}/{self.steps})"
        return f"stacks of {where}:\n{clip_text(self.text)}"


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
            f"cleared {_scopes(self.cleared, self.omitted)}" if self.cleared else "no timers left"
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
    """One bad input line or object; ``line`` is a (truncated) copy of it."""

    kind: ClassVar[str] = "request_rejected"
    level: ClassVar[int] = logging.WARNING
    reason: str
    line: str
    source: str

    def describe(self) -> str:
        """One human-readable line."""
        return f"rejected input from {self.source}: {self.reason}: {self.line!r}"


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


# -- the supervisor's events (aiotimer.supervisor) -----------------------------------------
#
# A supervised run delivers these and the embedded server's events to the same callback,
# logger and event log. ``rank`` is the worker's slot; ``pid`` its current process.


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerStarted(Event):
    """A supervised worker was launched (``attempt`` counts from 1)."""

    kind: ClassVar[str] = "worker_started"
    rank: int
    pid: int
    attempt: int
    restarts: int

    def describe(self) -> str:
        """One human-readable line."""
        return (
            f"worker {self.rank} started (pid {self.pid}, attempt {self.attempt}, "
            f"restart count {self.restarts})"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerRunning(Event):
    """Evidence that a supervised worker runs: ``evidence`` says which."""

    kind: ClassVar[str] = "worker_running"
    rank: int
    pid: int
    evidence: str

    def describe(self) -> str:
        """One human-readable line."""
        return f"worker {self.rank} (pid {self.pid}) is running: {self.evidence}"


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerEnded(Event):
    """A supervised worker's process ended.

    ``reason`` is ``succeeded``, ``crashed``, ``signalled``, ``reaped`` (by the timer;
    ``scopes`` are the expired ones) or ``stopped`` (by the supervisor); ``start_failure``
    is true when it ended before any evidence that it ran; ``state`` is the slot's state
    now (e.g. ``backoff``, ``succeeded``, ``fatal``).
    """

    kind: ClassVar[str] = "worker_ended"
    level: ClassVar[int] = logging.WARNING
    rank: int
    pid: int
    reason: str
    exit_code: int | None
    signal: int | None
    scopes: tuple[str, ...]
    uptime: float
    start_failure: bool
    state: str
    description: str

    def log_level(self) -> int:
        """The level to log this exit at: INFO for a success or a stop, else WARNING."""
        return logging.INFO if self.reason in ("succeeded", "stopped") else self.level

    def describe(self) -> str:
        """One human-readable line."""
        early = " before it was seen running (start failure)" if self.start_failure else ""
        return (
            f"worker {self.rank} (pid {self.pid}) {self.description} after "
            f"{self.uptime:.2f}s{early}; now {self.state}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RestartScheduled(Event):
    """Workers ``ranks`` will be restarted in ``delay`` seconds (restart ``attempt`` of
    the ``budget`` allowed in the window; ``budget`` is ``-1`` when the restart was not
    counted: an operator's or a job-wide one)."""

    kind: ClassVar[str] = "restart_scheduled"
    level: ClassVar[int] = logging.WARNING
    ranks: tuple[int, ...]
    delay: float
    restarts: tuple[int, ...]
    attempt: int
    budget: int

    def describe(self) -> str:
        """One human-readable line."""
        which = ", ".join(map(str, self.ranks))
        counted = f" (restart {self.attempt} of {self.budget} allowed)" if self.budget >= 0 else ""
        return f"restarting worker(s) {which} in {self.delay:.2f}s{counted}"


@dataclass(frozen=True, slots=True, kw_only=True)
class SupervisorGaveUp(Event):
    """The supervisor gave up (restart budget exhausted, or a no-restart exit in group
    scope) and stops every worker."""

    kind: ClassVar[str] = "supervisor_gave_up"
    level: ClassVar[int] = logging.CRITICAL
    reason: str

    def describe(self) -> str:
        """One human-readable line."""
        return f"supervisor gives up: {self.reason}; stopping every worker"


@dataclass(frozen=True, slots=True)
class WorkerSummary:
    """One worker's line of the final summary: its attempts, why each ended, uptime."""

    rank: int
    state: str
    attempts: int
    restarts: int
    start_failures: int
    reasons: tuple[str, ...]
    uptime: float


@dataclass(frozen=True, slots=True, kw_only=True)
class SupervisorStopped(Event):
    """The supervised run ended: ``outcome`` (``succeeded``, ``failed``, ``gave_up`` or
    ``stopped``), its ``exit_code``, and one summary per worker."""

    kind: ClassVar[str] = "supervisor_stopped"
    outcome: str
    exit_code: int
    workers: tuple[WorkerSummary, ...]

    def to_dict(self) -> dict[str, Any]:
        """:meth:`Event.to_dict`, with each worker's ``reasons`` as a list."""
        out = Event.to_dict(self)
        out["workers"] = [{**w, "reasons": list(w["reasons"])} for w in out["workers"]]
        return out

    def describe(self) -> str:
        """One human-readable line."""
        return f"supervisor stopped: {self.outcome} (exit code {self.exit_code})"


@dataclass(frozen=True, slots=True, kw_only=True)
class SignalSent(Event):
    """A non-lethal step of a reap was delivered (step ``step`` of ``steps``), e.g. the
    soft signal before a grace period: the worker is not reaped yet, a
    :class:`WorkerReaped` follows for the lethal step (unless it exits first)."""

    kind: ClassVar[str] = "signal_sent"
    pid: int
    signal: int
    group: bool
    step: int
    steps: int

    def describe(self) -> str:
        """One human-readable line."""
        target = f"process group of worker {self.pid}" if self.group else f"worker {self.pid}"
        return f"sent {signal_name(self.signal)} to {target} (step {self.step}/{self.steps})"


@dataclass(frozen=True, slots=True, kw_only=True)
class SignalRefused(Event):
    """The server refused to send a signal: the kill policy, the worker's identity or the
    kernel (``EPERM``, ``EINVAL``: permanent, never retried) said no; ``reason`` says
    which. ``fallback`` says what was done instead: ``"pid"`` when a refused group
    signal went to the worker alone, ``""`` when nothing was sent."""

    kind: ClassVar[str] = "signal_refused"
    level: ClassVar[int] = logging.ERROR
    pid: int
    signal: int
    group: bool
    reason: str
    fallback: str = ""

    def describe(self) -> str:
        """One human-readable line."""
        target = f"process group of worker {self.pid}" if self.group else f"worker {self.pid}"
        instead = "; sent to the worker alone instead" if self.fallback == "pid" else ""
        return f"refused to send {signal_name(self.signal)} to {target}: {self.reason}{instead}"


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopLagged(Event):
    """Expiries were handled ``lag`` seconds after their deadline because the event loop
    was busy elsewhere (the host program blocked it); ``expired`` timers were due.

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
