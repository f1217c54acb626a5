"""The worker side: ``expires()`` blocks, and which client they talk through.

>>> with expires(after=10):                # doctest: +SKIP
...     load_batch()
>>> async with expires(after=10):          # doctest: +SKIP
...     await fetch()

Entering a block sends an *acquire* (deadline ``after`` seconds from now) to the timer
server; leaving it sends a *release*. If the block is still running at its deadline, the
server reaps this process (SIGKILL by default).

Which client: the one given to ``expires(client=...)``; else the context-local one
(:func:`use_client`); else the process-wide one (:func:`configure`); else one discovered
from the environment (``AIOTIMER_FIFO``, then torch's ``TORCHELASTIC_TIMER_FILE``).
"""

from __future__ import annotations

import contextvars
import logging
import os
import stat
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Final

from aiotimer._clients import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_SIGNAL,
    DEFAULT_WRITE_TIMEOUT,
    FifoClient,
    InProcessClient,
    QueueClient,
    QueueRequest,
    RequestSubmitter,
    TimerClient,
)
from aiotimer._protocol import ENV_FIFO, TORCH_ENV_FIFO, Request
from aiotimer._scope import _counter, _new_site, _sites, current_pid, default_scope, scope_site
from aiotimer.diagnostics import ensure_dump_handler
from aiotimer.errors import NotConfiguredError

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_SIGNAL",
    "DEFAULT_WRITE_TIMEOUT",
    "Expires",
    "FifoClient",
    "InProcessClient",
    "QueueClient",
    "QueueRequest",
    "RequestSubmitter",
    "TimerClient",
    "configure",
    "current_client",
    "expires",
    "expires_at",
    "scope_site",
    "under_timer_server",
    "use_client",
]

log = logging.getLogger("aiotimer.client")

_configured: TimerClient | None = None
_context_client: Final[contextvars.ContextVar[TimerClient | None]] = contextvars.ContextVar(
    "aiotimer_client", default=None
)
_discovered: dict[str, FifoClient] = {}
_discovery_lock = threading.Lock()


def configure(client: TimerClient | None, *, dump_hook: bool = True) -> None:
    """Set the process-wide default client (``None`` removes it).

    Blocks that name no client, in a context without :func:`use_client`, use it.

    With ``dump_hook`` (the default), configuring a client also installs the worker-side
    stack-dump hook (:func:`aiotimer.diagnostics.ensure_dump_handler`: on ``SIGUSR1``
    every thread's stack and every asyncio task's await chain go to a file the server
    reads before reaping; any previous ``SIGUSR1`` handler is still called). It is
    installed only from the main thread and never raises; pass ``dump_hook=False`` to
    leave ``SIGUSR1`` alone.
    """
    global _configured
    _configured = client
    if client is not None and dump_hook:
        ensure_dump_handler()


@contextmanager
def use_client(client: TimerClient) -> Iterator[TimerClient]:
    """Within the ``with`` block, in this context only, ``expires()`` uses ``client``.

    The override lives in a :mod:`contextvars` variable: other threads and other asyncio
    tasks (each task runs in a copy of its creator's context) are unaffected.
    """
    token = _context_client.set(client)
    try:
        yield client
    finally:
        _context_client.reset(token)


def current_client() -> TimerClient:
    """The client ``expires()`` would use here and now.

    In order: the context-local override (:func:`use_client`), the process-wide client
    (:func:`configure`), a :class:`FifoClient` for the FIFO named by ``AIOTIMER_FIFO``
    or torch's ``TORCHELASTIC_TIMER_FILE`` (one cached client per path).

    Raises:
        NotConfiguredError: none of these is set.
    """
    client = _context_client.get()
    if client is not None:
        return client
    if _configured is not None:
        return _configured
    path = _env_fifo()
    if path is None:
        raise NotConfiguredError(
            "no timer client: call aiotimer.configure(FifoClient(path)) (or use "
            "use_client/expires(client=...)), or run the worker under a timer server: "
            f"`aiotimer serve --fifo PATH` and export {ENV_FIFO}=PATH "
            f"(torch's {TORCH_ENV_FIFO} works too)"
        )
    client = _discovered.get(path)
    if client is None:
        with _discovery_lock:
            client = _discovered.setdefault(path, FifoClient(path))
    return client


def under_timer_server() -> bool:
    """True when a client is set (:func:`use_client`, :func:`configure`) or the
    environment names an existing FIFO. Never connects.
    """
    if _context_client.get() is not None or _configured is not None:
        return True
    path = _env_fifo()
    if path is None:
        return False
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False


def _env_fifo() -> str | None:
    return os.environ.get(ENV_FIFO) or os.environ.get(TORCH_ENV_FIFO) or None


def release_failed(scope: str, exc: Exception, body_exc: BaseException | None) -> None:
    """Re-raise a failed release, unless the block's own exception is propagating.

    Then the release failure is logged and the block's exception (a ``CancelledError``
    included) propagates untouched.
    """
    if body_exc is None:
        raise exc
    log.warning(
        "releasing scope %r failed (%s: %s) while the block raised %s; the block's "
        "exception propagates",
        scope,
        type(exc).__name__,
        exc,
        type(body_exc).__name__,
    )


# Lifecycle of an Expires (plain ints: this is the hot path).
_CREATED, _ACTIVE, _EXITED = 0, 1, 2
_STATE_NAMES: Final = ("created", "active", "exited")
_monotonic: Final = time.monotonic
_wall: Final = time.time
_getframe: Final = sys._getframe


class Expires:
    """A timed block: usable once, as ``with`` or as ``async with`` (see :func:`expires`).

    Attributes:
        scope: the scope id sent to the server.
        deadline: the deadline on ``time.monotonic()`` (set on entry for ``expires``).
    """

    __slots__ = ("_after", "_client", "_signal", "_state", "deadline", "scope")
    scope: str
    deadline: float | None
    _after: float | None
    _client: TimerClient | None
    _signal: int | None
    _state: int

    def __init__(
        self,
        scope: str,
        after: float | None,
        deadline: float | None,
        client: TimerClient | None,
        signal: int | None,
    ) -> None:
        if (after is None) == (deadline is None):
            raise TypeError("give exactly one of after and deadline")
        if after is not None and not after >= 0:
            raise ValueError(f"after must be a number >= 0, got {after!r}")
        self.scope = scope
        self._after = after
        self.deadline = deadline
        self._client = client
        self._signal = signal
        self._state = _CREATED

    # -- the one place requests are built --------------------------------------------
    #
    # The hot path (a FifoClient with its descriptor open) builds no Request at all:
    # the client encodes both lines of the block on entry and writes them directly.
    # Every other case builds the Request and goes through send()/send_async().

    def _acquire(self) -> Request | None:
        """Enter: fix the deadline and send the acquire at once if the client can;
        otherwise return the acquire for ``send``/``send_async``."""
        if self._state != _CREATED:
            raise RuntimeError(f"{self!r} can be entered only once")
        client = self._client
        if client is None:
            client = self._client = current_client()
        mono = _monotonic()
        wall = _wall()
        after = self._after
        deadline = self.deadline if after is None else mono + after
        assert deadline is not None
        self.deadline = deadline
        self._state = _ACTIVE
        expiration_time = wall + (deadline - mono)
        if client.__class__ is FifoClient:
            try:
                if client._acquire_now(self.scope, expiration_time, self._signal, deadline, mono):
                    return None
            except BaseException:
                self._state = _EXITED
                raise
        signal = client.signal if self._signal is None else self._signal
        # Positional: pid, scope_id, expiration_time (epoch), signal, version, mono.
        return Request(current_pid(), self.scope, expiration_time, signal, None, deadline)

    def _release(self) -> Request:
        """The release, for ``send``/``send_async`` (when the client's hot path is shut)."""
        return Request(current_pid(), self.scope, -1, 0)

    # -- the two faces ---------------------------------------------------------------

    def __enter__(self) -> Expires:
        request = self._acquire()
        if request is not None:
            try:
                self._sender().send(request)
            except BaseException:
                self._state = _EXITED
                raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._state = _EXITED
        client = self._client
        try:
            if not (client.__class__ is FifoClient and client._release_now(self.scope)):
                self._sender().send(self._release())
        except Exception as release_exc:
            release_failed(self.scope, release_exc, exc)

    async def __aenter__(self) -> Expires:
        request = self._acquire()
        if request is not None:
            try:
                await self._sender().send_async(request)
            except BaseException:
                self._state = _EXITED
                raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._state = _EXITED
        client = self._client
        try:
            if not (client.__class__ is FifoClient and client._release_now(self.scope)):
                await self._sender().send_async(self._release())
        except Exception as release_exc:
            release_failed(self.scope, release_exc, exc)

    def _sender(self) -> TimerClient:
        client = self._client
        assert client is not None
        return client

    def remaining(self) -> float | None:
        """Seconds left before the deadline (negative once passed); ``None`` before entry."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    def __repr__(self) -> str:
        left = self.remaining()
        when = "" if left is None else f", {left:.3f}s left"
        return f"<Expires {_STATE_NAMES[self._state]} scope={self.scope!r}{when}>"


def expires(
    after: float,
    *,
    scope: str | None = None,
    client: TimerClient | None = None,
    signal: int | None = None,
) -> Expires:
    """A block that must finish within ``after`` seconds of entering it, or be reaped.

    Use as ``with expires(after=10): ...`` or ``async with expires(after=10): ...``.
    A block is used once; nested and concurrent blocks are independent timers.

    Args:
        after: seconds from entering the block to its deadline (>= 0).
        scope: the scope id; by default ``"file.py:LINE#N"`` with a process-wide ``N``,
            unique per block, so concurrent tasks on one line never collide. Blocks that
            share an explicit scope share one timer (torch's behaviour).
        client: the transport; by default :func:`current_client` on entry.
        signal: the signal to reap with (``<= 0``: report only); default: the client's.

    Raises (on entry or exit):
        NotConfiguredError: no client given, set or discoverable.
        ServerUnavailableError: no server within the client's ``connect_timeout``.
        ClientBackpressureError: the server's pipe stayed full for ``write_timeout``.

    A failing release never hides the block's own exception (it is logged instead),
    and a cancelled task still sends its release.
    """
    if scope is None:  # default_scope(), inlined: this is the hot path
        frame = _getframe(1)
        site = _sites.get((id(frame.f_code), frame.f_lasti))
        scope = f"{_new_site(frame) if site is None else site[0]}{next(_counter)}"
    if not after >= 0:  # Expires.__init__'s check, inlined with its fields: the hot path
        raise ValueError(f"after must be a number >= 0, got {after!r}")
    block = _new(Expires)
    block.scope = scope
    block._after = after
    block.deadline = None
    block._client = client
    block._signal = signal
    block._state = _CREATED
    return block


def expires_at(
    deadline: float,
    *,
    scope: str | None = None,
    client: TimerClient | None = None,
    signal: int | None = None,
) -> Expires:
    """Like :func:`expires`, with an absolute ``deadline`` on the ``time.monotonic()`` clock.

    ``deadline`` is **not** epoch time: compute it as ``time.monotonic() + seconds``
    (asyncio's ``loop.time()`` is the same clock on Linux but is not guaranteed to be).
    A deadline already past is sent as "expire now".
    """
    block = _new(Expires)
    _init(block, default_scope() if scope is None else scope, None, deadline, client, signal)
    return block


# Blocks are made by calling __init__ as a plain function on a new object: the same
# checks and fields, without the C-level call of Expires(...), which costs more.
_new: Final = object.__new__
_init: Final = Expires.__init__
