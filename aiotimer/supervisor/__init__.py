"""The supervisor: launch workers under a timer server, restart them under a policy
(``aiotimer run``).

:class:`Supervisor` runs the ranks; :class:`RestartPolicy` (with its :class:`RestartScope`
and :class:`Backoff`) says when to restart them; :meth:`Supervisor.get_state` returns a
:class:`SupervisorState` with one :class:`RankStatus` per rank (its :class:`WorkerState`,
pid, restarts, attempts and why each ended: an :class:`ExitReason` of an
:class:`ExitKind`, in words); :class:`RunOutcome` is how the run ended. A
:class:`RestartCoordinator` carries out the restart decisions (job-wide restarts plug
in there).
"""

from __future__ import annotations

from aiotimer._faces import face_getattr
from aiotimer.events import RankStatus
from aiotimer.supervisor._exits import ExitKind, ExitReason
from aiotimer.supervisor._restart import Backoff, RestartPolicy, RestartScope, WorkerState
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
    format_summary,
)

__all__ = [
    "WORKER_ENV",
    "Backoff",
    "Decision",
    "ExitKind",
    "ExitReason",
    "GiveUp",
    "LocalCoordinator",
    "RankStatus",
    "Restart",
    "RestartCoordinator",
    "RestartPolicy",
    "RestartScope",
    "RunOutcome",
    "Supervisor",
    "SupervisorState",
    "WorkerFailure",
    "WorkerState",
    "format_summary",
]

__getattr__, __dir__ = face_getattr("aiotimer.supervisor", globals())
