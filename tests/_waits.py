"""Bounded waits for tests that watch a server running in another thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from aiotimer.events import Event

__all__ = ["WAIT", "Events", "wait_until"]

#: Generous bound for "the server handled it" waits on a busy 2-core machine.
WAIT = 10.0


def wait_until(predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    """Poll ``predicate`` until true; fail the test after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            pytest.fail(f"condition not met within {timeout}s")
        time.sleep(0.005)


class Events:
    """A thread-safe ``on_event`` recorder."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[Event] = []

    def __call__(self, event: Event) -> None:
        with self._lock:
            self._events.append(event)

    def of(self, kind: type[Event]) -> list[Any]:
        with self._lock:
            return [e for e in self._events if isinstance(e, kind)]

    def wait_for(self, kind: type[Event], count: int = 1, timeout: float = WAIT) -> list[Any]:
        wait_until(lambda: len(self.of(kind)) >= count, timeout)
        return self.of(kind)
