"""Serving one listener under a cap: what an outsider can do to a listener stays there.

:func:`serve_listener` accepts connections and runs each in a task of its own task
group, by these rules:

* at most ``max_connections`` connections at once; a connection over the cap is closed
  as soon as it is accepted (an outsider holding connections open costs the listener
  that many descriptors, never more);
* ``accept()`` failing (``EMFILE``/``ENFILE``: out of descriptors; ``ENOBUFS``,
  ``ENOMEM``, ``ECONNABORTED``, ``EPROTO``, ...) is logged and survived: the loop waits
  :data:`ACCEPT_BACKOFF` seconds, doubling up to :data:`MAX_ACCEPT_BACKOFF` while it keeps
  failing (back to the start after a success), then accepts again. It is never raised;
* log lines about failures and refusals are rate-limited per kind: the first of each
  :data:`~aiotimer._edges.logs.NOISE_INTERVAL`, then one line with the count;
* a connection whose handler raises is logged and closed; the listener goes on.

It returns when the listener is closed, and is cancelled like any task. Idle
connections are the handler's business (:func:`~aiotimer.control._http.serve_connection`
closes a connection that sends no complete request within its timeout).
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

from aiotimer._edges.logs import NoiseLimiter

__all__ = ["ACCEPT_BACKOFF", "MAX_ACCEPT_BACKOFF", "serve_listener"]

logger = logging.getLogger("aiotimer.control")

#: Seconds to wait after a failed ``accept()`` before the next one.
ACCEPT_BACKOFF: Final[float] = 0.01
#: The longest wait between failing ``accept()`` calls.
MAX_ACCEPT_BACKOFF: Final[float] = 0.5

Handler = Callable[[anyio.abc.SocketStream], Awaitable[None]]


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


async def serve_listener(
    listener: anyio.abc.SocketListener,
    handle: Handler,
    *,
    name: str,
    max_connections: int,
) -> None:
    """Accept connections on ``listener`` and ``await handle(stream)`` for each, until
    the listener is closed (see the module docs). ``name`` says which listener in log
    lines. The streams are closed after ``handle`` returns."""
    noise = _Noise(name)
    active = 0
    backoff = ACCEPT_BACKOFF

    async def run(stream: anyio.abc.SocketStream) -> None:
        nonlocal active
        try:
            async with stream:
                await handle(stream)
        except Exception:
            logger.exception("%s: a connection failed; closed", name)
        finally:
            active -= 1

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
                if active >= max_connections:
                    noise.warn(
                        "refused connection",
                        f"{max_connections} connections are open, the most served at "
                        "once; closed a new one",
                    )
                    with contextlib.suppress(OSError, anyio.BrokenResourceError):
                        await stream.aclose()
                    continue
                noise.flush()
                active += 1
                tg.start_soon(run, stream)
            tg.cancel_scope.cancel()
    finally:
        noise.flush(everything=True)
