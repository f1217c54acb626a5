"""The control plane: a server's live state over HTTP/1.1 + JSON on a Unix socket.

A layer on top of the timer server, composed by its owner: :class:`ControlPlane` wraps
a :class:`~aiotimer.TimerServer` (or a :class:`~aiotimer.Supervisor`) and serves its
control socket (by default ``<fifo>.control/http.sock``, named in the marker beside the
FIFO) with:

* ``GET /v1/state[?limit=N]``: a :class:`StatusSnapshot` (server, workers, timers,
  counters, per-scope statistics; lists cut at ``limit`` with exact totals);
* ``GET /v1/events[?since=N&limit=N]``: an :class:`EventPage` of recent events;
* ``GET /metrics``: Prometheus text format (see :mod:`aiotimer.control.metrics`), also
  over TCP on ``127.0.0.1`` with ``metrics_port``;
* ``POST /v1/workers/<pid>/dump[?timeout=S]``: a stack dump of a worker;
* over a supervisor, ``POST /v1/ranks/<rank>/restart`` and ``.../stop``.

Only the server's own user and root may connect (``SO_PEERCRED``); ``curl
--unix-socket PATH http://localhost/v1/state`` works. Every listener caps its
connections, closes idle ones and survives ``accept()`` failing; nothing that happens to
the control plane stops or slows the server's reaping. :class:`ControlClient` is the
blocking client ``aiotimer status`` uses; :class:`ControlServer` and :class:`Route` let
a layer on top serve its own routes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from aiotimer._faces import face_getattr
from aiotimer.control._paths import default_control_path
from aiotimer.control.client import ControlClient, control_path_for_fifo
from aiotimer.control.snapshot import (
    API_VERSION,
    EventPage,
    ServerInfo,
    StatusSnapshot,
    SupervisorInfo,
    TimerInfo,
    WorkerInfo,
)

if TYPE_CHECKING:
    from aiotimer.control._format import format_status
    from aiotimer.control._history import HistoryReader, format_history, history_dict
    from aiotimer.control._paths import MAX_SOCKET_PATH, fits_socket
    from aiotimer.control._plane import ControlPlane
    from aiotimer.control.server import ControlServer, Route

__all__ = [
    "API_VERSION",
    "MAX_SOCKET_PATH",
    "ControlClient",
    "ControlPlane",
    "ControlServer",
    "EventPage",
    "HistoryReader",
    "Route",
    "ServerInfo",
    "StatusSnapshot",
    "SupervisorInfo",
    "TimerInfo",
    "WorkerInfo",
    "control_path_for_fifo",
    "default_control_path",
    "fits_socket",
    "format_history",
    "format_status",
    "history_dict",
]

_LAZY: Final[dict[str, str]] = {
    "ControlPlane": "aiotimer.control._plane",
    "ControlServer": "aiotimer.control.server",
    "HistoryReader": "aiotimer.control._history",
    "MAX_SOCKET_PATH": "aiotimer.control._paths",
    "fits_socket": "aiotimer.control._paths",
    "format_history": "aiotimer.control._history",
    "format_status": "aiotimer.control._format",
    "Route": "aiotimer.control.server",
    "history_dict": "aiotimer.control._history",
}

__getattr__, __dir__ = face_getattr("aiotimer.control", globals(), lazy=_LAZY)
