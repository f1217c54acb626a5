"""Heartbeats: a timer that a loop keeps pushing forward.

>>> with watchdog(30) as wd:               # doctest: +SKIP
...     for batch in loader:
...         train(batch)
...         wd.kick()

The block is reaped when ``timeout`` seconds pass without a kick (entering counts as
the first kick). Kicks are rate-limited on the client side: a kick less than
``min_kick_interval`` after the last one *sent* only records the time locally, so a tight
loop costs a clock read per kick, not a server request.

:func:`loop_watchdog` watches an event loop instead of a block: a tiny task kicks while
the loop runs, so a loop that stops running (a blocking call, a GIL-holding extension)
is reaped, inside a timed block or not.

Guarantee: the server's deadline is never earlier than
``last_kick + timeout - min_kick_interval``, and never later than
``last_kick + timeout``. So a loop that stops kicking is reaped between
``timeout - min_kick_interval`` and ``timeout`` seconds after its last kick
(plus the server's reaping latency), and a loop that kicks at least every
``timeout - min_kick_interval`` seconds is never reaped.
"""

from __future__ import annotations

import logging
import math
import sys
from types import TracebackType
from typing import TYPE_CHECKING, Any

from aiotimer.client._clients import TimerClient, current_client, release_undelivered
from aiotimer.core import current_pid, default_scope
from aiotimer.wire import Request

if TYPE_CHECKING:
    import asyncio

    from aiotimer._edges.clock import Clock

logger = logging.getLogger("aiotimer.client")

__all__ = ["LoopWatchdog", "Watchdog", "loop_watchdog", "watchdog"]


def _system_clock() -> Clock:
    # Imported on use: the clock module loads anyio, which a worker that only times
    # blocks does not need (this module is loaded with the package).
    from aiotimer._edges.clock import MonotonicClock  # noqa: PLC0415

    return MonotonicClock()


class Watchdog:
    """A heartbeat timer (see :func:`watchdog`). Use once, as ``with`` or ``async with``."""

    __slots__ = (
        "_client",
        "_clock",
        "_entered",
        "_exited",
        "_last_kick",
        "_last_sent",
        "_signal",
        "min_kick_interval",
        "scope",
        "sent",
        "timeout",
    )

    def __init__(
        self,
        timeout: float,
        *,
        scope: str,
        client: TimerClient | None = None,
        min_kick_interval: float | None = None,
        signal: int | None = None,
        clock: Clock | None = None,
    ) -> None:
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be a finite number > 0, got {timeout!r}")
        interval = timeout / 10 if min_kick_interval is None else min_kick_interval
        if not (0 <= interval < timeout):
            raise ValueError(
                f"min_kick_interval must be >= 0 and < timeout ({timeout}), got {interval!r}"
            )
        self.timeout = float(timeout)
        self.min_kick_interval = float(interval)
        self.scope = scope
        self._client = client
        self._signal = signal
        self._clock: Clock = clock if clock is not None else _system_clock()
        self._entered = self._exited = False
        self._last_kick = self._last_sent = -math.inf
        #: How many acquires this watchdog has sent (entry included).
        self.sent = 0

    @property
    def last_kick(self) -> float:
        """The clock's monotonic time of the latest kick (entry counts as one)."""
        return self._last_kick

    @property
    def server_deadline(self) -> float:
        """The deadline (monotonic) the server holds: ``last sent kick + timeout``."""
        return self._last_sent + self.timeout

    # -- the one place requests are built --------------------------------------------

    def _due(self) -> Request | None:
        """Record a kick now; return the acquire to send, or ``None`` if rate-limited."""
        if not self._entered or self._exited:
            raise RuntimeError(f"kick() outside the watchdog's block: {self!r}")
        now = self._clock.monotonic()
        self._last_kick = now
        if now - self._last_sent < self.min_kick_interval:
            return None
        self._last_sent = now
        self.sent += 1
        client = self._client
        assert client is not None
        return Request(
            pid=current_pid(),
            scope_id=self.scope,
            expiration_time=self._clock.time() + self.timeout,
            signal=client.signal if self._signal is None else self._signal,
            mono=now + self.timeout,
        )

    def _enter(self) -> tuple[TimerClient, Request]:
        if self._entered:
            raise RuntimeError(f"{self!r} can be entered only once")
        if self._client is None:
            self._client = current_client()
        self._entered = True
        request = self._due()
        assert request is not None
        return self._client, request

    def _exit(self) -> tuple[TimerClient, Request]:
        self._exited = True
        assert self._client is not None
        return self._client, Request(
            pid=current_pid(), scope_id=self.scope, expiration_time=-1, signal=0
        )

    # -- kicks -------------------------------------------------------------------------

    def kick(self) -> None:
        """Push the deadline to ``timeout`` seconds from now (rate-limited; may block
        for a bounded time if the server's pipe is full — use :meth:`akick` in async code).
        """
        request = self._due()
        if request is not None:
            assert self._client is not None
            self._client.send(request)

    async def akick(self) -> None:
        """Like :meth:`kick`, waiting by awaiting instead of blocking."""
        request = self._due()
        if request is not None:
            assert self._client is not None
            await self._client.send_async(request)

    # -- the two faces -----------------------------------------------------------------

    def __enter__(self) -> Watchdog:
        client, request = self._enter()
        client.send(request)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        client, request = self._exit()
        try:
            client.send(request)
        except Exception as release_exc:
            release_undelivered(self.scope, release_exc, exc)

    async def __aenter__(self) -> Watchdog:
        client, request = self._enter()
        await client.send_async(request)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        client, request = self._exit()
        try:
            await client.send_async(request)
        except Exception as release_exc:
            release_undelivered(self.scope, release_exc, exc)

    def __repr__(self) -> str:
        state = "exited" if self._exited else "active" if self._entered else "created"
        return (
            f"<Watchdog {state} scope={self.scope!r} timeout={self.timeout:g}s "
            f"min_kick_interval={self.min_kick_interval:g}s sent={self.sent}>"
        )


def watchdog(
    timeout: float,
    *,
    scope: str | None = None,
    client: TimerClient | None = None,
    min_kick_interval: float | None = None,
    signal: int | None = None,
    clock: Clock | None = None,
) -> Watchdog:
    """A heartbeat block: reaped when ``timeout`` seconds pass without a :meth:`~Watchdog.kick`.

    Args:
        timeout: seconds allowed between kicks (entering the block is the first kick).
        scope: the scope id (default: ``"file.py:LINE#N"``, as for ``expires``).
        client: the transport (default: :func:`~aiotimer.client.current_client`).
        min_kick_interval: kicks closer than this to the last one sent are not sent
            (default ``timeout / 10``); see the module docstring for the guarantee.
        signal: the signal to reap with; default: the client's.
        clock: the time source (tests pass :class:`aiotimer.testing.FakeClock`).
    """
    return Watchdog(
        timeout,
        scope=default_scope() if scope is None else scope,
        client=client,
        min_kick_interval=min_kick_interval,
        signal=signal,
        clock=clock,
    )


class LoopWatchdog:
    """A watchdog on the running event loop (see :func:`loop_watchdog`); use once, as
    ``async with``."""

    __slots__ = ("_kicker", "_watchdog", "period", "stall_after")

    def __init__(
        self,
        stall_after: float,
        *,
        scope: str,
        client: TimerClient | None = None,
        signal: int | None = None,
    ) -> None:
        if not (math.isfinite(stall_after) and stall_after > 0):
            raise ValueError(f"stall_after must be a finite number > 0, got {stall_after!r}")
        self.stall_after = float(stall_after)
        #: Seconds between two kicks while the loop runs.
        self.period = self.stall_after / 4
        # Every kick is sent (they come every period): the server's deadline is always
        # the last kick + stall_after + period.
        self._watchdog = Watchdog(
            self.stall_after + self.period,
            scope=scope,
            client=client,
            min_kick_interval=0.0,
            signal=signal,
        )
        self._kicker: asyncio.Task[None] | None = None

    @property
    def scope(self) -> str:
        """The scope id of the loop's timer."""
        return self._watchdog.scope

    async def _kick_while_running(self) -> None:
        sleep = sys.modules["asyncio"].sleep
        while True:
            await sleep(self.period)
            try:
                await self._watchdog.akick()
            except Exception as exc:
                # The server is away (or its pipe full) for now. Kicking on is the only
                # safe course: a kicker that stopped would let a healthy loop be reaped
                # once the server is back and replays this timer.
                logger.warning(
                    "loop watchdog %r: a kick was not delivered (%s: %s); kicking on",
                    self.scope,
                    type(exc).__name__,
                    exc,
                )

    async def __aenter__(self) -> LoopWatchdog:
        if self._kicker is not None:
            raise RuntimeError(f"{self!r} can be entered only once")
        await self._watchdog.__aenter__()
        # asyncio is loaded: its loop runs this coroutine (this module does not import
        # it, so a worker that never runs a loop never loads it).
        self._kicker = sys.modules["asyncio"].ensure_future(self._kick_while_running())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        kicker: Any = self._kicker
        kicker.cancel()  # it ends at the loop's next turn; nothing waits for it
        await self._watchdog.__aexit__(exc_type, exc, tb)

    def __repr__(self) -> str:
        return (
            f"<LoopWatchdog stall_after={self.stall_after:g}s scope={self.scope!r} "
            f"kicks sent={self._watchdog.sent}>"
        )


def loop_watchdog(
    stall_after: float,
    *,
    scope: str | None = None,
    client: TimerClient | None = None,
    signal: int | None = None,
) -> LoopWatchdog:
    """Reap this process if its asyncio event loop stops running for ``stall_after`` s.

    ``async with loop_watchdog(stall_after=10): ...`` runs a tiny task on the loop that
    kicks a heartbeat timer every ``stall_after / 4`` seconds. While the loop runs, the
    server's deadline stays ahead; when the loop stops (a blocking call, a GIL-holding
    extension, a deadlock), the kicks stop and the server reaps the process (dumping
    its stacks first when the server is told to), between ``stall_after`` and
    ``1.25 * stall_after`` seconds after the loop last ran, inside a timed block or not.
    A healthy loop pays one wake-up and one request per period.

    Args:
        stall_after: seconds the loop may stop running before the process is reaped.
        scope: the timer's scope id (default: ``"file.py:LINE#N"`` of the caller).
        client: the transport (default: :func:`~aiotimer.client.current_client`).
        signal: the signal to reap with; default: the client's.
    """
    return LoopWatchdog(
        stall_after,
        scope=default_scope() if scope is None else scope,
        client=client,
        signal=signal,
    )
