"""Heartbeats: a timer that a loop keeps pushing forward.

>>> with watchdog(30) as wd:               # doctest: +SKIP
...     for batch in loader:
...         wd.beat()
"""

from __future__ import annotations

from aiotimer.client import (
    LoopWatchdog,
    Watchdog,
    loop_watchdog,
    watchdog,
)

__all__ = [
    "LoopWatchdog",
    "Watchdog",
    "loop_watchdog",
    "watchdog",
]
