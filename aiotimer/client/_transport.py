"""What every transport shares: the client protocol, its defaults, and the wait drivers.

A transport writes its sending logic once, as a generator that *yields* what it must
wait for (:class:`Sleep` or :class:`Writable`) and is told whether the wait succeeded;
:func:`drive` runs it by blocking the calling thread (bounded), :func:`drive_async` by
awaiting. So ``send`` and ``send_async`` share one implementation, and the async face
does not import anyio until it first has to wait.
"""

from __future__ import annotations

import logging
import select
import signal as _signal
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Final, Protocol, runtime_checkable

import msgspec

from aiotimer.wire import Request, signal_problem

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_SIGNAL",
    "DEFAULT_WRITE_TIMEOUT",
    "BlockNowait",
    "SendNowait",
    "Sleep",
    "Steps",
    "TimerClient",
    "Writable",
    "client_signal",
    "delivered_late",
    "drive",
    "drive_async",
    "next_retry",
    "release_failed",
    "release_undelivered",
]

log = logging.getLogger("aiotimer.client")

#: The signal a timer kills with unless told otherwise (torch's default).
DEFAULT_SIGNAL: Final[int] = int(_signal.SIGKILL)
#: How long a client keeps retrying while no server reads its FIFO.
DEFAULT_CONNECT_TIMEOUT: Final[float] = 2.0
#: How long a client waits for room in a full pipe (or a full queue).
DEFAULT_WRITE_TIMEOUT: Final[float] = 2.0
#: The first pause between retries; each retry doubles it, up to :data:`RETRY_MAX`.
RETRY_FIRST: Final[float] = 0.001
RETRY_MAX: Final[float] = 0.05


class SendNowait(Protocol):
    """``send_nowait(scope_id, expiration_time, signal, mono, dump[, kill_after[,
    cancelled]]) -> bool``: a transport's optional fast path (see :class:`TimerClient`)."""

    def __call__(  # noqa: PLR0917 (positional: the hot path)
        self,
        scope_id: str,
        expiration_time: float,
        signal: int | None = None,
        mono: float | None = None,
        dump: bool = False,
        kill_after: float = 0.0,
        cancelled: bool = False,
        /,
    ) -> bool:
        """Deliver at once, or return ``False`` having delivered nothing."""
        ...


class BlockNowait(Protocol):
    """A transport's own fast path for blocks (a client's ``_block_nowait``, ``None`` when
    it has none): what its ``send_nowait`` does, minus the generic argument handling.
    A client offers it only while ``send_nowait`` is its own, so a subclass that wraps
    ``send_nowait`` sees every call of a block."""

    def acquire(  # noqa: PLR0917 (positional: the hot path)
        self,
        scope_id: str,
        expiration_time: float,
        mono: float,
        now: float,
        signal: int | None = None,
        dump: bool = False,
        kill_after: float = 0.0,
        /,
    ) -> bool:
        """``send_nowait`` of an acquire, ``now`` being ``time.monotonic()`` as read by
        the block."""
        ...

    def release(self, scope_id: str, cancelled: bool = False, /) -> bool:
        """``send_nowait`` of a release."""
        ...


@runtime_checkable
class TimerClient(Protocol):
    """What :func:`aiotimer.expires` needs from a transport.

    ``send`` may block the calling thread for a bounded time (no server yet, full pipe);
    ``send_async`` waits by awaiting instead. Both raise
    :class:`~aiotimer.errors.ServerUnavailableError` or
    :class:`~aiotimer.errors.ClientBackpressureError` when the bound is exceeded.
    A client decides what goes on the wire: extension fields such as ``mono`` are sent
    only to servers known to understand them.

    The rules every transport keeps (docs/clients.md, *The client's rules*):

    * an acquire that raised was not delivered, and is forgotten (never replayed later);
    * an acquire delivered after a wait has its deadline moved later by the time waited
      (:func:`delivered_late`): waiting for the server is not counted against the block;
    * a release that cannot be delivered in time is kept and retried where the transport
      can tell the server is still there (it still raises, so the caller can log it).

    The fast path (optional): a transport that can often deliver without waiting may also
    define ``send_nowait(scope_id, expiration_time, signal=None, mono=None, dump=False,
    kill_after=0.0, cancelled=False) -> bool`` (:data:`SendNowait`): deliver this
    process's request for ``scope_id`` at once, given by its fields rather than as a
    :class:`~aiotimer.wire.Request` (a release: ``expiration_time < 0``, ``cancelled``
    when the block's task was cancelled at its deadline, the other fields ignored; an
    acquire: ``signal`` ``None`` for the client's own, ``mono`` the deadline on
    ``time.monotonic()``, ``dump`` asks for a stack dump before the reap, ``kill_after``
    > 0 says the block's own deadline is that much earlier, its second tier), and
    return ``True``; or return ``False`` when delivering would need a wait (nothing is
    delivered then; the caller builds the request and falls back to ``send`` or
    ``send_async``). It must never block, nor raise for a condition ``send`` would wait
    out. Blocks call it first, so the common case builds no request and the async face
    costs no coroutine; it is looked up on the client, so a subclass keeps it.
    :class:`~aiotimer.FifoClient` has one.
    """

    @property
    def signal(self) -> int:
        """The signal timers acquired through this client are reaped with by default."""
        ...

    def send(self, request: Request) -> None:
        """Deliver ``request`` to the server (acquire or release)."""
        ...

    async def send_async(self, request: Request) -> None:
        """Deliver ``request`` to the server, awaiting instead of blocking."""
        ...


def client_signal(signal: int) -> int:
    """``signal`` as a client's default signal, or ``ValueError`` naming the limit."""
    problem = signal_problem(int(signal))
    if problem is not None:
        raise ValueError(problem)
    return int(signal)


def delivered_late(request: Request, waited: float) -> Request:
    """``request`` as delivered ``waited`` seconds after it was built: an acquire's
    deadlines (epoch and monotonic) move later by that much, a release is unchanged."""
    if waited <= 0 or request.expiration_time < 0:
        return request
    mono = None if request.mono is None else request.mono + waited
    return msgspec.structs.replace(
        request, expiration_time=request.expiration_time + waited, mono=mono
    )


def _log_failed_release(
    logger: logging.Logger, scope: str, exc: Exception, body_exc: BaseException | None
) -> None:
    if body_exc is None:
        logger.warning(
            "releasing scope %r failed (%s: %s) after the block ended; where the server is "
            "still there the release is retried in the background",
            scope,
            type(exc).__name__,
            exc,
        )
    else:
        logger.warning(
            "releasing scope %r failed (%s: %s) while the block raised %s; the block's "
            "exception propagates",
            scope,
            type(exc).__name__,
            exc,
            type(body_exc).__name__,
        )


def release_undelivered(scope: str, exc: Exception, body_exc: BaseException | None) -> None:
    """Report a release that could not be delivered when a block ended, and return:
    an aiotimer block never raises for its release (the block's own exception, a
    ``CancelledError`` included, propagates untouched, and finished work stays finished).
    """
    _log_failed_release(log, scope, exc, body_exc)


def release_failed(
    scope: str,
    exc: Exception,
    body_exc: BaseException | None,
    *,
    logger: logging.Logger = log,
) -> None:
    """torch's rule for a failed release: re-raise it, unless the block's own exception
    is propagating; then log it (on ``logger``) and let the block's exception go on."""
    if body_exc is None:
        raise exc
    _log_failed_release(logger, scope, exc, body_exc)


# -- the shared wait machinery --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sleep:
    """Wait this many seconds, then try again."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Writable:
    """Wait until ``fd`` is writable, at most ``timeout`` seconds."""

    fd: int  # a descriptor private to this wait (a dup), so nobody closes it under us
    timeout: float


Wait = Sleep | Writable
#: A sending generator: yields waits, is sent whether the wait succeeded.
Steps = Generator[Wait, bool | None, None]


def drive(steps: Steps) -> None:
    """Run a sending generator, waiting by blocking the calling thread."""
    ready: bool | None = None  # a generator must be started with None
    while True:
        try:
            step = steps.send(ready)
        except StopIteration:
            return
        if isinstance(step, Sleep):
            time.sleep(step.seconds)
            ready = True
        else:
            poller = select.poll()
            poller.register(step.fd, select.POLLOUT)
            ready = bool(poller.poll(max(0.0, step.timeout) * 1000.0))


async def drive_async(steps: Steps, *, shield: bool = False) -> None:
    """Run a sending generator, waiting by awaiting (the event loop stays free).

    With ``shield`` the waits are not interrupted by cancellation: used for releases, so
    a cancelled task still tells the server it left its block (every wait is bounded).
    """
    # Imported here, not at the top: a worker that never waits (the common case) never
    # loads anyio, which keeps `from aiotimer import expires` light.
    import anyio  # noqa: PLC0415

    with anyio.CancelScope(shield=shield):
        ready: bool | None = None  # a generator must be started with None
        while True:
            try:
                step = steps.send(ready)
            except StopIteration:
                return
            if isinstance(step, Sleep):
                await anyio.sleep(step.seconds)
                ready = True
            else:
                with anyio.move_on_after(step.timeout):
                    await anyio.wait_writable(step.fd)
                    ready = True
                    continue
                ready = False


def next_retry(delay: float) -> float:
    """The pause after ``delay``: doubled, at most :data:`RETRY_MAX`."""
    return min(delay * 2, RETRY_MAX)
