"""The pure cores of the server: no I/O, no clock reads, no event loop.

* :class:`TimerTable` — every live timer ordered by deadline (a heap with lazy deletion);
* :class:`DurationStats` — per-scope-site duration statistics and suggested timeouts;
* :class:`LatencyHistogram` — a fixed-bucket histogram in the Prometheus shape;
* :func:`fold` — which requests of one batch need the table at all.

The server (:mod:`aiotimer.server`) feeds them; they are documented and tested on their
own, and can be used to build other servers.
"""

from __future__ import annotations

from aiotimer._faces import face_getattr
from aiotimer.core._fold import fold
from aiotimer.core._latency import LatencyHistogram
from aiotimer.core._stats import DurationStats, ScopeStats
from aiotimer.core._table import ReapOptions, Timer, TimerKey, TimerTable

__all__ = [
    "DurationStats",
    "LatencyHistogram",
    "ReapOptions",
    "ScopeStats",
    "Timer",
    "TimerKey",
    "TimerTable",
    "fold",
]

__getattr__, __dir__ = face_getattr(
    "aiotimer.core", globals(), moved={"SiteSummary": "aiotimer.core.ScopeStats"}
)
