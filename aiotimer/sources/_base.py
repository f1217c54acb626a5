"""The contract between request sources and the server.

A source owns one transport (a FIFO, a multiprocessing queue, a socket, ...). The server
runs each source's :meth:`Source.serve` in its task group; the source reads its transport
without blocking the event loop and hands every batch it decodes to the sink, in the
event loop's thread.
"""

from __future__ import annotations

from typing import Protocol

import anyio
import anyio.abc

from aiotimer._protocol import Decoded

__all__ = ["RequestSink", "Source"]


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
