"""What a timed block reads from the running program: its asyncio task, and whether
this process answers the server's stack-dump requests. Neither loads anything: asyncio
and the dump code are looked up in ``sys.modules`` (a worker that never runs a loop
never imports asyncio)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

__all__ = ["asks_for_dump", "current_asyncio_task"]


def asks_for_dump() -> bool:
    """Whether a two-tier block asks the server for a stack dump before the reap: when
    this process has the hook to answer it. Such a block is reaped only when its loop is
    blocked (or its cancellation swallowed), and the dump names the task holding the loop.

    Read after ``current_client()``: the first block of a worker that finds its server
    through the environment installs the hook. Reads the module's hook record, never
    loading the dump code.
    """
    hooks = sys.modules.get("aiotimer.client._dump_hook")
    return hooks is not None and hooks._hook is not None


def current_asyncio_task() -> asyncio.Task[Any] | None:
    """The running asyncio task, or ``None`` (no asyncio loop runs in this thread)."""
    global _current_task
    current = _current_task
    if current is None:
        loaded = sys.modules.get("asyncio")  # loaded by any program that runs its loop
        if loaded is None:
            return None
        current = _current_task = loaded.current_task  # then no lookup per block
    try:
        task: asyncio.Task[Any] | None = current()
    except RuntimeError:  # no running loop: trio, or no loop at all
        return None
    return task


#: ``asyncio.current_task``, once asyncio is loaded (see :func:`current_asyncio_task`).
_current_task: Callable[[], asyncio.Task[Any] | None] | None = None
