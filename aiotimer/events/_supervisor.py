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

from aiotimer.events._base import Event, clip, clip_scope, signal_name

__all__ = [
    "HangReported",
    "RankStatus",
    "RestartScheduled",
    "SupervisorGaveUp",
    "SupervisorStopped",
    "WorkerEnded",
    "WorkerRunning",
    "WorkerStarted",
    "WorkerState",
    "exit_phrase",
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
    #: Its slowness against its peers (:mod:`aiotimer.core._straggler`): the largest
    #: ratio over the scopes it was judged in (``None``: not judged yet).
    slowness: float | None = None
    #: The scopes it is a straggler in (empty: none).
    straggler: tuple[str, ...] = ()
    #: Its medians per scope site over its last blocks, ``(cycle, gap, duration)``
    #: seconds (:class:`~aiotimer.core._straggler.Timing`), for a job-wide comparison.
    timings: dict[str, tuple[float, float, float]] = {}


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


def exit_phrase(
    reason: str,
    exit_code: int | None,
    signal: int | None,
    *,
    scopes: tuple[str, ...] = (),
    omitted: int = 0,
    task: str | None = None,
) -> str:
    """Why a worker's process ended, in a few words that fit a line: the culprit first.

    ``reason`` is an exit kind (``reaped``, ``crashed``, ...); for a reap, ``task`` is
    the task that held the worker's loop when its stack dump said so, ``scopes`` the
    first of its blocks (the culprit's first) and ``omitted`` how many more were open.

    >>> exit_phrase("crashed", 1, None)
    'crashed (exit code 1)'
    >>> exit_phrase("reaped", None, 9, scopes=("w.py:3#7@Task-7",), omitted=99, task="Task-7")
    "reaped (SIGKILL): task 'Task-7' held the loop, in block 'w.py:3#7@Task-7' (100 open)"
    """
    how = signal_name(signal) if signal is not None else f"exit code {exit_code}"
    if reason == "reaped":
        total = len(scopes) + omitted
        block = f"block {clip_scope(scopes[0])}" if scopes else "a block"
        count = f" ({total} open)" if total > 1 else ""
        if task is not None:
            return f"reaped ({how}): task {clip_scope(task)} held the loop, in {block}{count}"
        return f"reaped ({how}): {block} outlived its timer{count}"
    if reason == "signalled":
        return f"killed by {how}"
    if reason == "stopped":
        return f"stopped by the supervisor ({how})"
    return f"{clip(reason, 40)} ({how})"


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerEnded(Event):
    """A supervised worker's process ended.

    ``reason`` is ``succeeded``, ``crashed``, ``signalled``, ``reaped`` (by the timer)
    or ``stopped`` (by the supervisor). For a reap, ``task`` is the task that held the
    worker's loop when its stack dump said so, ``scopes`` the first (at most 3) of the
    worker's open blocks, the culprit's first, and ``omitted`` how many more were open.
    ``start_failure`` is true when it ended before any evidence that it ran; ``state`` is
    the slot's state now (e.g. ``backoff``, ``succeeded``, ``fatal``; ``stopped`` at a
    shutdown). Every field is bounded, so the event fits a line.
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
    omitted: int = 0
    task: str | None = None

    @property
    def description(self) -> str:
        """Why the process ended, in a few words (:func:`exit_phrase`)."""
        return exit_phrase(
            self.reason,
            self.exit_code,
            self.signal,
            scopes=self.scopes,
            omitted=self.omitted,
            task=self.task,
        )

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
    """Workers ``ranks`` will be restarted in ``delay`` seconds.

    ``cause`` says why: ``"failure"`` (the restart policy's answer to a failed or reaped
    worker: restart ``attempt`` of the ``budget`` allowed in the window), ``"operator"``
    (asked through the control API: not charged to the budget, logged at INFO) or
    ``"job"`` (a job-wide restart decided by the cluster, counted by the job's own
    budget). ``budget`` is ``-1`` when this node's budget was not charged.
    """

    kind: ClassVar[str] = "restart_scheduled"
    level: ClassVar[int] = logging.WARNING
    ranks: tuple[int, ...]
    delay: float
    restarts: tuple[int, ...]
    attempt: int
    budget: int
    cause: str = "failure"

    def log_level(self) -> int:
        """INFO for an operator's restart, else WARNING."""
        return logging.INFO if self.cause == "operator" else self.level

    def describe(self) -> str:
        """One human-readable line."""
        which = ", ".join(map(str, self.ranks[:16])) + (", ..." if len(self.ranks) > 16 else "")
        when = f"in {self.delay:.2f}s" if self.delay > 0 else "now"
        if self.cause == "operator":
            why = " as the operator asked (not charged to the restart budget)"
        elif self.cause == "job":
            why = " for a job-wide restart (counted by the job's budget)"
        elif self.budget >= 0:
            why = f" (restart {self.attempt} of {self.budget} allowed)"
        else:
            why = ""
        return f"restarting worker(s) {which} {when}{why}"


@dataclass(frozen=True, slots=True, kw_only=True)
class HangReported(Event):
    """Before a group or job restart, the stacks of every rank in its scope were taken:
    ``summary`` names the odd one out (``odd``: its ranks, empty when none stands out),
    ``missing`` the ranks that gave no stacks, ``files`` where the whole report was
    written (text, JSON), ``report`` the report's text (cut in the event log)."""

    kind: ClassVar[str] = "hang_report"
    level: ClassVar[int] = logging.WARNING
    summary: str
    ranks: int
    odd: tuple[int, ...]
    missing: tuple[int, ...]
    seconds: float
    files: tuple[str, ...]
    report: str

    def describe(self) -> str:
        """One line: the summary, then where the report is."""
        where = f" (report: {self.files[0]})" if self.files else ""
        return f"hang report in {self.seconds:.2f}s: {clip(self.summary, 400)}{where}"


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
    of the summary table). ``signal`` is the signal that stopped the run (SIGINT,
    SIGTERM), if one did: the exit code is then ``128 + signal``, as the process's."""

    kind: ClassVar[str] = "supervisor_stopped"
    outcome: str
    exit_code: int
    workers: tuple[RankStatus, ...]
    signal: int | None = None

    def describe(self) -> str:
        """One human-readable line."""
        how = self.outcome.replace("_", " ")
        if self.signal is not None:
            how = f"stopped by {signal_name(self.signal)}"
        return f"supervisor stopped: {how} (exit code {self.exit_code})"
