"""The worker side: ``expires()`` blocks, and which client they talk through.

>>> with expires(after=10):                # doctest: +SKIP
...     load_batch()
>>> async with expires(after=10):          # doctest: +SKIP
...     await fetch()

Entering a block sends an *acquire* (deadline ``after`` seconds from now) to the timer
server; leaving it sends a *release*. If a ``with`` block is still running at its
deadline, the server reaps this process (SIGKILL by default). An ``async with`` block
has two tiers: at the deadline its own task is cancelled and ``TimeoutError`` comes out
of the block (``asyncio.timeout`` semantics); the server reaps the process only if the
block has not ended ``kill_after`` seconds later (the loop is blocked, or the task
swallowed its cancellation).

Which client: the one given to ``expires(client=...)``; else the context-local one
(:func:`use_client`); else the process-wide one (:func:`configure`); else one discovered
from the environment (``AIOTIMER_FIFO``, then torch's ``TORCHELASTIC_TIMER_FILE``).

The block itself, its lifecycle and its two faces: :mod:`aiotimer.client._block`.
"""

from __future__ import annotations

from aiotimer.client._block import DEFAULT_KILL_AFTER, Expires
from aiotimer.client._block_checks import MAX_DEADLINE_AHEAD, argument_type_error
from aiotimer.client._clients import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_SIGNAL,
    DEFAULT_WRITE_TIMEOUT,
    FifoClient,
    InProcessClient,
    QueueClient,
    QueueRequest,
    RequestSubmitter,
    TimerClient,
    configure,
    current_client,
    timer_server_configured,
    use_client,
)
from aiotimer.core import default_scope, scope_site
from aiotimer.wire import Learned, learned

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_KILL_AFTER",
    "DEFAULT_SIGNAL",
    "DEFAULT_WRITE_TIMEOUT",
    "MAX_DEADLINE_AHEAD",
    "Expires",
    "FifoClient",
    "InProcessClient",
    "Learned",
    "QueueClient",
    "QueueRequest",
    "RequestSubmitter",
    "TimerClient",
    "configure",
    "current_client",
    "expires",
    "expires_at",
    "learned",
    "scope_site",
    "timer_server_configured",
    "use_client",
]


def expires(
    after: float | Learned,
    *,
    scope: str | None = None,
    client: TimerClient | None = None,
    signal: int | None = None,
    kill_after: float | None = None,
) -> Expires:
    """A block that must finish within ``after`` seconds of entering it, or be reaped.

    Use as ``with expires(after=10): ...``, ``async with expires(after=10): ...``, or
    as a decorator, ``@expires(after=10)``, on a function or a coroutine function (each
    call is then a block). A block is used once; nested and concurrent blocks are
    independent timers.

    ``with`` (synchronous code): the server reaps the process at the deadline.
    ``async with``: two tiers. At the deadline the block's task is cancelled and
    ``TimeoutError`` comes out of the block, with ``asyncio.timeout``'s semantics
    (nesting; an outer cancellation stays a cancellation). The server is told a deadline
    ``kill_after`` seconds later and reaps the process only if the block has not ended by
    then: the loop is blocked, or the task swallowed its cancellation. Outside an asyncio
    task (e.g. under trio) the async face reaps at the deadline, as ``with`` does.

    Args:
        after: seconds from entering the block to its deadline (>= 0); or a timeout the
            server learns from the scope's durations, :func:`aiotimer.learned`
            (``after=learned(initial=600)``; see docs/clients.md, "Timeouts that learn").
        scope: the scope id; by default ``"file.py:LINE#N"`` with a process-wide ``N``,
            unique per block, so concurrent tasks on one line never collide. Blocks that
            share an explicit scope share one timer (torch's behaviour).
        client: the transport; by default :func:`current_client` on entry.
        signal: the signal to reap with (``<= 0``: report only); default: the client's.
        kill_after: ``async with`` only: seconds between the task's cancellation at the
            deadline and the server's reaping (default :data:`DEFAULT_KILL_AFTER`);
            ``0`` asks for one tier: no cancellation, the server reaps at the deadline.

    Raises:
        TypeError: at once, for an argument of a wrong type; the message names it and the
            type it takes (``expires(): after must be a number of seconds (int or
            float), got str '10'``).
        ValueError: at once, for a block the server would reject (the message names
            the limit): an empty, too long or invalid scope, a signal outside
            ``1..MAX_SIGNAL`` (and not ``<= 0``), an ``after`` or ``kill_after`` not
            finite or negative.
        NotConfiguredError: on entry: no client given, set or discoverable.
        ServerUnavailableError: on entry: no server within the client's
            ``connect_timeout`` (the block is forgotten and its body does not run).
        ClientBackpressureError: on entry: the server's pipe stayed full for
            ``write_timeout``.
        TimeoutError: from ``async with``: the deadline passed and the task was cancelled.

    Leaving never raises for the release: a failed release is logged (and retried where
    the client can, see docs/clients.md), the block's own exception propagates
    untouched, and a cancelled task still sends its release.
    """
    if scope is None and signal is None:  # the common block: one call fewer, no keywords
        try:
            return Expires(default_scope(1), after, None, client, None, kill_after, True)
        except TypeError as exc:
            raise _named(exc, "expires", after, None, scope, signal, kill_after) from None
    return _block("expires", after, None, scope, client, signal, kill_after)


def expires_at(
    deadline: float,
    *,
    scope: str | None = None,
    client: TimerClient | None = None,
    signal: int | None = None,
    kill_after: float | None = None,
) -> Expires:
    """Like :func:`expires`, with an absolute ``deadline`` on the ``time.monotonic()`` clock.

    ``deadline`` is **not** epoch time: compute it as ``time.monotonic() + seconds``
    (asyncio's ``loop.time()`` is the same clock on Linux but is not guaranteed to be).
    A deadline already past is sent as "expire now"; one more than
    :data:`MAX_DEADLINE_AHEAD` ahead is refused with ``ValueError`` (an epoch time).
    """
    return _block("expires_at", None, deadline, scope, client, signal, kill_after)


def _block(  # noqa: PLR0917 (positional: keywords cost ~0.15 us a call on 3.11)
    face: str,
    after: float | Learned | None,
    deadline: float | None,
    scope: str | None,
    client: TimerClient | None,
    signal: int | None,
    kill_after: float | None,
) -> Expires:
    """The block :func:`expires` or :func:`expires_at` (``face``) makes; a wrong
    argument type is a ``TypeError`` naming the argument and its accepted type."""
    try:
        if (signal is not None and (not isinstance(signal, int) or isinstance(signal, bool))) or (
            scope is not None and not isinstance(scope, str)
        ):
            raise TypeError  # a float signal, bytes as a scope, would reach the wire
        if scope is None:
            return Expires(default_scope(2), after, deadline, client, signal, kill_after, True)
        return Expires(scope, after, deadline, client, signal, kill_after)
    except TypeError as exc:
        raise _named(exc, face, after, deadline, scope, signal, kill_after) from None


def _named(  # noqa: PLR0917
    exc: TypeError,
    face: str,
    after: float | Learned | None,
    deadline: float | None,
    scope: str | None,
    signal: int | None,
    kill_after: float | None,
) -> TypeError:
    """The ``TypeError`` to raise for ``exc``: one naming the argument of ``face`` that
    has a wrong type and the type it takes, else ``exc`` itself."""
    timing = {"after": after} if face == "expires" else {"deadline": deadline}
    named = argument_type_error(face, **timing, scope=scope, signal=signal, kill_after=kill_after)
    return exc if named is None else named
