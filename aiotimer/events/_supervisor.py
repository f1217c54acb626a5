"""The supervisor's events (:mod:`aiotimer.supervisor`).

A supervised run delivers these and the embedded server's events to the same callback,
logger and event log. ``rank`` is the worker's slot; ``pid`` its current process.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar

from aiotimer.events._base import Event

__all__ = [
    "RestartScheduled",
    "SupervisorGaveUp",
    "SupervisorStopped",
    "WorkerEnded",
    "WorkerRunning",
    "WorkerStarted",
    "WorkerSummary",
]


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
