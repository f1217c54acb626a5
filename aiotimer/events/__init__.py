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

The records are defined by family in ``aiotimer.events._*``; this module is their public
face. Besides the events: :class:`ServerCounters` (a server run's counts, also in
:class:`ServerStopped`) and :class:`RankStatus` (one supervised rank, as
:class:`SupervisorStopped` reports it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from aiotimer._faces import face_getattr
from aiotimer.events._base import (
    MAX_LOGGED_TEXT,
    MAX_REPORTED_SCOPES,
    Event,
    clip_text,
    holding_task,
    signal_name,
)
from aiotimer.events._learned import LearnedWouldReap
from aiotimer.events._reaping import (
    ReapAbandoned,
    ReapFailed,
    SignalRefused,
    SignalSent,
    StacksDumped,
    WorkerReaped,
    WorkerSurvived,
)
from aiotimer.events._server import (
    ControlRefused,
    EventsLost,
    LoopLagged,
    ServerCounters,
    ServerStarted,
    ServerStopped,
    SourceFailed,
)
from aiotimer.events._straggler import StragglerDetected, StragglerRecovered
from aiotimer.events._supervisor import (
    HangReported,
    RankStatus,
    RestartScheduled,
    SupervisorGaveUp,
    SupervisorStopped,
    WorkerEnded,
    WorkerRunning,
    WorkerStarted,
    WorkerState,
    exit_phrase,
)
from aiotimer.events._timers import (
    BlockCancelled,
    RequestRejected,
    TimerAcquired,
    TimerEvicted,
    TimerExpired,
    TimerReleased,
    WorkerExited,
    WorkerUnknown,
)
from aiotimer.events._workers import WorkerInfo, by_rank

if TYPE_CHECKING:
    from aiotimer.events._base import MAX_LINE_SCOPE, clip, clip_scope

__all__ = [
    "MAX_LINE_SCOPE",
    "MAX_LOGGED_TEXT",
    "MAX_REPORTED_SCOPES",
    "BlockCancelled",
    "ControlRefused",
    "Event",
    "EventsLost",
    "HangReported",
    "LearnedWouldReap",
    "LoopLagged",
    "RankStatus",
    "ReapAbandoned",
    "ReapFailed",
    "RequestRejected",
    "RestartScheduled",
    "ServerCounters",
    "ServerStarted",
    "ServerStopped",
    "SignalRefused",
    "SignalSent",
    "SourceFailed",
    "StacksDumped",
    "StragglerDetected",
    "StragglerRecovered",
    "SupervisorGaveUp",
    "SupervisorStopped",
    "TimerAcquired",
    "TimerEvicted",
    "TimerExpired",
    "TimerReleased",
    "WorkerEnded",
    "WorkerExited",
    "WorkerInfo",
    "WorkerReaped",
    "WorkerRunning",
    "WorkerStarted",
    "WorkerState",
    "WorkerSurvived",
    "WorkerUnknown",
    "by_rank",
    "clip",
    "clip_scope",
    "clip_text",
    "exit_phrase",
    "holding_task",
    "signal_name",
]

_LAZY: Final[dict[str, str]] = {
    "MAX_LINE_SCOPE": "aiotimer.events._base",
    "clip": "aiotimer.events._base",
    "clip_scope": "aiotimer.events._base",
}

__getattr__, __dir__ = face_getattr("aiotimer.events", globals(), lazy=_LAZY)
