"""aiotimer: an asyncio-native expiration-timer service (watchdog) for worker processes.

A worker wraps risky work in ``with expires(after=10):`` or ``async with
expires(after=10):``; a :class:`TimerServer` in another process keeps a heap of deadlines
and, when one passes, reaps the worker through an injectable :class:`Reaper`. The wire
protocol is torch's (``torch.distributed.elastic.timer``), so torch clients and servers
interoperate; :mod:`aiotimer.compat.torch` offers torch's names as a drop-in.

Public submodules: :mod:`aiotimer.client`, :mod:`aiotimer.server`, :mod:`aiotimer.events`,
:mod:`aiotimer.errors`, :mod:`aiotimer.reapers`, :mod:`aiotimer.sources`,
:mod:`aiotimer.watchdog`, :mod:`aiotimer.diagnostics`, :mod:`aiotimer.testing`,
:mod:`aiotimer.compat.torch`. Modules whose names start with ``_`` are private.
"""

from __future__ import annotations

from aiotimer import events
from aiotimer._clock import Clock, MonotonicClock
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
from aiotimer.watchdog import Watchdog, watchdog

__version__ = "0.1.0"

__all__ = [
    "PIPE_BUF",
    "AiotimerError",
    "ClientBackpressureError",
    "Clock",
    "Counters",
    "Decoded",
    "DurationStats",
    "Escalation",
    "Event",
    "Expires",
    "FifoClient",
    "FifoSource",
    "InProcessClient",
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
    "ServerState",
    "ServerStateError",
    "ServerUnavailableError",
    "SignalReaper",
    "SiteSummary",
    "SocketSource",
    "Source",
    "SourceError",
    "Timer",
    "TimerClient",
    "TimerKey",
    "TimerServer",
    "TimerServerThread",
    "TimerTable",
    "Watchdog",
    "__version__",
    "configure",
    "current_client",
    "encode",
    "events",
    "expires",
    "expires_at",
    "under_timer_server",
    "use_client",
    "watchdog",
]
