"""aiotimer: an asyncio-native expiration-timer service (watchdog) for worker processes.

A worker wraps risky work in ``with expires(after=10):`` / ``async with expires(after=10):``;
a timer server in another process keeps a heap of deadlines and reaps the worker when one
passes. Wire-compatible with ``torch.distributed.elastic.timer``.
"""

from __future__ import annotations

from aiotimer._clock import Clock, MonotonicClock
from aiotimer._protocol import (
    PIPE_BUF,
    Decoded,
    LineDecoder,
    Rejection,
    Request,
    RequestTooLargeError,
    encode,
)
from aiotimer._table import Timer, TimerKey, TimerTable

__version__ = "0.1.0"

__all__ = [
    "PIPE_BUF",
    "Clock",
    "Decoded",
    "LineDecoder",
    "MonotonicClock",
    "Rejection",
    "Request",
    "RequestTooLargeError",
    "Timer",
    "TimerKey",
    "TimerTable",
    "__version__",
    "encode",
]
