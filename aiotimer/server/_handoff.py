"""Calls handed to the server's event loop from other threads, run in order by one task.

Other threads never touch loop-owned state: they append a call to a thread-safe deque
and wake the loop with ``call_soon_threadsafe``; one task of the server's task group
(:meth:`Handoff.run`) runs the calls in the order they were handed over. A call thus
runs inside a task, where anyio's primitives work (a plain loop callback is not a task:
anyio refuses to create events or cancel scopes there).

:meth:`Handoff.call_soon` does not wait (requests from ``acquire()``/``release()``);
:meth:`Handoff.call` waits for the result (snapshots, flushes), bounded by a timeout.
When the run ends (:meth:`Handoff.close`), calls still queued are dropped and their
waiters told so (:class:`~aiotimer.errors.ServerStateError`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.abc

from aiotimer.errors import ServerStateError

__all__ = ["Handoff"]

logger = logging.getLogger("aiotimer")

_T = TypeVar("_T")

_Call = tuple[Callable[[], object], "concurrent.futures.Future[object] | None"]


class Handoff:
    """The queue of calls from other threads into one run of the server's loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._calls: deque[_Call] = deque()
        self._lock = threading.Lock()
        self._closed = False
        self._wake: anyio.Event | None = None

    def call_soon(self, fn: Callable[[], object]) -> None:
        """Run ``fn()`` in the loop, after every call handed over before. Any thread.

        Raises:
            ServerStateError: the run has ended (or its loop is closed).
        """
        self._put((fn, None))

    def call(self, fn: Callable[[], _T], timeout: float) -> _T:
        """Run ``fn()`` in the loop and return its result (or raise what it raised).

        Must not be called from the loop's own thread (it would wait for itself).

        Raises:
            ServerStateError: the run ended before ``fn`` ran.
            TimeoutError: the loop did not run ``fn`` within ``timeout`` seconds.
        """
        future: concurrent.futures.Future[object] = concurrent.futures.Future()
        self._put((fn, future))
        try:
            result = future.result(timeout)
        except concurrent.futures.CancelledError:
            raise ServerStateError("the server stopped before it could answer") from None
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(
                f"the timer server's loop did not answer within {timeout} s; is it blocked?"
            ) from None
        return result  # type: ignore[return-value]

    def _put(self, call: _Call) -> None:
        with self._lock:
            if self._closed:
                raise ServerStateError("the server is not running")
            self._calls.append(call)
        try:
            self._loop.call_soon_threadsafe(self._wakeup)
        except RuntimeError:  # the loop closed meanwhile
            raise ServerStateError("the server's event loop is closed") from None

    def _wakeup(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        """Run handed-over calls, in order, until cancelled."""
        calls = self._calls
        task_status.started()
        while True:
            self._wake = anyio.Event()
            while calls:
                fn, future = calls.popleft()
                if future is None:
                    try:
                        fn()
                    except Exception:
                        logger.exception("a call handed to the server's loop raised")
                elif future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn())
                    except Exception as exc:
                        future.set_exception(exc)
            await self._wake.wait()

    def close(self) -> None:
        """End the handoff (the run is over): refuse new calls, drop the queued ones and
        tell their waiters. Call it once nothing in the run changes its state any more."""
        with self._lock:
            self._closed = True
            left = list(self._calls)
            self._calls.clear()
        for _, future in left:
            if future is not None:
                future.cancel()
