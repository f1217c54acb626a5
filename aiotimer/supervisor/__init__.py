"""The supervisor: launch workers under a timer server, restart them under a policy
(``aiotimer run``).
"""

from __future__ import annotations

from aiotimer.supervisor._supervisor import (
    WORKER_ENV,
    Decision,
    GiveUp,
    LocalCoordinator,
    Restart,
    RestartCoordinator,
    RunOutcome,
    Supervisor,
    SupervisorState,
    WorkerFailure,
    WorkerSnapshot,
    format_summary,
)

__all__ = [
    "WORKER_ENV",
    "Decision",
    "GiveUp",
    "LocalCoordinator",
    "Restart",
    "RestartCoordinator",
    "RunOutcome",
    "Supervisor",
    "SupervisorState",
    "WorkerFailure",
    "WorkerSnapshot",
    "format_summary",
]
