"""Reapers: how the server acts on a worker whose timer expired.

A :class:`Reaper` carries out a reap (the default, :class:`SignalReaper`, signals the
pinned process); a :class:`ReapPolicy` (an :class:`Escalation` ladder, or the signal each
request names) says which signals to send and when; a :class:`KillPolicy` says which
targets may be signalled at all.
"""

from __future__ import annotations

from aiotimer.reapers._kill_policy import KillPolicy
from aiotimer.reapers._policy import Escalation, ReapPolicy
from aiotimer.reapers._signal import (
    NoDump,
    Reaper,
    SignalReaper,
)

__all__ = [
    "Escalation",
    "KillPolicy",
    "NoDump",
    "ReapPolicy",
    "Reaper",
    "SignalReaper",
]
