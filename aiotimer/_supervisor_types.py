"""The supervisor's public data: outcomes, snapshots, and the restart coordinator hook.

Re-exported by :mod:`aiotimer.supervisor`.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from aiotimer._exits import ExitReason
from aiotimer._restart import GiveUp, Restart, RestartPolicy, WorkerState
from aiotimer.events import WorkerSummary
from aiotimer.server import Lifecycle, ServerState

if TYPE_CHECKING:
    from aiotimer.supervisor import Supervisor

__all__ = [
    "Decision",
    "LocalCoordinator",
    "RestartCoordinator",
    "RunOutcome",
    "SupervisorState",
    "WorkerFailure",
    "WorkerSnapshot",
    "format_summary",
]

#: What a coordinator may answer: carry this out, or ``None`` (it will call back).
Decision = Restart | GiveUp


class RunOutcome(enum.IntEnum):
    """How a supervised run ended; the value is ``aiotimer run``'s exit status."""

    SUCCEEDED = 0  #: every worker exited 0
    FAILED = 1  #: a worker failed for good (a no-restart exit code)
    #: the supervisor gave up (restart budget exhausted, the timer server could no
    #: longer watch the workers, or a coordinator's give-up)
    GAVE_UP = 3
    STOPPED = 4  #: stopped before every worker finished (aclose, an operator's stop)


@dataclass(frozen=True, slots=True)
class WorkerSnapshot:
    """One worker slot, as :meth:`Supervisor.get_state` sees it.

    ``pid`` is the running attempt's (``None`` between attempts); ``uptime`` the running
    attempt's seconds so far; ``reasons`` why each ended attempt ended.
    """

    rank: int
    state: WorkerState
    pid: int | None
    restarts: int
    attempts: int
    start_failures: int
    uptime: float | None
    reasons: tuple[ExitReason, ...]


@dataclass(frozen=True, slots=True)
class SupervisorState:
    """A snapshot of a supervisor: plain typed data (see :meth:`Supervisor.get_state`)."""

    state: Lifecycle
    run_id: str
    command: tuple[str, ...]
    policy: RestartPolicy
    fifo: Path | None
    restarts_in_window: int
    workers: tuple[WorkerSnapshot, ...]
    outcome: RunOutcome | None
    gave_up: str | None
    server: ServerState | None


@dataclass(frozen=True, slots=True)
class WorkerFailure:
    """A worker exit that calls for a restart (or a give-up): given to the coordinator."""

    rank: int
    pid: int
    reason: ExitReason
    start_failure: bool


class RestartCoordinator(Protocol):
    """Who carries out the planner's restart decisions.

    The local default, :class:`LocalCoordinator`, returns the proposal unchanged. A
    job-wide coordinator (restarts across nodes) may return another decision, or
    ``None`` to defer: it then calls :meth:`Supervisor.restart_workers` (with the
    job-wide restart count) or :meth:`Supervisor.give_up` when the job decides. It may
    run as long as it needs; the supervisor keeps serving meanwhile.
    """

    async def decide(
        self, supervisor: Supervisor, failure: WorkerFailure, proposal: Decision
    ) -> Decision | None:
        """The decision to carry out for ``failure`` (``proposal`` is the local one)."""
        ...


class LocalCoordinator:
    """The default :class:`RestartCoordinator`: the local restart policy decides."""

    async def decide(
        self, supervisor: Supervisor, failure: WorkerFailure, proposal: Decision
    ) -> Decision | None:
        """Return ``proposal``."""
        return proposal


def format_summary(workers: Sequence[WorkerSummary]) -> str:
    """The final summary as a table: one row per worker."""
    rows = [("rank", "state", "attempts", "start failures", "uptime", "exits")]
    for w in workers:
        exits = "; ".join(w.reasons) or "-"
        rows.append(
            (
                str(w.rank),
                w.state,
                str(w.attempts),
                str(w.start_failures),
                f"{w.uptime:.1f}s",
                exits,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for r in rows:
        cells = [c.ljust(widths[i]) for i, c in enumerate(r[:-1])]
        lines.append("  ".join([*cells, r[-1]]))
    return "\n".join(lines) + "\n"
