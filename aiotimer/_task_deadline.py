"""Cancel a task at its block's deadline: the first tier of an ``async with`` block.

The rules are ``asyncio.timeout``'s (CPython ``Lib/asyncio/timeouts.py``), kept exactly:
at the deadline the loop cancels the task; on leaving the block, a cancellation that the
deadline caused, and that no one else also asked for, becomes ``TimeoutError`` (chained
from the ``CancelledError``); any other cancellation, such as an outer scope's or a
caller's ``task.cancel()``, propagates untouched. ``task.cancelling()`` and
``task.uncancel()`` tell the two apart, so nested blocks, ``asyncio.timeout`` and anyio's
cancel scopes compose.

Why not ``asyncio.timeout`` itself: entering and leaving one awaits two coroutines and
walks its state machine, ~5 us per block here, as much as the rest of the block;
this keeps only the timer handle (``loop.call_at``, ~1.8 us with its cancel).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

__all__ = ["TaskDeadline"]


class TaskDeadline:
    """Cancel ``task`` at loop time ``when`` unless :meth:`leave` comes first."""

    __slots__ = ("_cancelling", "_expired", "_handle", "_task")

    def __init__(self, task: asyncio.Task[Any], when: float) -> None:
        self._task = task
        self._cancelling = task.cancelling()
        self._expired = False
        self._handle = task.get_loop().call_at(when, self._expire)

    def _expire(self) -> None:
        self._expired = True
        self._task.cancel()

    @property
    def expired(self) -> bool:
        """Whether the deadline passed (and the task was cancelled) inside the block."""
        return self._expired

    def leave(self, exc_type: type[BaseException] | None, exc: BaseException | None) -> None:
        """The block ends with ``exc``: stop the timer; raise ``TimeoutError`` if the
        deadline's cancellation is what ends it."""
        self._handle.cancel()
        if (
            self._expired
            and self._task.uncancel() <= self._cancelling
            # asyncio is loaded (a task exists); this module does not import it, so a
            # worker that never runs a loop never loads it.
            and exc_type is sys.modules["asyncio"].CancelledError
        ):
            raise TimeoutError from exc
