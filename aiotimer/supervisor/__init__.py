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

from typing import TYPE_CHECKING, Final

from aiotimer._faces import face_getattr
from aiotimer.events import RankStatus
from aiotimer.supervisor._exits import ExitKind, ExitReason
from aiotimer.supervisor._restart import Backoff, RestartPolicy, RestartScope, WorkerState

if TYPE_CHECKING:
    from aiotimer.supervisor._exits import attempt_story, ending_word
    from aiotimer.supervisor._guard import start_guard
    from aiotimer.supervisor._records import SupervisorActions
    from aiotimer.supervisor._restart import DEFAULT_NO_RESTART_EXIT_CODES
    from aiotimer.supervisor._runfile import runs_dir, runtime_parent
    from aiotimer.supervisor._stragglers import ON_STRAGGLER
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
    "DEFAULT_NO_RESTART_EXIT_CODES",
    "ON_STRAGGLER",
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
    "SupervisorActions",
    "SupervisorState",
    "WorkerFailure",
    "WorkerState",
    "attempt_story",
    "ending_word",
    "format_summary",
    "runs_dir",
    "runtime_parent",
    "start_guard",
]

_LAZY: Final[dict[str, str]] = {
    "WORKER_ENV": "aiotimer.supervisor._supervisor",
    "Decision": "aiotimer.supervisor._supervisor",
    "GiveUp": "aiotimer.supervisor._supervisor",
    "LocalCoordinator": "aiotimer.supervisor._supervisor",
    "Restart": "aiotimer.supervisor._supervisor",
    "RestartCoordinator": "aiotimer.supervisor._supervisor",
    "RunOutcome": "aiotimer.supervisor._supervisor",
    "Supervisor": "aiotimer.supervisor._supervisor",
    "SupervisorState": "aiotimer.supervisor._supervisor",
    "WorkerFailure": "aiotimer.supervisor._supervisor",
    "format_summary": "aiotimer.supervisor._supervisor",
    "DEFAULT_NO_RESTART_EXIT_CODES": "aiotimer.supervisor._restart",
    "ON_STRAGGLER": "aiotimer.supervisor._stragglers",
    "SupervisorActions": "aiotimer.supervisor._records",
    "attempt_story": "aiotimer.supervisor._exits",
    "ending_word": "aiotimer.supervisor._exits",
    "runs_dir": "aiotimer.supervisor._runfile",
    "runtime_parent": "aiotimer.supervisor._runfile",
    "start_guard": "aiotimer.supervisor._guard",
}

__getattr__, __dir__ = face_getattr("aiotimer.supervisor", globals(), lazy=_LAZY)
