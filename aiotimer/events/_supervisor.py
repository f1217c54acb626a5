"""The supervisor's events (:mod:`aiotimer.supervisor`), and the record of one
supervised rank they carry, :class:`RankStatus`.

A supervised run delivers these and the embedded server's events to the same callback,
logger and event log. ``rank`` is the worker's slot; ``pid`` its current process.

:class:`RankStatus` and its :class:`WorkerState` live here, in the lowest layer that needs
them (:class:`SupervisorStopped` carries one per rank), so that the supervisor's state,
the final summary, the control API and a cluster node's record all show a rank as the
same record.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import ClassVar

import msgspec

from aiotimer.events._base import Event

__all__ = [
    "RankStatus",
    "RestartScheduled",
    "SupervisorGaveUp",
    "SupervisorStopped",
    "WorkerEnded",
    "WorkerRunning",
    "WorkerStarted",
    "WorkerState",
]


class WorkerState(enum.Enum):
    """A supervised rank's state (torch's ``WorkerState`` names where they mean the same)."""

    INIT = "init"  #: not launched yet
    STARTING = "starting"  #: launched, no evidence yet that it runs
    HEALTHY = "healthy"  #: survived min-uptime or sent a timer request
    UNHEALTHY = "unhealthy"  #: a timer expired; being reaped
    BACKOFF = "backoff"  #: ended; waiting to be restarted
    STOPPED = "stopped"  #: stopped by the supervisor (shutdown or operator), for good
    SUCCEEDED = "succeeded"  #: exited 0, for good
    FAILED = "failed"  #: exited with a no-restart exit code, for good
    FATAL = "fatal"  #: the restart budget ran out; not restarted

    @property
    def terminal(self) -> bool:
        """True when the slot will not run again (unless an operator restarts it)."""
        return self in _TERMINAL

    @property
    def alive(self) -> bool:
        """True when an attempt's process is running."""
        return self in _ALIVE


_TERMINAL = frozenset(
    {WorkerState.STOPPED, WorkerState.SUCCEEDED, WorkerState.FAILED, WorkerState.FATAL}
)
_ALIVE = frozenset({WorkerState.STARTING, WorkerState.HEALTHY, WorkerState.UNHEALTHY})


class RankStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One supervised rank (a worker slot) at one moment.

    What :meth:`Supervisor.get_state() <aiotimer.supervisor.Supervisor.get_state>` lists,
    :class:`SupervisorStopped` and the final summary table report, the control API's
    rows and a cluster node's record are built from.

    ``pid`` is the running attempt's process (``None`` between attempts); ``restarts``
    how often the slot was restarted (its restart count); ``attempts`` how many processes
    it has run, the running one included, and ``start_failures`` how many of them ended
    before any evidence that they ran. ``uptime`` is the seconds its processes have run,
    every attempt's, and ``attempt_uptime`` the running attempt's so far (``None``
    between attempts). ``reasons`` says why each ended attempt ended, in words
    (``"crashed with exit code 1"``).
    """

    rank: int
    state: WorkerState
    pid: int | None = None
    restarts: int = 0
    attempts: int = 0
    start_failures: int = 0
    uptime: float = 0.0
    attempt_uptime: float | None = None
    reasons: tuple[str, ...] = ()


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


@dataclass(frozen=True, slots=True, kw_only=True)
class SupervisorStopped(Event):
    """The supervised run ended: ``outcome`` (``succeeded``, ``failed``, ``gave_up`` or
    ``stopped``), its ``exit_code``, and every rank's final :class:`RankStatus` (the rows
    of the summary table)."""

    kind: ClassVar[str] = "supervisor_stopped"
    outcome: str
    exit_code: int
    workers: tuple[RankStatus, ...]

    def describe(self) -> str:
        """One human-readable line."""
        return f"supervisor stopped: {self.outcome} (exit code {self.exit_code})"
