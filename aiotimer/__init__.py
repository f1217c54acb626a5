"""aiotimer: an asyncio-native expiration-timer service (watchdog) for worker processes.

A worker wraps risky work in ``with expires(after=10):`` or ``async with
expires(after=10):``; a :class:`TimerServer` in another process keeps a heap of deadlines
and, when one passes, reaps the worker through an injectable :class:`Reaper`. The wire
protocol is torch's (``torch.distributed.elastic.timer``), so torch clients and servers
interoperate; :mod:`aiotimer.compat.torch` offers torch's names as a drop-in.

This module holds what a user writes: the worker side, the server, the supervisor and the
errors worth catching. Everything else lives in its documented submodule:
:mod:`aiotimer.client` (transports, launch detection), :mod:`aiotimer.server` (counters,
lifecycle and snapshot records), :mod:`aiotimer.supervisor` (its records and states),
:mod:`aiotimer.sources` (the sources and their sink protocol), :mod:`aiotimer.reapers`,
:mod:`aiotimer.events`, :mod:`aiotimer.errors` (every error), :mod:`aiotimer.core` (the
timer table and duration statistics), :mod:`aiotimer.wire` (the line codec),
:mod:`aiotimer.watchdog`, :mod:`aiotimer.diagnostics`, :mod:`aiotimer.testing`,
:mod:`aiotimer.control` (control socket, status, metrics), :mod:`aiotimer.cluster` and
:mod:`aiotimer.compat.torch`. Modules whose names start with ``_`` are private.

Importing the package is cheap: every public name is loaded on first use, so
``from aiotimer import expires`` in a worker loads the client and the wire codec, not the
server, its sources, anyio or the event log.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from aiotimer._faces import face_getattr

if TYPE_CHECKING:
    from aiotimer import events
    from aiotimer._edges.clock import Clock, MonotonicClock
    from aiotimer.client import (
        Expires,
        FifoClient,
        InProcessClient,
        LaunchInfo,
        QueueClient,
        TimerClient,
        configure,
        current_client,
        expires,
        expires_at,
        launch_info,
        learned,
        timer_server_configured,
        use_client,
    )
    from aiotimer.errors import (
        AiotimerError,
        ClientBackpressureError,
        NotConfiguredError,
        ReapError,
        ServerStateError,
        ServerUnavailableError,
        SourceError,
    )
    from aiotimer.events import Event
    from aiotimer.reapers import Escalation, KillPolicy, Reaper, ReapPolicy, SignalReaper
    from aiotimer.server import ReapRetry, TimerServer, TimerServerThread
    from aiotimer.supervisor import Backoff, RestartPolicy, RestartScope, RunOutcome, Supervisor
    from aiotimer.wire import Request

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
    # the worker side
    "Expires": "aiotimer.client",
    "FifoClient": "aiotimer.client",
    "InProcessClient": "aiotimer.client",
    "LaunchInfo": "aiotimer.client",
    "QueueClient": "aiotimer.client",
    "TimerClient": "aiotimer.client",
    "configure": "aiotimer.client",
    "current_client": "aiotimer.client",
    "expires": "aiotimer.client",
    "expires_at": "aiotimer.client",
    "launch_info": "aiotimer.client",
    "learned": "aiotimer.client",
    "timer_server_configured": "aiotimer.client",
    "use_client": "aiotimer.client",
    # the server
    "Clock": "aiotimer._edges.clock",
    "MonotonicClock": "aiotimer._edges.clock",
    "Escalation": "aiotimer.reapers",
    "KillPolicy": "aiotimer.reapers",
    "ReapPolicy": "aiotimer.reapers",
    "Reaper": "aiotimer.reapers",
    "SignalReaper": "aiotimer.reapers",
    "ReapRetry": "aiotimer.server",
    "TimerServer": "aiotimer.server",
    "TimerServerThread": "aiotimer.server",
    "Request": "aiotimer.wire",
    "Event": "aiotimer.events",
    "events": "aiotimer.events",
    # the supervisor
    "Backoff": "aiotimer.supervisor",
    "RestartPolicy": "aiotimer.supervisor",
    "RestartScope": "aiotimer.supervisor",
    "RunOutcome": "aiotimer.supervisor",
    "Supervisor": "aiotimer.supervisor",
    # the errors a user catches
    "AiotimerError": "aiotimer.errors",
    "ClientBackpressureError": "aiotimer.errors",
    "NotConfiguredError": "aiotimer.errors",
    "ReapError": "aiotimer.errors",
    "ServerStateError": "aiotimer.errors",
    "ServerUnavailableError": "aiotimer.errors",
    "SourceError": "aiotimer.errors",
}


__getattr__, __dir__ = face_getattr("aiotimer", globals(), lazy=_LAZY)

__all__ = [
    "AiotimerError",
    "Backoff",
    "ClientBackpressureError",
    "Clock",
    "Escalation",
    "Event",
    "Expires",
    "FifoClient",
    "InProcessClient",
    "KillPolicy",
    "LaunchInfo",
    "LoopWatchdog",
    "MonotonicClock",
    "NotConfiguredError",
    "QueueClient",
    "ReapError",
    "ReapPolicy",
    "ReapRetry",
    "Reaper",
    "Request",
    "RestartPolicy",
    "RestartScope",
    "RunOutcome",
    "ServerStateError",
    "ServerUnavailableError",
    "SignalReaper",
    "SourceError",
    "Supervisor",
    "TimerClient",
    "TimerServer",
    "TimerServerThread",
    "Watchdog",
    "__version__",
    "configure",
    "current_client",
    "events",
    "expires",
    "expires_at",
    "launch_info",
    "learned",
    "loop_watchdog",
    "timer_server_configured",
    "use_client",
    "watchdog",
]
