"""One owned-task lifecycle, written once: the timer server, the supervisor and the
control plane each run in a task they own, started and stopped through this.

Rules (the transitions are the table :data:`TRANSITIONS`):

* ``created -> starting -> running -> stopping -> stopped``; a restartable owner goes
  ``stopped -> starting`` again, any other starts once. A move the table does not list
  raises :class:`~aiotimer.errors.ServerStateError` with the state in its message.
* :meth:`OwnedTask.start` creates the task that runs the owner's *body* and returns once
  the body calls its ``ready()``: the state is then ``running``. A body that fails before
  ``ready()`` has ended its task when ``start()`` raises its exception (unwrapped from
  one-exception groups, so a caller sees the ``SourceError``, not an ``ExceptionGroup``).
  A ``start()`` that is cancelled stops the task before it re-raises.
* A stop is requested by :meth:`OwnedTask.aclose` (from the owner's loop), by the owner
  itself (:meth:`OwnedTask.request_stop`), or by the body returning; the body learns of it
  through :meth:`OwnedTask.stop_requested`. ``aclose()`` is idempotent and returns once
  the task has ended.
* The body's own task group lives in the owned task, so no cancel scope is ever left
  from another task, and nothing the owner's caller does cancels it halfway: ``start()``
  and ``aclose()`` wait on it through :func:`asyncio.shield`.
* An exception after ``ready()`` is logged as the owner's crash and ends the task
  (``stopped``); it is never raised into whoever called ``start()``. A ``BaseException``
  (a cancellation of the task itself, ``KeyboardInterrupt``) propagates.

An owner subclasses :class:`TaskOwner` (its ``state``, ``aclose()`` and ``async with``)
and writes only its ``start()`` and its body.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Final, Self

from aiotimer.errors import ServerStateError

__all__ = ["TRANSITIONS", "Body", "LifecycleState", "OwnedTask", "TaskOwner", "unwrap"]

logger = logging.getLogger("aiotimer")


class LifecycleState(enum.Enum):
    """Where an owner (a timer server, a supervisor, a control plane) is in its life."""

    CREATED = "created"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


#: The moves an :class:`OwnedTask` may make; ``stopped -> starting`` only if restartable.
TRANSITIONS: Final[dict[LifecycleState, frozenset[LifecycleState]]] = {
    LifecycleState.CREATED: frozenset({LifecycleState.STARTING}),
    LifecycleState.STARTING: frozenset(
        {LifecycleState.RUNNING, LifecycleState.STOPPING, LifecycleState.STOPPED}
    ),
    LifecycleState.RUNNING: frozenset({LifecycleState.STOPPING, LifecycleState.STOPPED}),
    LifecycleState.STOPPING: frozenset({LifecycleState.STOPPED}),
    LifecycleState.STOPPED: frozenset({LifecycleState.STARTING}),
}

#: An owner's body: runs one life of the owner; calls ``ready()`` once it serves, then
#: returns when :meth:`OwnedTask.stop_requested` says so (or on its own).
Body = Callable[[Callable[[], None]], Awaitable[None]]


def unwrap(exc: BaseException) -> BaseException:
    """The single exception inside (nested) one-exception groups, else ``exc``."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


class OwnedTask:
    """The lifecycle of one owner's task (see the module docs).

    Args:
        owner: what the task is, in messages (``"timer server"``, ``"supervisor"``).
        restartable: whether a stopped owner may start again.
    """

    def __init__(self, owner: str, *, restartable: bool = True) -> None:
        self.owner = owner
        self._restartable = restartable
        self._state = LifecycleState.CREATED
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None

    @property
    def state(self) -> LifecycleState:
        """The current state."""
        return self._state

    @property
    def stop_requested(self) -> bool:
        """Whether the current (or last) life was asked to stop."""
        return self._stop is not None and self._stop.is_set()

    def _move(self, to: LifecycleState) -> None:
        if to is LifecycleState.STARTING and not self._may_start():
            raise ServerStateError(f"cannot start a {self._state.value} {self.owner}")
        if to not in TRANSITIONS[self._state]:
            raise ServerStateError(
                f"the {self.owner} cannot go from {self._state.value} to {to.value}"
            )
        self._state = to

    def _may_start(self) -> bool:
        """Whether the table and ``restartable`` allow a start now."""
        if LifecycleState.STARTING not in TRANSITIONS[self._state]:
            return False
        return self._state is LifecycleState.CREATED or self._restartable

    async def start(self, body: Body, *, name: str) -> None:
        """Run ``body`` in a new task named ``name``; return once it called ``ready()``.

        Raises:
            ServerStateError: the owner is not ``created`` (nor ``stopped``, if it is
                restartable).
            Exception: what ``body`` raised before it was ready (unwrapped from
                one-exception groups); the task has ended and the state is ``stopped``.
        """
        loop = asyncio.get_running_loop()
        self._move(LifecycleState.STARTING)
        self._loop, self._stop = loop, asyncio.Event()
        ready: asyncio.Future[None] = loop.create_future()
        task = self._task = loop.create_task(self._run(body, ready), name=name)
        try:
            await asyncio.shield(ready)
        except BaseException as exc:
            if ready.done() and not ready.cancelled() and ready.exception() is exc:
                await task  # it failed to start and has already cleaned up
                raise unwrap(exc) from None
            self.request_stop()  # start() itself was cancelled
            await asyncio.shield(task)
            raise

    def request_stop(self) -> None:
        """Ask the body to stop (``starting``/``running`` become ``stopping``); returns at
        once. Call it in the owner's loop; a no-op once stopped or before a start."""
        if self._state in (LifecycleState.STARTING, LifecycleState.RUNNING):
            self._move(LifecycleState.STOPPING)
        if self._stop is not None:
            self._stop.set()

    async def wait_stop_requested(self) -> None:
        """Return once a stop is requested (the body awaits this while it serves)."""
        assert self._stop is not None, "only a started task's body waits for its stop"
        await self._stop.wait()

    async def aclose(self) -> None:
        """Request a stop and wait until the task has ended. Idempotent.

        Raises:
            ServerStateError: awaited in another event loop than the task's.
        """
        task = self._task
        if task is None or self._state in (LifecycleState.CREATED, LifecycleState.STOPPED):
            return
        if asyncio.get_running_loop() is not self._loop:
            raise ServerStateError(f"aclose() must be awaited in the {self.owner}'s own event loop")
        self.request_stop()
        await asyncio.shield(task)

    async def _run(self, body: Body, ready: asyncio.Future[None]) -> None:
        def became_ready() -> None:
            if ready.done():
                raise ServerStateError(f"the {self.owner} reported ready twice")
            if self._state is LifecycleState.STARTING:
                self._move(LifecycleState.RUNNING)
            ready.set_result(None)

        try:
            await body(became_ready)
            if not ready.done():
                ready.set_exception(ServerStateError(f"the {self.owner} ended while starting"))
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
                if isinstance(exc, Exception):
                    return
            elif isinstance(exc, Exception):
                logger.exception("the %s crashed", self.owner)
                return
            raise
        finally:
            self._state = LifecycleState.STOPPED

    def __repr__(self) -> str:
        return f"<OwnedTask {self.owner} {self._state.value}>"


class TaskOwner:
    """What every owner of an :class:`OwnedTask` offers, written once: its ``state``,
    ``aclose()`` and ``async with`` (which starts it). A subclass sets ``_life`` and
    writes ``start()``."""

    _life: OwnedTask

    @property
    def state(self) -> LifecycleState:
        """The current lifecycle state."""
        return self._life.state

    async def start(self) -> None:
        """Start; return once ready (see the subclass)."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Stop, and return once everything is released. Idempotent.

        Raises:
            ServerStateError: awaited in another event loop than the one it runs in.
        """
        await self._life.aclose()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
