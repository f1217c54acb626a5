"""Reapers: how the server acts on a worker whose timer expired.

A :class:`Reaper` carries out a reap (the default, :class:`SignalReaper`, signals the
pinned process); a :class:`ReapPolicy` (an :class:`Escalation` ladder, or the signal each
request names) says which signals to send and when; a :class:`KillPolicy` says which
targets may be signalled at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from aiotimer._faces import face_getattr
from aiotimer.reapers._kill_policy import KillPolicy
from aiotimer.reapers._policy import Escalation, ReapPolicy

if TYPE_CHECKING:
    from aiotimer.reapers._dumps import (
        HookInfo,
        collect_dump,
        hook_info,
        prepare_dump,
        py_spy_dump,
        py_spy_dump_or_why,
        py_spy_executable,
        read_dump,
        read_dump_or_why,
    )
    from aiotimer.reapers._escalator import ReapRetry
    from aiotimer.reapers._identity import PinnedProcess
    from aiotimer.reapers._kill_policy import fifo_mode_warning
    from aiotimer.reapers._left_dumps import MAX_KEPT_DUMPS
    from aiotimer.reapers._reaps import DUMP_SLACK, Reap, Reaps
    from aiotimer.reapers._signal import (
        NoDump,
        Reaper,
        SignalReaper,
    )
    from aiotimer.reapers._steps import DumpStacks, Step, format_plan
    from aiotimer.reapers._watch import Watchlist, WatchState

__all__ = [
    "DUMP_SLACK",
    "MAX_KEPT_DUMPS",
    "DumpStacks",
    "Escalation",
    "HookInfo",
    "KillPolicy",
    "NoDump",
    "PinnedProcess",
    "Reap",
    "ReapPolicy",
    "ReapRetry",
    "Reaper",
    "Reaps",
    "SignalReaper",
    "Step",
    "WatchState",
    "Watchlist",
    "collect_dump",
    "fifo_mode_warning",
    "format_plan",
    "hook_info",
    "prepare_dump",
    "py_spy_dump",
    "py_spy_dump_or_why",
    "py_spy_executable",
    "read_dump",
    "read_dump_or_why",
]

_LAZY: Final[dict[str, str]] = {
    "NoDump": "aiotimer.reapers._dumps",
    "Reaper": "aiotimer.reapers._signal",
    "SignalReaper": "aiotimer.reapers._signal",
    "DUMP_SLACK": "aiotimer.reapers._reaps",
    "DumpStacks": "aiotimer.reapers._steps",
    "HookInfo": "aiotimer.reapers._dumps",
    "MAX_KEPT_DUMPS": "aiotimer.reapers._left_dumps",
    "PinnedProcess": "aiotimer.reapers._identity",
    "Reap": "aiotimer.reapers._reaps",
    "ReapRetry": "aiotimer.reapers._escalator",
    "Reaps": "aiotimer.reapers._reaps",
    "Step": "aiotimer.reapers._steps",
    "WatchState": "aiotimer.reapers._watch",
    "Watchlist": "aiotimer.reapers._watch",
    "collect_dump": "aiotimer.reapers._dumps",
    "fifo_mode_warning": "aiotimer.reapers._kill_policy",
    "format_plan": "aiotimer.reapers._steps",
    "hook_info": "aiotimer.reapers._dumps",
    "prepare_dump": "aiotimer.reapers._dumps",
    "py_spy_dump": "aiotimer.reapers._dumps",
    "py_spy_dump_or_why": "aiotimer.reapers._dumps",
    "py_spy_executable": "aiotimer.reapers._dumps",
    "read_dump": "aiotimer.reapers._dumps",
    "read_dump_or_why": "aiotimer.reapers._dumps",
}

__getattr__, __dir__ = face_getattr("aiotimer.reapers", globals(), lazy=_LAZY)
