"""The pure cores of the server: no I/O, no clock reads, no event loop.

* :class:`TimerTable` — every live timer (a :class:`Timer`, keyed by a :class:`TimerKey`)
  ordered by deadline (a heap with lazy deletion);
* :class:`DurationStats` — per-scope-site duration statistics and suggested timeouts,
  read as one :class:`ScopeStats` per site and saved as a :class:`StatsState`;
* :class:`LatencyHistogram` — a fixed-bucket histogram in the Prometheus shape;
* :func:`fold` — which requests of one batch need the table at all.

The server (:mod:`aiotimer.server`) feeds them; they are documented and tested on their
own, and can be used to build other servers.

Each name is loaded on first use: the worker side imports only the scope naming
(``aiotimer.core._scope``), not the table or the statistics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from aiotimer._faces import face_getattr

if TYPE_CHECKING:
    from aiotimer.core._fold import fold
    from aiotimer.core._latency import LatencyHistogram
    from aiotimer.core._stats import DurationStats, ScopeStats, StatsState
    from aiotimer.core._table import TimerTable
    from aiotimer.core._timer import Timer, TimerKey

_LAZY: Final[dict[str, str]] = {
    "DurationStats": "aiotimer.core._stats",
    "LatencyHistogram": "aiotimer.core._latency",
    "ScopeStats": "aiotimer.core._stats",
    "StatsState": "aiotimer.core._stats",
    "Timer": "aiotimer.core._timer",
    "TimerKey": "aiotimer.core._timer",
    "TimerTable": "aiotimer.core._table",
    "fold": "aiotimer.core._fold",
}

__getattr__, __dir__ = face_getattr("aiotimer.core", globals(), lazy=_LAZY)

__all__ = [
    "DurationStats",
    "LatencyHistogram",
    "ScopeStats",
    "StatsState",
    "Timer",
    "TimerKey",
    "TimerTable",
    "fold",
]
