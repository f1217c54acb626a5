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
path when it has one and can deliver at once (a FifoClient's own, ``_block_nowait``, or
``send_nowait``: no ``Request`` built), else through ``send()`` / ``send_async()``. An
``async with`` block of two tiers is its own deadline (``_task_deadline``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar, overload

from aiotimer.client._block_checks import (
    MAX_FLOAT,
    deadline_problem,
    scope_checked,
    valid_scopes,
)
from aiotimer.client._block_context import asks_for_dump, current_asyncio_task
from aiotimer.client._block_decorator import block_maker, generator_refused, timed
from aiotimer.client._block_states import (
    CREATED,
    ENTERED,
    EXITED,
    EXPIRED,
    EXPIRING,
    TEMPLATE,
    State,
    misuse,
)
from aiotimer.client._discovery import current_client
from aiotimer.client._task_deadline import arm, disarm, timed_out
from aiotimer.client._transport import (
    BlockNowait,
    SendNowait,
    TimerClient,
    release_undelivered,
)
from aiotimer.core import current_pid, with_task
from aiotimer.wire import Learned, Request, number_problem, signal_problem

if TYPE_CHECKING:
    import asyncio


__all__ = ["DEFAULT_KILL_AFTER", "Expires"]


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
        "_blocks",
        "_cancelling",
        "_client",
        "_deadlines",
        "_entry",
        "_kill_after",
        "_learned",
        "_nowait",
        "_per_call_scope",
        "_signal",
        "_state",
        "_task",
        "deadline",
        "scope",
    )
    _blocks: BlockNowait | None
    _nowait: SendNowait | None
    _state: State
    _task: asyncio.Task[Any] | None
    # An async two-tier block is its own deadline (see aiotimer.client._task_deadline).
    _cancelling: int
    _entry: float | None
    _deadlines: Any

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
        # Refused here, whatever the server would reject (such a block would run with no
        # timer): the validator's tests, the common cases answered from what was already
        # checked (scope_checked). A learned timeout is sent with its `initial` deadline.
        learned = None
        seconds: float | None = None
        if deadline is None:
            if type(after) is float or type(after) is int:  # before isinstance(Learned),
                seconds = after  # ~0.15 us for a msgspec Struct (its metaclass)
            elif isinstance(after, Learned):
                learned = after
                seconds = after.initial
            elif after is None:
                raise TypeError("give exactly one of after and deadline")
            else:
                seconds = after
            problem = (
                None if 0 <= seconds <= MAX_FLOAT else number_problem("after", seconds, minimum=0)
            )
        elif after is None:
            problem = deadline_problem(deadline)
        else:
            raise TypeError("give exactly one of after and deadline")
        if not per_call_scope and scope not in valid_scopes:
            problem = problem or scope_checked(scope)
        if signal is not None:
            problem = problem or signal_problem(signal)
        if kill_after is not None and not 0 <= kill_after <= MAX_FLOAT:
            problem = problem or number_problem("kill_after", kill_after, minimum=0)
        if problem is not None:
            raise ValueError(problem)
        self.scope = scope
        self._after = seconds
        self.deadline = deadline
        self._client = client
        self._signal = signal
        self._kill_after = kill_after
        self._learned = learned
        self._per_call_scope = per_call_scope
        self._state = CREATED

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
        # The client's own fast path (a FifoClient's), else its send_nowait, if any.
        blocks = self._blocks = getattr(client, "_block_nowait", None)
        self._nowait = None if blocks is not None else getattr(client, "send_nowait", None)
        mono = _monotonic()
        wall = _wall()
        after = self._after
        deadline = self.deadline if after is None else mono + after
        assert deadline is not None
        self.deadline = deadline
        self._state = ENTERED
        reap_at = deadline + kill_after
        dump = False
        if kill_after > 0:  # asks_for_dump(), inlined: this runs for every async block
            hooks = _modules.get("aiotimer.client._dump_hook")
            dump = hooks is not None and hooks._hook is not None
        expiration_time = wall + (reap_at - mono)
        learned = self._learned
        if learned is None:  # the fast path carries no spec
            try:
                if blocks is not None:  # _acquired(), inlined: this runs for every async block
                    if blocks.acquire(
                        self.scope, expiration_time, reap_at, mono, self._signal, dump, kill_after
                    ):
                        return None
                elif self._acquired(expiration_time, reap_at, mono, dump, kill_after):
                    return None
            except BaseException:
                self._state = EXITED
                raise
        return self._acquire_request(expiration_time, reap_at, dump, kill_after, learned)

    def _acquired(
        self, expiration_time: float, reap_at: float, now: float, dump: bool, kill_after: float
    ) -> bool:
        """Whether the client's fast path delivered this acquire at once."""
        blocks = self._blocks
        if blocks is not None:
            return blocks.acquire(
                self.scope, expiration_time, reap_at, now, self._signal, dump, kill_after
            )
        nowait = self._nowait
        return nowait is not None and nowait(
            self.scope, expiration_time, self._signal, reap_at, dump, kill_after
        )

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
        # kill_after (two tiers): the server is told when the block's own deadline is.
        return Request(
            current_pid(),
            self.scope,
            expiration_time,
            signal,
            mono=reap_at,
            dump=dump,
            kill_after=kill_after or None,
            learned=learned,
        )

    def _release(self, cancelled: bool) -> Request | None:
        """After the client's own block path (if it has one) declined the release: send
        it through the client's ``send_nowait`` if it can, else return it for ``send()``.
        ``cancelled``: the block's task was cancelled at its deadline (the release says
        so, so the server can report the first tier)."""
        if self._blocks is None:
            nowait = self._nowait
            if nowait is not None and (
                nowait(self.scope, -1, 0, None, False, 0.0, True)
                if cancelled
                else nowait(self.scope, -1, 0, None, False)
            ):
                return None
        return Request(current_pid(), self.scope, -1, 0, cancelled=cancelled)

    def _on_deadline(self) -> None:
        """``active`` -> ``expiring``: the loop cancelled this block's task at its
        deadline (called by :mod:`aiotimer.client._task_deadline`)."""
        if self._state is ENTERED:
            self._state = EXPIRING

    def _misuse(self, action: str) -> RuntimeError:
        return misuse(self, self._state, action)

    def __enter__(self) -> Expires:
        if self._state is not CREATED:
            raise self._misuse("enter")
        client = self._client
        if client is None:
            client = self._client = current_client()
        blocks = getattr(client, "_block_nowait", None)
        if blocks is None or self._learned is not None:
            request = self._acquire()
        else:  # _acquire() for a FifoClient's block of one tier, inlined: the common block
            self._blocks = blocks
            mono = _monotonic()
            wall = _wall()
            after = self._after
            deadline = self.deadline if after is None else mono + after
            assert deadline is not None
            self.deadline = deadline
            self._state = ENTERED
            expiration_time = wall + (deadline - mono)
            try:
                if blocks.acquire(self.scope, expiration_time, deadline, mono, self._signal):
                    return self
            except BaseException:
                self._state = EXITED
                raise
            request = self._acquire_request(expiration_time, deadline, False, 0.0)
        if request is not None:
            try:
                self._sender().send(request)
            except BaseException:
                self._state = EXITED
                raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._state is not ENTERED:
            raise self._misuse("exit")
        self._state = EXITED
        try:
            blocks = self._blocks  # the client's own path first: this runs for every block
            if blocks is not None and blocks.release(self.scope):
                return
            request = self._release(False)
            if request is not None:
                self._sender().send(request)
        except Exception as release_exc:
            release_undelivered(self.scope, release_exc, exc)

    async def __aenter__(self) -> Expires:
        if self._state is not CREATED:
            raise self._misuse("enter")
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
                self._state = EXITED
                raise
        if kill_after > 0:
            assert self.deadline is not None and task is not None
            self._task = task
            self._cancelling = task.cancelling()
            arm(self, self.deadline)
        else:
            self._task = None
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        state = self._state
        if state is ENTERED:
            self._state = EXITED
        elif state is EXPIRING:
            self._state = EXPIRED
        else:
            raise self._misuse("exit")
        if self._task is not None:
            disarm(self)  # the release below may wait: the deadline must not cut it
        try:
            blocks, cancelled = self._blocks, state is EXPIRING  # its own path first
            if blocks is None or not blocks.release(self.scope, cancelled):
                request = self._release(cancelled)
                if request is not None:
                    await self._sender().send_async(request)
        except Exception as release_exc:
            release_undelivered(self.scope, release_exc, exc)
        if state is EXPIRING:
            # A cancellation the deadline caused becomes TimeoutError; any other (an
            # outer cancellation) propagates untouched.
            timed_out(self, exc_type, exc)

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
        if self._state is not ENTERED:
            raise self._misuse("reschedule")
        problem = deadline_problem(deadline)
        if problem is not None:
            raise ValueError(problem)
        two_tiers = getattr(self, "_task", None) is not None  # unset: `with`
        kill_after = 0.0
        if two_tiers:
            kill_after = DEFAULT_KILL_AFTER if self._kill_after is None else self._kill_after
        reap_at = deadline + kill_after
        expiration_time = _wall() + (reap_at - _monotonic())
        dump = kill_after > 0 and asks_for_dump()
        if not self._acquired(expiration_time, reap_at, _monotonic(), dump, kill_after):
            self._sender().send(self._acquire_request(expiration_time, reap_at, dump, kill_after))
        self.deadline = deadline
        if two_tiers:
            arm(self, deadline)

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
        refused = generator_refused(func)
        if refused is not None:
            raise refused
        if self._state is not CREATED:
            raise self._misuse("decorate")
        self._state = TEMPLATE
        return timed(func, self._template())

    def _template(self) -> Callable[[], Expires]:
        """A maker of fresh blocks with this block's settings (a default scope: each at
        the same site, valid by construction, naming its task)."""
        after: float | Learned | None = self._learned or self._after
        deadline, client, signal, kill = self.deadline, self._client, self._signal, self._kill_after
        per_call = self._per_call_scope
        return block_maker(
            lambda scope: Expires(scope, after, deadline, client, signal, kill, per_call),
            self.scope,
            per_call,
        )

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
            if state is ENTERED or state is EXPIRING:
                when += f" ({deadline - time.monotonic():.3f}s left)"
        return f"<Expires [{state.value}] scope={self.scope!r} {when}>"
