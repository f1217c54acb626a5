"""Reapers: how the server acts on a worker whose timer expired."""

from __future__ import annotations

from aiotimer.reapers._signal import (
    NoDump,
    Reaper,
    SignalReaper,
)

__all__ = [
    "NoDump",
    "Reaper",
    "SignalReaper",
]
