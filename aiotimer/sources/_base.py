"""The contract between request sources and the server.

A source owns one transport (a FIFO, a multiprocessing queue, a socket, ...). The server
runs each source's :meth:`Source.serve` in its task group; the source reads its transport
without blocking the event loop and hands every batch it decodes to the sink, in the
event loop's thread.

A source whose transport can be read synchronously without blocking (a FIFO or socket
in non-blocking mode) also registers a *drain* with the sink (:func:`draining`): a
callable that reads, decodes and submits one chunk of what the transport holds, and
says whether more may be left. Before acting on an expiry the server runs the drains
until they are empty (within a small time budget), so input that arrived before the
deadline (a release written while the server's loop was stalled, say) is applied first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

import anyio
import anyio.abc

from aiotimer._protocol import Decoded

__all__ = ["Drain", "RequestSink", "Source", "draining", "serve_source"]

#: Reads and submits, synchronously and without blocking, one chunk of what a transport
#: holds now; returns ``True`` when more may be left.
Drain = Callable[[], bool]


class RequestSink(Protocol):
    """Where a source delivers what it decoded (implemented by the server)."""

    def submit(self, batch: Decoded, source: str) -> None:
        """Apply ``batch`` (requests in arrival order, plus rejections to report).

        Must be called from the event loop's thread; never blocks, never raises for bad
        input. ``source`` names the transport (e.g. ``"fifo:/run/aiotimer.fifo"``).
        """
        ...


class Source(Protocol):
    """A transport requests arrive on."""

    @property
    def name(self) -> str:
        """A short human-readable name, e.g. ``"fifo:/run/aiotimer.fifo"``."""
        ...

    async def serve(
        self,
        sink: RequestSink,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Open the transport, call ``task_status.started()`` once clients can send, then
        feed ``sink`` until cancelled; release every resource on the way out (also when
        cancelled). Raises a typed error if the transport cannot be opened.
        """
        ...


@contextmanager
def draining(sink: RequestSink, drain: Drain) -> Iterator[None]:
    """Register ``drain`` with ``sink`` for the duration of the ``with`` block.

    Sinks that do not take drains (``add_drain(drain) -> remove``) are left alone.
    """
    add: Callable[[Drain], Callable[[], None]] | None = getattr(sink, "add_drain", None)
    if add is None:
        yield
        return
    remove = add(drain)
    try:
        yield
    finally:
        remove()


class _StartedProxy:
    """A task status that remembers whether ``started()`` was called."""

    __slots__ = ("_inner", "called")

    def __init__(self, inner: anyio.abc.TaskStatus[None]) -> None:
        self._inner = inner
        self.called = False

    def started(self, value: None = None) -> None:
        self.called = True
        self._inner.started()


async def serve_source(
    source: Source,
    sink: RequestSink,
    on_failure: Callable[[BaseException], None],
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``source.serve(sink)``; a failure before it started propagates (the server
    cannot start), a failure afterwards is handed to ``on_failure`` (the server runs on)."""
    status = _StartedProxy(task_status)
    try:
        await source.serve(sink, task_status=status)
    except Exception as exc:
        if not status.called:
            raise
        on_failure(exc)
