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
"""

from __future__ import annotations

import functools
import inspect
import sys
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar, overload

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
    release_undelivered,
    under_timer_server,
    use_client,
)
from aiotimer.client._task_deadline import TaskDeadline
from aiotimer.client._transport import SendNowait
from aiotimer.core._scope import current_pid, default_scope, scope_at_site, scope_site, with_task
from aiotimer.wire._request import Request, number_problem, scope_id_problem, signal_problem

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_KILL_AFTER",
    "DEFAULT_SIGNAL",
    "DEFAULT_WRITE_TIMEOUT",
    "MAX_DEADLINE_AHEAD",
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


# Lifecycle of an Expires (plain ints: this is the hot path).
_CREATED, _ACTIVE, _EXITED = 0, 1, 2
_STATE_NAMES: Final = ("created", "active", "exited")
_monotonic: Final = time.monotonic
_wall: Final = time.time
_modules: Final = sys.modules
#: How long after an ``async with`` block's deadline (when its task is cancelled) the
#: server reaps the process if the block has still not ended.
DEFAULT_KILL_AFTER: Final[float] = 5.0
_P = ParamSpec("_P")
_R = TypeVar("_R")
#: An ``expires_at`` deadline further ahead than this (on ``time.monotonic()``) is taken
#: for what it almost surely is, an epoch time (``time.time()``, ~56 years ahead).
MAX_DEADLINE_AHEAD: Final[float] = 10 * 365.25 * 86400.0


#: The largest finite float: ``0 <= x <= _MAX_FLOAT`` holds exactly for the numbers
#: ``number_problem(name, x, minimum=0)`` accepts (finite, not negative).
_MAX_FLOAT: Final = sys.float_info.max
#: Explicit scope ids already found valid (a program names few, each many times).
_valid_scopes: set[str] = set()
#: Past this many explicit scope ids the set starts over (ids built on the fly).
_MAX_VALID_SCOPES: Final = 1024


def _scope_checked(scope: str) -> str | None:
    """:func:`scope_id_problem`, remembering the valid ids in :data:`_valid_scopes`."""
    problem = scope_id_problem(scope)
    if problem is None:
        if len(_valid_scopes) >= _MAX_VALID_SCOPES:
            _valid_scopes.clear()
        _valid_scopes.add(scope)
    return problem


def _deadline_problem(deadline: float) -> str | None:
    problem = number_problem("deadline", deadline)
    if problem is None and deadline - _monotonic() > MAX_DEADLINE_AHEAD:
        years = (deadline - _monotonic()) / (365.25 * 86400.0)
        problem = (
            f"deadline {deadline!r} is {years:.0f} years ahead on time.monotonic(), more than "
            f"MAX_DEADLINE_AHEAD ({MAX_DEADLINE_AHEAD:.0f} s): it looks like an epoch time "
            "(time.time()); expires_at() takes a time.monotonic() deadline: "
            "expires_at(time.monotonic() + seconds), or use expires(after=seconds)"
        )
    return problem


class Expires:
    """A timed block: usable once, as ``with`` or as ``async with``, or as a decorator
    (see :func:`expires`; give exactly one of ``after`` and ``deadline``).

    ``per_call_scope`` says ``scope`` is a default scope id (:func:`expires` without
    ``scope=`` builds them valid by construction, so they are not checked again): an
    async block adds its task's name to it, and a decorator gives each call its own.

    Attributes:
        scope: the scope id sent to the server.
        deadline: the block's deadline on ``time.monotonic()`` (set on entry for
            ``expires``); in ``async with``, when the block's task is cancelled.
    """

    __slots__ = (
        "_after",
        "_client",
        "_kill_after",
        "_nowait",
        "_per_call_scope",
        "_signal",
        "_state",
        "_timeout",
        "deadline",
        "scope",
    )
    scope: str
    deadline: float | None
    _after: float | None
    _client: TimerClient | None
    _kill_after: float | None
    _nowait: SendNowait | None
    _per_call_scope: bool
    _signal: int | None
    _state: int
    _timeout: TaskDeadline | None

    def __init__(  # noqa: PLR0917 (positional: keywords cost ~0.15 us a call on 3.11)
        self,
        scope: str,
        after: float | None,
        deadline: float | None,
        client: TimerClient | None,
        signal: int | None,
        kill_after: float | None = None,
        per_call_scope: bool = False,
    ) -> None:
        # Refused here, at entry, whatever the server would reject: such a block would
        # otherwise run with no timer at all. Each test is the validator's own; the
        # common cases are answered from what was already checked (see _scope_checked).
        if deadline is None and after is not None:
            problem = (
                None if 0 <= after <= _MAX_FLOAT else number_problem("after", after, minimum=0)
            )
        elif after is None and deadline is not None:
            problem = _deadline_problem(deadline)
        else:
            raise TypeError("give exactly one of after and deadline")
        if not (per_call_scope or scope in _valid_scopes):
            problem = problem or _scope_checked(scope)
        if signal is not None:
            problem = problem or signal_problem(signal)
        if kill_after is not None and not 0 <= kill_after <= _MAX_FLOAT:
            problem = problem or number_problem("kill_after", kill_after, minimum=0)
        if problem is not None:
            raise ValueError(problem)
        self.scope = scope
        self._after = after
        self.deadline = deadline
        self._client = client
        self._signal = signal
        self._kill_after = kill_after
        self._per_call_scope = per_call_scope
        self._state = _CREATED

    # -- entry and exit, shared by both faces ------------------------------------------
    #
    # Each tries the client's fast path (TimerClient.send_nowait: this process's request
    # by its fields, no Request built) and returns what it could not deliver so, for
    # send() or send_async().

    def _acquire(self, kill_after: float = 0.0) -> Request | None:
        """Enter: fix the client and the deadline; send the acquire, whose deadline is
        ``kill_after`` seconds past the block's (the async face's second tier), at once
        if the client can, else return it.

        A two-tier block is reaped only when its loop is blocked (or its cancellation
        swallowed): then a stack dump is what names the task holding the loop, so it
        asks the server for one when this process has the hook to answer it.
        """
        if self._state != _CREATED:
            raise RuntimeError(f"{self!r} can be entered only once")
        client = self._client
        if client is None:
            client = self._client = current_client()
        nowait = self._nowait = getattr(client, "send_nowait", None)
        mono = _monotonic()
        wall = _wall()
        after = self._after
        deadline = self.deadline if after is None else mono + after
        assert deadline is not None
        self.deadline = deadline
        self._state = _ACTIVE
        reap_at = deadline + kill_after
        # Read after current_client(): the first block of a worker that finds its server
        # through the environment installs the hook. Inlined (the module's hook record,
        # never loading the dump code): this runs for every async block.
        dump = False
        if kill_after > 0:
            diagnostics = _modules.get("aiotimer.client._dump_hook")
            dump = diagnostics is not None and diagnostics._hook is not None
        expiration_time = wall + (reap_at - mono)
        signal = self._signal
        try:
            if nowait is not None and nowait(self.scope, expiration_time, signal, reap_at, dump):
                return None
        except BaseException:
            self._state = _EXITED
            raise
        if signal is None:
            signal = client.signal
        # Positional: pid, scope_id, expiration_time (epoch), signal, version, mono,
        # grace, group, dump.
        return Request(
            current_pid(), self.scope, expiration_time, signal, None, reap_at, None, False, dump
        )

    def _release(self) -> Request | None:
        """Exit: send the release at once if the client can, else return it."""
        self._state = _EXITED
        nowait = self._nowait
        if nowait is not None and nowait(self.scope, -1, 0, None, False):
            return None
        return Request(current_pid(), self.scope, -1, 0)

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
        try:
            request = self._release()
            if request is not None:
                self._sender().send(request)
        except Exception as release_exc:
            release_undelivered(self.scope, release_exc, exc)

    async def __aenter__(self) -> Expires:
        self._timeout = None
        kill_after = DEFAULT_KILL_AFTER if self._kill_after is None else self._kill_after
        task = _current_asyncio_task() if kill_after > 0 or self._per_call_scope else None
        if task is None or kill_after == 0:
            kill_after = 0.0  # one tier: the server reaps at the deadline
        if task is not None and self._per_call_scope and self._state == _CREATED:
            self.scope = with_task(self.scope, task.get_name())  # events name the task
        request = self._acquire(kill_after)
        if request is not None:
            try:
                await self._sender().send_async(request)
            except BaseException:
                self._state = _EXITED
                raise
        if kill_after > 0:
            assert self.deadline is not None and task is not None
            self._timeout = TaskDeadline(task, self.deadline, self.scope)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        timeout = self._timeout
        if timeout is not None:
            timeout.stop()  # the release below may wait: the deadline must not cut it
        try:
            request = self._release()
            if request is not None:
                await self._sender().send_async(request)
        except Exception as release_exc:
            release_undelivered(self.scope, release_exc, exc)
        if timeout is not None:
            self._timeout = None
            # A cancellation the deadline caused becomes TimeoutError; any other (an
            # outer cancellation) propagates untouched.
            timeout.leave(exc_type, exc)

    # -- as a decorator ----------------------------------------------------------------

    @overload
    def __call__(
        self, func: Callable[_P, Awaitable[_R]]
    ) -> Callable[_P, Awaitable[_R]]: ...  # pragma: no cover

    @overload
    def __call__(self, func: Callable[_P, _R]) -> Callable[_P, _R]: ...  # pragma: no cover

    def __call__(self, func: Callable[_P, Any]) -> Callable[_P, Any]:
        """Time every call of ``func`` as a block with these settings (a decorator).

        Each call is a new block: with a default scope each gets its own id at the
        decorated line; an explicit scope is shared by all calls (one timer, as in
        torch). Coroutine functions get the ``async with`` face.

        Raises:
            TypeError: ``func`` is a generator or async generator function: a call only
                creates the generator, so nothing of its work would be timed (time the
                loop that consumes it, or a block inside it, instead).
        """
        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            raise TypeError(
                f"expires() cannot decorate the generator function {func.__qualname__}: "
                "calling it only creates the generator, so its work would go untimed; "
                "put the block inside the generator, or around the loop that consumes it"
            )
        if self._state != _CREATED:
            raise RuntimeError(f"{self!r} was entered: decorate with a fresh expires()")
        self._state = _EXITED  # this object is a template from now on, never entered
        new_block = self._template()
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def timed_coroutine(*args: _P.args, **kwargs: _P.kwargs) -> Any:
                async with new_block():
                    return await func(*args, **kwargs)

            return timed_coroutine

        @functools.wraps(func)
        def timed(*args: _P.args, **kwargs: _P.kwargs) -> Any:
            with new_block():
                return func(*args, **kwargs)

        return timed

    def _template(self) -> Callable[[], Expires]:
        """A maker of fresh blocks with this block's settings."""
        scope, after, deadline = self.scope, self._after, self.deadline
        client, signal, kill_after = self._client, self._signal, self._kill_after
        site = scope_site(scope) if self._per_call_scope else None

        def new_block() -> Expires:
            block_scope = scope if site is None else scope_at_site(site)
            # A default scope (site given) is valid by construction, and names its task.
            return Expires(
                block_scope, after, deadline, client, signal, kill_after, site is not None
            )

        return new_block

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
        after: seconds from entering the block to its deadline (>= 0).
        scope: the scope id; by default ``"file.py:LINE#N"`` with a process-wide ``N``,
            unique per block, so concurrent tasks on one line never collide. Blocks that
            share an explicit scope share one timer (torch's behaviour).
        client: the transport; by default :func:`current_client` on entry.
        signal: the signal to reap with (``<= 0``: report only); default: the client's.
        kill_after: ``async with`` only: seconds between the task's cancellation at the
            deadline and the server's reaping (default :data:`DEFAULT_KILL_AFTER`);
            ``0`` asks for one tier: no cancellation, the server reaps at the deadline.

    Raises:
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
    if scope is None:
        return Expires(default_scope(), after, None, client, signal, kill_after, True)
    return Expires(scope, after, None, client, signal, kill_after)


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
    if scope is None:
        return Expires(default_scope(), None, deadline, client, signal, kill_after, True)
    return Expires(scope, None, deadline, client, signal, kill_after)


def _current_asyncio_task() -> asyncio.Task[Any] | None:
    """The running asyncio task, or ``None`` (no asyncio loop runs in this thread)."""
    loaded = sys.modules.get("asyncio")  # loaded by any program that runs its loop
    if loaded is None:
        return None
    try:
        task: asyncio.Task[Any] | None = loaded.current_task()
    except RuntimeError:  # no running loop: trio, or no loop at all
        return None
    return task
