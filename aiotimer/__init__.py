"""aiotimer: an asyncio-native expiration-timer service (watchdog) for worker processes.

A worker wraps risky work in ``with expires(after=10):`` or ``async with
expires(after=10):``; a :class:`TimerServer` in another process keeps a heap of deadlines
and, when one passes, reaps the worker through an injectable :class:`Reaper`. The wire
protocol is torch's (``torch.distributed.elastic.timer``), so torch clients and servers
interoperate; :mod:`aiotimer.compat.torch` offers torch's names as a drop-in.

Public submodules: :mod:`aiotimer.client`, :mod:`aiotimer.server`, :mod:`aiotimer.events`,
:mod:`aiotimer.errors`, :mod:`aiotimer.reapers`, :mod:`aiotimer.sources`,
:mod:`aiotimer.watchdog`, :mod:`aiotimer.diagnostics`, :mod:`aiotimer.testing`,
:mod:`aiotimer.supervisor`, :mod:`aiotimer.cluster`, :mod:`aiotimer.compat.torch`,
:mod:`aiotimer.control` (control socket, status, metrics). Modules whose names start with
``_`` are private.

Importing the package is cheap: every public name is loaded on first use (a module
``__getattr__``), so ``from aiotimer import expires`` in a worker loads the client and
the wire codec, not the server, its sources, anyio or the event log.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from aiotimer._faces import face_getattr

if TYPE_CHECKING:
    from aiotimer import events
    from aiotimer._edges.clock import Clock, MonotonicClock
    from aiotimer.client._expires import (
        Expires,
        FifoClient,
        InProcessClient,
        QueueClient,
        TimerClient,
        configure,
        current_client,
        expires,
        expires_at,
        timer_server_configured,
        use_client,
    )
    from aiotimer.client._launch import Launcher, LaunchInfo, launch_info
    from aiotimer.core._stats import DurationStats, ScopeStats
    from aiotimer.core._table import Timer, TimerKey, TimerTable
    from aiotimer.errors import (
        AiotimerError,
        ClientBackpressureError,
        ClusterError,
        LaunchError,
        LeaseLostError,
        MissingExtraError,
        NodeNameTakenError,
        NotConfiguredError,
        ProcessGoneError,
        ReapError,
        RefusedTargetError,
        ServerStateError,
        ServerUnavailableError,
        SourceError,
        StoreUnavailableError,
    )
    from aiotimer.events import Event
    from aiotimer.reapers._kill_policy import KillPolicy
    from aiotimer.reapers._policy import Escalation, ReapPolicy
    from aiotimer.reapers._signal import Reaper, SignalReaper
    from aiotimer.server import (
        LifecycleState,
        ReapRetry,
        ServerCounters,
        ServerState,
        TimerServer,
        TimerServerThread,
    )
    from aiotimer.sources import FifoSource, QueueSource, RequestSink, SocketSource, Source
    from aiotimer.supervisor._exits import ExitKind, ExitReason
    from aiotimer.supervisor._restart import (
        Backoff,
        RestartPolicy,
        RestartScope,
        WorkerState,
    )
    from aiotimer.supervisor._supervisor import (
        RunOutcome,
        Supervisor,
        SupervisorState,
    )
    from aiotimer.wire import (
        PIPE_BUF,
        Decoded,
        LineDecoder,
        Rejection,
        Request,
        RequestTooLargeError,
        encode,
    )

from aiotimer._version import __version__

# Eager, unlike the rest: the function ``watchdog`` shares its name with the submodule
# ``aiotimer.watchdog``, and importing a submodule sets the package's attribute to it;
# bound here, after that import, the name is the function whatever is imported later.
from aiotimer.watchdog import LoopWatchdog, Watchdog, loop_watchdog, watchdog

# Library etiquette: a program that configures no logging sees no lines from aiotimer.
logging.getLogger("aiotimer").addHandler(logging.NullHandler())

#: Where each public name lives, imported when first asked for. A new public name is
#: added here, to the ``TYPE_CHECKING`` imports above (for type checkers and IDEs) and
#: to ``__all__``; tests/test_public_api.py checks that the three agree.
_LAZY: Final[dict[str, str]] = {
    "events": "aiotimer.events",
    "Clock": "aiotimer._edges.clock",
    "MonotonicClock": "aiotimer._edges.clock",
    "LaunchInfo": "aiotimer.client._launch",
    "Launcher": "aiotimer.client._launch",
    "launch_info": "aiotimer.client._launch",
    "Escalation": "aiotimer.reapers._policy",
    "ReapPolicy": "aiotimer.reapers._policy",
    "PIPE_BUF": "aiotimer.wire",
    "Decoded": "aiotimer.wire",
    "LineDecoder": "aiotimer.wire",
    "Rejection": "aiotimer.wire",
    "Request": "aiotimer.wire",
    "RequestTooLargeError": "aiotimer.wire",
    "encode": "aiotimer.wire",
    "Backoff": "aiotimer.supervisor._restart",
    "ExitKind": "aiotimer.supervisor._exits",
    "ExitReason": "aiotimer.supervisor._exits",
    "RestartPolicy": "aiotimer.supervisor._restart",
    "RestartScope": "aiotimer.supervisor._restart",
    "WorkerState": "aiotimer.supervisor._restart",
    "DurationStats": "aiotimer.core._stats",
    "ScopeStats": "aiotimer.core._stats",
    "Timer": "aiotimer.core._table",
    "TimerKey": "aiotimer.core._table",
    "TimerTable": "aiotimer.core._table",
    "Expires": "aiotimer.client",
    "FifoClient": "aiotimer.client",
    "InProcessClient": "aiotimer.client",
    "QueueClient": "aiotimer.client",
    "TimerClient": "aiotimer.client",
    "configure": "aiotimer.client",
    "current_client": "aiotimer.client",
    "expires": "aiotimer.client",
    "expires_at": "aiotimer.client",
    "timer_server_configured": "aiotimer.client",
    "use_client": "aiotimer.client",
    "AiotimerError": "aiotimer.errors",
    "ClientBackpressureError": "aiotimer.errors",
    "LaunchError": "aiotimer.errors",
    "NotConfiguredError": "aiotimer.errors",
    "ProcessGoneError": "aiotimer.errors",
    "ReapError": "aiotimer.errors",
    "RefusedTargetError": "aiotimer.errors",
    "ServerStateError": "aiotimer.errors",
    "ServerUnavailableError": "aiotimer.errors",
    "SourceError": "aiotimer.errors",
    "ClusterError": "aiotimer.errors",
    "LeaseLostError": "aiotimer.errors",
    "MissingExtraError": "aiotimer.errors",
    "NodeNameTakenError": "aiotimer.errors",
    "StoreUnavailableError": "aiotimer.errors",
    "Event": "aiotimer.events",
    "Reaper": "aiotimer.reapers",
    "SignalReaper": "aiotimer.reapers",
    "KillPolicy": "aiotimer.reapers._kill_policy",
    "ServerCounters": "aiotimer.server",
    "LifecycleState": "aiotimer.server",
    "ReapRetry": "aiotimer.server",
    "ServerState": "aiotimer.server",
    "TimerServer": "aiotimer.server",
    "TimerServerThread": "aiotimer.server",
    "FifoSource": "aiotimer.sources",
    "QueueSource": "aiotimer.sources",
    "RequestSink": "aiotimer.sources",
    "SocketSource": "aiotimer.sources",
    "Source": "aiotimer.sources",
    "RunOutcome": "aiotimer.supervisor",
    "Supervisor": "aiotimer.supervisor",
    "SupervisorState": "aiotimer.supervisor",
}


#: Names this module exported before, and their homes now (each use warns).
_MOVED: Final[dict[str, str]] = {
    "Counters": "aiotimer.server.ServerCounters",
    "Launch": "aiotimer.client.LaunchInfo",
    "Lifecycle": "aiotimer.server.LifecycleState",
    "SiteSummary": "aiotimer.core.ScopeStats",
    "WorkerSnapshot": "aiotimer.supervisor.RankStatus",
    "launched": "aiotimer.client.launch_info",
    "under_timer_server": "aiotimer.client.timer_server_configured",
}

__getattr__, __dir__ = face_getattr("aiotimer", globals(), lazy=_LAZY, moved=_MOVED)


__all__ = [
    "PIPE_BUF",
    "AiotimerError",
    "Backoff",
    "ClientBackpressureError",
    "Clock",
    "ClusterError",
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
    "KillPolicy",
    "LaunchError",
    "LaunchInfo",
    "Launcher",
    "LeaseLostError",
    "LifecycleState",
    "LineDecoder",
    "LoopWatchdog",
    "MissingExtraError",
    "MonotonicClock",
    "NodeNameTakenError",
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
    "ScopeStats",
    "ServerCounters",
    "ServerState",
    "ServerStateError",
    "ServerUnavailableError",
    "SignalReaper",
    "SocketSource",
    "Source",
    "SourceError",
    "StoreUnavailableError",
    "Supervisor",
    "SupervisorState",
    "Timer",
    "TimerClient",
    "TimerKey",
    "TimerServer",
    "TimerServerThread",
    "TimerTable",
    "Watchdog",
    "WorkerState",
    "__version__",
    "configure",
    "current_client",
    "encode",
    "events",
    "expires",
    "expires_at",
    "launch_info",
    "loop_watchdog",
    "timer_server_configured",
    "use_client",
    "watchdog",
]
