"""Serving one listener under a cap: what an outsider can do to a listener stays there.

:func:`serve_listener` accepts connections and runs each in a task of its own task
group, by these rules:

* at most ``max_connections`` connections at once. At the cap, a new connection takes
  the place of the one that has waited longest for its peer, to send a request or to
  take an answer (a peer that sends slowly, holds an idle connection, or pipelines
  requests and never reads the answers, cannot lock out one that asks and goes); when
  every connection is busy working on a request (a bounded step), the new one is closed
  as soon as it is accepted. Either way an outsider holding connections open costs the
  listener that many descriptors, never more;
* descriptors are kept for the server: with a ``reserve``, a connection that leaves
  fewer than that many descriptors free is closed as soon as it is accepted (the server
  needs one per worker it pins; see :class:`~aiotimer._edges.limits.DescriptorReserve`);
* ``accept()`` failing (``EMFILE``/``ENFILE``: out of descriptors; ``ENOBUFS``,
  ``ENOMEM``, ``ECONNABORTED``, ``EPROTO``, ...) is logged and survived: the loop waits
  :data:`ACCEPT_BACKOFF` seconds, doubling up to :data:`MAX_ACCEPT_BACKOFF` while it keeps
  failing (back to the start after a success), then accepts again. It is never raised;
* log lines about failures and refusals are rate-limited per kind: the first of each
  :data:`~aiotimer._edges.logs.NOISE_INTERVAL`, then one line with the count;
* a connection whose handler raises is logged and closed; the listener goes on.

It returns when the listener is closed, and is cancelled like any task. The handler
tells its :class:`Slot` when it waits for its peer and when it works on a request
(:func:`~aiotimer.control._http.serve_connection` does, and closes a connection that
sends no complete request within its timeout).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final

import anyio
import anyio.abc

from aiotimer._edges.limits import DescriptorReserve
from aiotimer._edges.logs import NoiseLimiter

__all__ = ["ACCEPT_BACKOFF", "MAX_ACCEPT_BACKOFF", "Slot", "serve_listener"]

logger = logging.getLogger("aiotimer.control")

#: Seconds to wait after a failed ``accept()`` before the next one.
ACCEPT_BACKOFF: Final[float] = 0.01
#: The longest wait between failing ``accept()`` calls.
MAX_ACCEPT_BACKOFF: Final[float] = 0.5


class Slot:
    """One served connection's place under the cap: since when it has waited for its
    peer (``None`` while it works on a request), and the scope that ends it."""

    __slots__ = ("scope", "waiting_since")

    def __init__(self) -> None:
        self.scope = anyio.CancelScope()
        self.waiting_since: float | None = time.monotonic()

    def waiting(self) -> None:
        """The connection waits for its peer (for a request, or to take an answer): it
        may be closed for a new one."""
        self.waiting_since = time.monotonic()

    def working(self) -> None:
        """The connection has a whole request and works on it."""
        self.waiting_since = None


Handler = Callable[[anyio.abc.SocketStream, Slot], Awaitable[None]]


class _Noise:
    """Rate-limited warnings about one listener (see the module docs)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._limiter = NoiseLimiter()

    def warn(self, kind: str, line: str) -> None:
        log, ended = self._limiter.offer(kind, time.monotonic(), lambda: line)
        if ended is not None:
            logger.warning("%s: %s", self._name, ended.describe())
        if log:
            logger.warning("%s: %s", self._name, line)

    def flush(self, *, everything: bool = False) -> None:
        for summary in self._limiter.due(time.monotonic(), everything=everything):
            logger.warning("%s: %s", self._name, summary.describe())


def _describe(exc: BaseException) -> str:
    cause = exc if isinstance(exc, OSError) else exc.__cause__
    if isinstance(cause, OSError) and cause.errno is not None:
        name = errno.errorcode.get(cause.errno, str(cause.errno))
        return f"{name} ({cause.strerror})"
    return repr(exc)


def _longest_waiting(slots: set[Slot]) -> Slot | None:
    waiting = [s for s in slots if s.waiting_since is not None]
    return min(waiting, key=lambda s: s.waiting_since or 0.0) if waiting else None


async def serve_listener(
    listener: anyio.abc.SocketListener,
    handle: Handler,
    *,
    name: str,
    max_connections: int,
    reserve: DescriptorReserve | None = None,
) -> None:
    """Accept connections on ``listener`` and ``await handle(stream, slot)`` for each,
    until the listener is closed (see the module docs). ``name`` says which listener in
    log lines. The streams are closed after ``handle`` returns."""
    noise = _Noise(name)
    slots: set[Slot] = set()
    backoff = ACCEPT_BACKOFF

    async def run(stream: anyio.abc.SocketStream, slot: Slot) -> None:
        try:
            with slot.scope:
                async with stream:
                    await handle(stream, slot)
        except Exception:
            logger.exception("%s: a connection failed; closed", name)
        finally:
            slots.discard(slot)

    async def refuse(stream: anyio.abc.SocketStream, kind: str, line: str) -> None:
        noise.warn(kind, line)
        with contextlib.suppress(OSError, anyio.BrokenResourceError):
            await stream.aclose()

    try:
        async with anyio.create_task_group() as tg:
            while True:
                try:
                    stream = await listener.accept()
                except anyio.ClosedResourceError:
                    break
                except (OSError, anyio.BrokenResourceError) as exc:
                    noise.warn(
                        "accept failure",
                        f"accept() failed: {_describe(exc)}; retrying in {backoff:g}s",
                    )
                    await anyio.sleep(backoff)
                    backoff = min(2 * backoff, MAX_ACCEPT_BACKOFF)
                    continue
                backoff = ACCEPT_BACKOFF
                if reserve is not None and not reserve.leaves_room(_fileno(stream)):
                    await refuse(
                        stream,
                        "descriptor reserve",
                        f"fewer than {reserve.count} file descriptors are free, kept for "
                        "pinning workers; closed a new connection",
                    )
                    continue
                if len(slots) >= max_connections:
                    oldest = _longest_waiting(slots)
                    if oldest is None:
                        await refuse(
                            stream,
                            "refused connection",
                            f"{max_connections} connections are open and busy, the most "
                            "served at once; closed a new one",
                        )
                        continue
                    noise.warn(
                        "replaced connection",
                        f"{max_connections} connections are open, the most served at "
                        "once; closed the one that had waited longest for its peer",
                    )
                    slots.discard(oldest)
                    oldest.scope.cancel()
                noise.flush()
                slot = Slot()
                slots.add(slot)
                tg.start_soon(run, stream, slot)
            tg.cancel_scope.cancel()
    finally:
        noise.flush(everything=True)


def _fileno(stream: anyio.abc.SocketStream) -> int:
    return stream.extra(anyio.abc.SocketAttribute.raw_socket).fileno()
