"""aiotimer: an asyncio-native expiration-timer service (watchdog) for worker processes.

A worker wraps risky work in ``with expires(after=10):`` or ``async with
expires(after=10):``; a :class:`TimerServer` in another process keeps a heap of deadlines
and, when one passes, reaps the worker through an injectable :class:`Reaper`. The wire
protocol is torch's (``torch.distributed.elastic.timer``), so torch clients and servers
interoperate; :mod:`aiotimer.compat.torch` offers torch's names as a drop-in.

Public submodules: :mod:`aiotimer.client`, :mod:`aiotimer.server`, :mod:`aiotimer.events`,
:mod:`aiotimer.errors`, :mod:`aiotimer.reapers`, :mod:`aiotimer.sources`,
:mod:`aiotimer.watchdog`, :mod:`aiotimer.diagnostics`, :mod:`aiotimer.testing`,
:mod:`aiotimer.supervisor`,
:mod:`aiotimer.compat.torch`. Modules whose names start with ``_`` are private.
"""

from __future__ import annotations

from aiotimer import events
from aiotimer._clock import Clock, MonotonicClock
from aiotimer._launch import Launch, Launcher, launched
from aiotimer._policy import Escalation, ReapPolicy
from aiotimer._protocol import (
    PIPE_BUF,
    Decoded,
    LineDecoder,
    Rejection,
    Request,
    RequestTooLargeError,
    encode,
)
from aiotimer._restart import (
    Backoff,
    ExitKind,
    ExitReason,
    RestartPolicy,
    RestartScope,
    WorkerState,
)
from aiotimer._stats import DurationStats, SiteSummary
from aiotimer._table import Timer, TimerKey, TimerTable
from aiotimer.client import (
    Expires,
    FifoClient,
    InProcessClient,
    QueueClient,
    TimerClient,
    configure,
    current_client,
    expires,
    expires_at,
    under_timer_server,
    use_client,
)
from aiotimer.errors import (
    AiotimerError,
    ClientBackpressureError,
    LaunchError,
    NotConfiguredError,
    ProcessGoneError,
    ReapError,
    RefusedTargetError,
    ServerStateError,
    ServerUnavailableError,
    SourceError,
)
from aiotimer.events import Event
from aiotimer.reapers import Reaper, SignalReaper
from aiotimer.server import (
    Counters,
    Lifecycle,
    ReapRetry,
    ServerState,
    TimerServer,
    TimerServerThread,
)
from aiotimer.sources import FifoSource, QueueSource, RequestSink, SocketSource, Source
from aiotimer.supervisor import RunOutcome, Supervisor, SupervisorState, WorkerSnapshot
from aiotimer.watchdog import Watchdog, watchdog

__version__ = "0.1.0"

__all__ = [
    "PIPE_BUF",
    "AiotimerError",
    "Backoff",
    "ClientBackpressureError",
    "Clock",
    "Counters",
    "Decoded",
    "DurationStats",
    "Escalation",
    "Event",
    "ExitKind",
    "ExitReason",
    "Expires",
    "FifoClient",
    "FifoSource",
    "InProcessClient",
    "Launch",
    "LaunchError",
    "Launcher",
    "Lifecycle",
    "LineDecoder",
    "MonotonicClock",
    "NotConfiguredError",
    "ProcessGoneError",
    "QueueClient",
    "QueueSource",
    "ReapError",
    "ReapPolicy",
    "ReapRetry",
    "Reaper",
    "RefusedTargetError",
    "Rejection",
    "Request",
    "RequestSink",
    "RequestTooLargeError",
    "RestartPolicy",
    "RestartScope",
    "RunOutcome",
    "ServerState",
    "ServerStateError",
    "ServerUnavailableError",
    "SignalReaper",
    "SiteSummary",
    "SocketSource",
    "Source",
    "SourceError",
    "Supervisor",
    "SupervisorState",
    "Timer",
    "TimerClient",
    "TimerKey",
    "TimerServer",
    "TimerServerThread",
    "TimerTable",
    "Watchdog",
    "WorkerSnapshot",
    "WorkerState",
    "__version__",
    "configure",
    "current_client",
    "encode",
    "events",
    "expires",
    "expires_at",
    "launched",
    "under_timer_server",
    "use_client",
    "watchdog",
]
