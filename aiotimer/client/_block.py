"""The timed block, :class:`Expires`: its lifecycle, its two faces (``with`` and
``async with``) and its use as a decorator. :mod:`aiotimer.client._expires` makes them
(``expires()``, ``expires_at()``).

How this works
--------------
An :class:`Expires` is used once. Its state follows CPython's ``asyncio.Timeout``
(``Lib/asyncio/timeouts.py``) and aio-libs' ``async_timeout``, plus one state for a
decorator's template; every transition is guarded, and anything else is a
``RuntimeError`` that names the block, its state and what to do::

    created ──enter──▶ active ──exit──▶ exited
       │                 │  ▲
       │                 │  └─reschedule (a new deadline, sent to the server)
       │                 └─deadline (async with, two tiers: the task is cancelled)
       │                       ──▶ expiring ──exit──▶ expired (TimeoutError if the
       │                                              cancellation is what ended it)
       ├─enter fails──▶ exited (the body never runs; the block is forgotten)
       └─decorate──▶ template (each call of the function is a block of its own)

A ``with`` block never expires on the client: at its deadline the server reaps the
process. Entering sends the acquire and leaving the release through the client's fast
path (``send_nowait``: this process's request by its fields, no ``Request`` built) when
it has one and can deliver at once, else through ``send()`` / ``send_async()``. The
state is an enum compared by identity with module constants: this is the hot path.
"""

from __future__ import annotations

import enum
import functools
import inspect
import sys
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Final, ParamSpec, TypeVar, overload

from aiotimer.client._block_checks import (
    MAX_FLOAT,
    deadline_problem,
    scope_checked,
    valid_scopes,
)
from aiotimer.client._block_context import asks_for_dump, current_asyncio_task
from aiotimer.client._discovery import current_client
from aiotimer.client._task_deadline import TaskDeadline
from aiotimer.client._transport import SendNowait, TimerClient, release_undelivered
from aiotimer.core import current_pid, scope_at_site, scope_site, with_task
from aiotimer.wire import Learned, Request, number_problem, signal_problem

__all__ = ["DEFAULT_KILL_AFTER", "Expires"]


class _State(enum.Enum):
    """Where an :class:`Expires` is in its life (see the module docs)."""

    CREATED = "created"
    ENTERED = "active"
    EXPIRING = "expiring"
    EXPIRED = "expired"
    EXITED = "exited"
    TEMPLATE = "template"


# The states as module constants: a global lookup, not an attribute of the enum class.
_CREATED: Final = _State.CREATED
_ENTERED: Final = _State.ENTERED
_EXPIRING: Final = _State.EXPIRING
_EXPIRED: Final = _State.EXPIRED
_EXITED: Final = _State.EXITED
_TEMPLATE: Final = _State.TEMPLATE
#: Why a block in each state cannot do what it was asked (the misuse errors).
_WHY_NOT: Final = {
    _CREATED: "it was never entered",
    _ENTERED: "it is running",
    _EXPIRING: "its deadline passed and its task is being cancelled",
    _EXPIRED: "it has ended at its deadline",
    _EXITED: "it has ended",
    _TEMPLATE: "it decorates a function, whose every call is a block of its own",
}
#: What to do instead, by what was asked.
_INSTEAD: Final = {
    "enter": "a block can be entered only once: make a fresh expires() for each",
    "exit": "a block is left once, after it was entered",
    "reschedule": "only a running block can move its deadline",
    "decorate": "decorate with a fresh expires()",
}

_monotonic: Final = time.monotonic
_wall: Final = time.time
_modules: Final = sys.modules
#: How long after an ``async with`` block's deadline (when its task is cancelled) the
#: server reaps the process if the block has still not ended.
DEFAULT_KILL_AFTER: Final[float] = 5.0
_P = ParamSpec("_P")
_R = TypeVar("_R")


class Expires:
    """A timed block: usable once, as ``with`` or as ``async with``, or as a decorator
    (see :func:`expires`; give exactly one of ``after`` and ``deadline``).

    ``per_call_scope`` says ``scope`` is a default scope id (:func:`expires` without
    ``scope=`` builds them valid by construction, so they are not checked again): an
    async block adds its task's name to it, and a decorator gives each call its own.

    Its life (``repr()`` shows where it is): ``created``, ``active`` once entered,
    ``exited`` once left; an ``async with`` block whose deadline passes is ``expiring``
    until it is left, then ``expired``; a decorator's is a ``template``. Anything out of
    turn (entering twice, leaving a block never entered, rescheduling one that has
    ended) raises ``RuntimeError``.

    Attributes:
        scope: the scope id sent to the server.
        deadline: the block's deadline on ``time.monotonic()`` (set on entry for
            ``expires``); in ``async with``, when the block's task is cancelled.
    """

    __slots__ = (
        "_after",
        "_client",
        "_kill_after",
        "_learned",
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
    _learned: Learned | None
    _nowait: SendNowait | None
    _per_call_scope: bool
    _signal: int | None
    _state: _State
    _timeout: TaskDeadline | None

    def __init__(  # noqa: PLR0917 (positional: keywords cost ~0.15 us a call on 3.11)
        self,
        scope: str,
        after: float | Learned | None,
        deadline: float | None,
        client: TimerClient | None,
        signal: int | None,
        kill_after: float | None = None,
        per_call_scope: bool = False,
    ) -> None:
        # Refused here, at entry, whatever the server would reject: such a block would
        # otherwise run with no timer at all. Each test is the validator's own; the
        # common cases are answered from what was already checked (see scope_checked).
        # A learned timeout (checked when made) is sent with its deadline at `initial`.
        self._learned = None
        if isinstance(after, Learned):
            self._learned = after
            after = after.initial
        if deadline is None and after is not None:
            problem = None if 0 <= after <= MAX_FLOAT else number_problem("after", after, minimum=0)
        elif after is None and deadline is not None:
            problem = deadline_problem(deadline)
        else:
            raise TypeError("give exactly one of after and deadline")
        if not (per_call_scope or scope in valid_scopes):
            problem = problem or scope_checked(scope)
        if signal is not None:
            problem = problem or signal_problem(signal)
        if kill_after is not None and not 0 <= kill_after <= MAX_FLOAT:
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
        """Enter (``created`` -> ``active``): fix the client and the deadline; send the
        acquire, whose deadline is ``kill_after`` seconds past the block's (the async
        face's second tier), at once if the client can, else return it.
        """
        client = self._client
        if client is None:
            client = self._client = current_client()
        nowait = self._nowait = getattr(client, "send_nowait", None)
        if self._learned is not None:  # the fast path carries no spec
            nowait = None
        mono = _monotonic()
        wall = _wall()
        after = self._after
        deadline = self.deadline if after is None else mono + after
        assert deadline is not None
        self.deadline = deadline
        self._state = _ENTERED
        reap_at = deadline + kill_after
        dump = False
        if kill_after > 0:  # asks_for_dump(), inlined: this runs for every async block
            hooks = _modules.get("aiotimer.client._dump_hook")
            dump = hooks is not None and hooks._hook is not None
        expiration_time = wall + (reap_at - mono)
        try:
            if nowait is not None and nowait(
                self.scope, expiration_time, self._signal, reap_at, dump, kill_after
            ):
                return None
        except BaseException:
            self._state = _EXITED
            raise
        return self._acquire_request(expiration_time, reap_at, dump, kill_after, self._learned)

    def _acquire_request(
        self,
        expiration_time: float,
        reap_at: float,
        dump: bool,
        kill_after: float,
        learned: Learned | None = None,
    ) -> Request:
        """The acquire of this block as a :class:`Request`, for ``send()``."""
        signal = self._signal
        if signal is None:
            signal = self._sender().signal
        # Positional: pid, scope_id, expiration_time (epoch), signal, version, mono,
        # grace, group, dump, start_time, kill_after (two tiers: the server is told when
        # the block's own deadline is, so it can show both), cancelled, learned.
        return Request(
            current_pid(),
            self.scope,
            expiration_time,
            signal,
            None,
            reap_at,
            None,
            False,
            dump,
            None,
            kill_after or None,
            False,
            learned,
        )

    def _release(self, cancelled: bool = False) -> Request | None:
        """Send the release at once if the client can, else return it. ``cancelled``:
        the block's task was cancelled at its deadline (the release says so, so the
        server can report the first tier)."""
        nowait = self._nowait
        if cancelled:
            if nowait is not None and nowait(self.scope, -1, 0, None, False, 0.0, True):
                return None
            return Request(current_pid(), self.scope, -1, 0, cancelled=True)
        if nowait is not None and nowait(self.scope, -1, 0, None, False):
            return None
        return Request(current_pid(), self.scope, -1, 0)

    def _on_deadline(self) -> None:
        """``active`` -> ``expiring``: the loop cancelled this block's task at its
        deadline (called by its :class:`~aiotimer.client._task_deadline.TaskDeadline`)."""
        if self._state is _ENTERED:
            self._state = _EXPIRING

    def _misuse(self, action: str) -> RuntimeError:
        return RuntimeError(
            f"{self!r} cannot {action}: {_WHY_NOT[self._state]} ({_INSTEAD[action]})"
        )

    def __enter__(self) -> Expires:
        if self._state is not _CREATED:
            raise self._misuse("enter")
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
        if self._state is not _ENTERED:
            raise self._misuse("exit")
        self._state = _EXITED
        try:
            nowait = self._nowait  # _release(), inlined: this runs for every block
            if nowait is not None and nowait(self.scope, -1, 0, None, False):
                return
            self._sender().send(Request(current_pid(), self.scope, -1, 0))
        except Exception as release_exc:
            release_undelivered(self.scope, release_exc, exc)

    async def __aenter__(self) -> Expires:
        if self._state is not _CREATED:
            raise self._misuse("enter")
        self._timeout = None
        kill_after = DEFAULT_KILL_AFTER if self._kill_after is None else self._kill_after
        task = current_asyncio_task() if kill_after > 0 or self._per_call_scope else None
        if task is None or kill_after == 0:
            kill_after = 0.0  # one tier: the server reaps at the deadline
        if task is not None and self._per_call_scope:
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
            self._timeout = TaskDeadline(task, self.deadline, self, task.cancelling())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        state = self._state
        if state is _ENTERED:
            self._state = _EXITED
        elif state is _EXPIRING:
            self._state = _EXPIRED
        else:
            raise self._misuse("exit")
        timeout = self._timeout
        if timeout is not None:
            self._timeout = None
            timeout.stop()  # the release below may wait: the deadline must not cut it
        try:
            request = self._release(state is _EXPIRING)
            if request is not None:
                await self._sender().send_async(request)
        except Exception as release_exc:
            release_undelivered(self.scope, release_exc, exc)
        if state is _EXPIRING:
            assert timeout is not None
            # A cancellation the deadline caused becomes TimeoutError; any other (an
            # outer cancellation) propagates untouched.
            timeout.timed_out(exc_type, exc)

    def reschedule(self, deadline: float) -> None:
        """Move the running block's deadline to ``deadline`` (on ``time.monotonic()``),
        as ``asyncio.Timeout.reschedule`` does: the server gets an acquire of the same
        scope with the new deadline (``kill_after`` past it for a two-tier block), which
        replaces its timer; an ``async with`` block's task is then cancelled at the new
        deadline instead. An earlier deadline is allowed, a past one expires at once.

        Like entering a ``with`` block, this may wait (blocking, for at most the
        client's bounds) when the client cannot deliver at once.

        Raises:
            RuntimeError: the block is not running: not entered yet, past its deadline
                (``expiring``), or ended.
            ValueError: ``deadline`` is not a finite number, or is an epoch time (see
                :func:`expires_at`).
            ServerUnavailableError: the new deadline was not delivered; the old one
                stands.
            ClientBackpressureError: likewise, the server's pipe stayed full.
        """
        if self._state is not _ENTERED:
            raise self._misuse("reschedule")
        problem = deadline_problem(deadline)
        if problem is not None:
            raise ValueError(problem)
        timeout: TaskDeadline | None = getattr(self, "_timeout", None)  # unset: `with`
        kill_after = 0.0
        if timeout is not None:  # two tiers
            kill_after = DEFAULT_KILL_AFTER if self._kill_after is None else self._kill_after
        reap_at = deadline + kill_after
        expiration_time = _wall() + (reap_at - _monotonic())
        dump = kill_after > 0 and asks_for_dump()
        nowait = self._nowait
        if nowait is None or not nowait(
            self.scope, expiration_time, self._signal, reap_at, dump, kill_after
        ):
            self._sender().send(self._acquire_request(expiration_time, reap_at, dump, kill_after))
        self.deadline = deadline
        if timeout is not None:
            self._timeout = timeout.moved(deadline)

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
            RuntimeError: this block was entered, or decorates a function already.
        """
        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            raise TypeError(
                f"expires() cannot decorate the generator function {func.__qualname__}: "
                "calling it only creates the generator, so its work would go untimed; "
                "put the block inside the generator, or around the loop that consumes it"
            )
        if self._state is not _CREATED:
            raise self._misuse("decorate")
        self._state = _TEMPLATE
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
        scope, deadline = self.scope, self.deadline
        after: float | Learned | None = self._learned or self._after
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
        state = self._state
        deadline = self.deadline
        if deadline is None and self._learned is not None:
            when = f"after=learned(initial={self._learned.initial:g})"
        elif deadline is None:
            when = f"after={self._after:g}s"
        else:
            when = f"deadline={deadline:.3f}"
            if state is _ENTERED or state is _EXPIRING:
                when += f" ({deadline - time.monotonic():.3f}s left)"
        return f"<Expires [{state.value}] scope={self.scope!r} {when}>"
