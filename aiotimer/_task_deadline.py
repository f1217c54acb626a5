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

__all__ = ["TaskDeadline", "open_blocks"]

#: Every block between entry and :meth:`TaskDeadline.stop`, in any thread: what a stack
#: dump lists per task (a set: ~0.3 us per block to add and discard, no weak references).
_open: set[TaskDeadline] = set()


class TaskDeadline:
    """Cancel ``task`` at loop time ``when`` unless :meth:`stop` comes first; ``scope``
    names the block (for :func:`open_blocks`)."""

    __slots__ = ("_cancelling", "_expired", "_handle", "_task", "scope")

    def __init__(self, task: asyncio.Task[Any], when: float, scope: str) -> None:
        self._task = task
        self.scope = scope
        self._cancelling = task.cancelling()
        self._expired = False
        self._handle = task.get_loop().call_at(when, self._expire)
        _open.add(self)

    def _expire(self) -> None:
        self._expired = True
        self._task.cancel()

    @property
    def expired(self) -> bool:
        """Whether the deadline passed (and the task was cancelled) inside the block."""
        return self._expired

    def stop(self) -> None:
        """The block's body has ended: the deadline can no longer cancel the task (so
        what the block does on its way out, such as a release that has to wait, runs
        uninterrupted)."""
        self._handle.cancel()
        _open.discard(self)

    def leave(self, exc_type: type[BaseException] | None, exc: BaseException | None) -> None:
        """The block ends with ``exc`` (after :meth:`stop`): raise ``TimeoutError`` if
        the deadline's cancellation is what ends it."""
        if (
            self._expired
            and self._task.uncancel() <= self._cancelling
            # asyncio is loaded (a task exists); this module does not import it, so a
            # worker that never runs a loop never loads it.
            and exc_type is sys.modules["asyncio"].CancelledError
        ):
            raise TimeoutError from exc


def open_blocks() -> dict[asyncio.Task[Any], list[str]]:
    """The scope ids of the ``async with`` blocks open now (with a cancellation tier),
    by task. Safe from a signal handler: it copies the set in one step."""
    found: dict[asyncio.Task[Any], list[str]] = {}
    for deadline in list(_open):
        found.setdefault(deadline._task, []).append(deadline.scope)
    return found
