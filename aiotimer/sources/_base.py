"""The contract between request sources and the server.

A source owns one transport (a FIFO, a multiprocessing queue, a socket, ...). The server
runs each source's :meth:`Source.serve` in its task group; the source reads its transport
without blocking the event loop and hands every batch it decodes to the sink, in the
event loop's thread.

A source whose transport can be read synchronously without blocking (a FIFO, a socket,
a queue's bridge) also registers a :class:`Drain` with the sink (:func:`draining`).
Before acting on expired timers the server applies, through the drains, what each
transport held for the due workers when it decided to act: a release sent before the
deadline always wins, even when the server's loop was stalled (a SIGSTOP, a GC or VM
pause); the stall is the server's lateness, not the worker's. A drain *returns* what to
apply and never calls the sink: the server applies it, and stays the only caller of
its own ingest.

The drain protocol, per decision (see :mod:`aiotimer.server._decision`):

1. ``hold()``: the decision is made now. The drain bounds what it will look at to what
   its transport holds now (a FIFO: the bytes read so far plus those in the pipe; a
   socket: those queued on the connection; the queue: the batches its thread has
   taken). Input that arrives later is never waited for, so a flood cannot put off
   a reap for ever.
2. ``look(pids)``: a pass for the workers ``pids`` (``None``: anyone, as too many are
   due to name them) over that bounded input; ``True`` if some of it may hold a request
   for one of them. ``False`` means nothing it holds can change those workers' timers.
3. While it said ``True``: ``step()`` returns the next part of that input that may
   concern them, decoded, as a batch the server applies under the drain's ``name``
   (possibly empty: a step that only moved input), never reordering the requests of
   any one worker; ``None`` once it holds nothing more for them. The server steps its
   drains for a few milliseconds of CPU per turn of the loop and carries the decision
   on in the next turn: a drain must be done with a pass after a bounded number of
   steps, and a reader of the same transport may run between two steps (both take
   from the same front, so nothing is read twice or skipped).
4. Applying input can make more timers due (an acquire that has already expired): the
   server then looks again with the workers not yet looked for, within the same bound.
   Once no worker due is left to look for, it acts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from typing import Protocol

import anyio
import anyio.abc

from aiotimer.wire import Decoded

__all__ = ["Drain", "RequestSink", "Source", "draining", "serve_source"]


class Drain(Protocol):
    """What a source registers with the server to hand over its pending input before an
    expiry (see the module docs). Its methods run in the event loop's thread, never
    block and never wait."""

    @property
    def name(self) -> str:
        """The source's name, which the batches :meth:`step` returns are applied under."""
        ...

    def hold(self) -> None:
        """A decision is made now: bound the looks and steps until the next ``hold`` to
        what the transport holds now."""
        ...

    def look(self, pids: AbstractSet[int] | None) -> bool:
        """Begin a pass over the bounded input for ``pids`` (``None``: anyone); ``True``
        if some of it may hold a request for one of them, which :meth:`step` must then
        return."""
        ...

    def step(self) -> Decoded | None:
        """Decode the next part of what the pass must apply and return it for the
        server to apply (possibly empty); ``None`` once none of it is left."""
        ...


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
