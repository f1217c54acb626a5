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
    from aiotimer.core._blocks import BlockTimes
    from aiotimer.core._fold import Fold, fold, paired_blocks
    from aiotimer.core._latency import LatencyHistogram
    from aiotimer.core._learned import LearnedScopeState, LearnedSummary, LearnedTimeouts
    from aiotimer.core._scope import (
        current_pid,
        default_scope,
        scope_at_site,
        scope_site,
        with_task,
    )
    from aiotimer.core._stats import DurationStats, Overdue, ScopeStats, StatsState
    from aiotimer.core._stats_format import format_seconds, format_summaries
    from aiotimer.core._straggler import (
        MIN_EXCESS,
        THRESHOLD,
        StragglerChange,
        StragglerDetector,
        Timing,
        compare_ranks,
    )
    from aiotimer.core._table import TimerTable
    from aiotimer.core._timer import Timer, TimerKey

_LAZY: Final[dict[str, str]] = {
    "BlockTimes": "aiotimer.core._blocks",
    "Fold": "aiotimer.core._fold",
    "LearnedScopeState": "aiotimer.core._learned",
    "LearnedSummary": "aiotimer.core._learned",
    "LearnedTimeouts": "aiotimer.core._learned",
    "MIN_EXCESS": "aiotimer.core._straggler",
    "Overdue": "aiotimer.core._stats",
    "StragglerChange": "aiotimer.core._straggler",
    "StragglerDetector": "aiotimer.core._straggler",
    "THRESHOLD": "aiotimer.core._straggler",
    "Timing": "aiotimer.core._straggler",
    "compare_ranks": "aiotimer.core._straggler",
    "current_pid": "aiotimer.core._scope",
    "default_scope": "aiotimer.core._scope",
    "format_seconds": "aiotimer.core._stats_format",
    "format_summaries": "aiotimer.core._stats_format",
    "scope_at_site": "aiotimer.core._scope",
    "scope_site": "aiotimer.core._scope",
    "with_task": "aiotimer.core._scope",
    "DurationStats": "aiotimer.core._stats",
    "LatencyHistogram": "aiotimer.core._latency",
    "ScopeStats": "aiotimer.core._stats",
    "StatsState": "aiotimer.core._stats",
    "Timer": "aiotimer.core._timer",
    "TimerKey": "aiotimer.core._timer",
    "TimerTable": "aiotimer.core._table",
    "fold": "aiotimer.core._fold",
    "paired_blocks": "aiotimer.core._fold",
}

__getattr__, __dir__ = face_getattr("aiotimer.core", globals(), lazy=_LAZY)

__all__ = [
    "MIN_EXCESS",
    "THRESHOLD",
    "BlockTimes",
    "DurationStats",
    "Fold",
    "LatencyHistogram",
    "LearnedScopeState",
    "LearnedSummary",
    "LearnedTimeouts",
    "Overdue",
    "ScopeStats",
    "StatsState",
    "StragglerChange",
    "StragglerDetector",
    "Timer",
    "TimerKey",
    "TimerTable",
    "Timing",
    "compare_ranks",
    "current_pid",
    "default_scope",
    "fold",
    "format_seconds",
    "format_summaries",
    "paired_blocks",
    "scope_at_site",
    "scope_site",
    "with_task",
]
