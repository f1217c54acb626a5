"""The server's hold on each worker: a state machine, from its first timer to its exit.

Rules
-----
A worker is a process the server holds timers for. The server keeps one
:class:`WatchedWorker` per worker, in one of four states (:class:`WatchState`):

``UNPINNED``
    Attaching it ran out of file descriptors: the server's failure, not the worker's.
    Its timers are kept, and it is pinned again when one of them expires; while
    unpinned it is never signalled (a bare pid may name another process by then), its
    expiries are only reported.
``PINNED``
    The reaper holds its identity (a pidfd where the OS has one), and a watcher task
    waits for its exit.
``REAPING``
    A reap of it is in progress. There is one at a time: its timers falling due
    meanwhile are covered by it.
``GONE``
    It exited, or a signal or a new pinning found it gone. Final: the record leaves the
    :class:`Watchlist`, the reaper detaches it, the engine clears its timers; a later
    request naming the same pid starts a new record.

Transitions (any other is a bug, raised as :class:`TransitionError`)::

    UNPINNED --pin--------> PINNED
    PINNED   --begin_reap--> REAPING
    REAPING  --end_reap---> PINNED
    any      --go---------> GONE      (several paths see an exit: GONE -> GONE is no change)
    GONE     --end_reap---> GONE      (a reap may end after its worker has gone)

A worker the reaper cannot attach at all (gone already, or not the process that sent the
request) gets no record: the engine reports its request as
:class:`~aiotimer.events.WorkerUnknown`.

:class:`Watchlist` is the shell around the records of one server run: it calls the
reaper (attach, detach), runs the watcher tasks, and tells the engine when a worker has
gone, once. Everything here runs in the event loop's thread.
"""

from __future__ import annotations

import enum
import errno
import logging
from collections.abc import Callable, Mapping
from typing import Final

import anyio
import anyio.abc

from aiotimer.reapers._signal import Reaper

__all__ = ["TransitionError", "WatchState", "WatchedWorker", "Watchlist"]

logger = logging.getLogger("aiotimer")


class WatchState(enum.Enum):
    """Where the server stands with a worker (see the module docs)."""

    UNPINNED = "unpinned"
    PINNED = "pinned"
    REAPING = "reaping"
    GONE = "gone"


class _Change(enum.Enum):
    PIN = "pin"
    BEGIN_REAP = "begin a reap"
    END_REAP = "end a reap"
    GO = "go"


_UNPINNED, _PINNED, _REAPING, _GONE = WatchState

#: The transitions the module docs list: (state, change) -> the next state.
_NEXT: Final[Mapping[tuple[WatchState, _Change], WatchState]] = {
    (_UNPINNED, _Change.PIN): _PINNED,
    (_PINNED, _Change.BEGIN_REAP): _REAPING,
    (_REAPING, _Change.END_REAP): _PINNED,
    (_UNPINNED, _Change.GO): _GONE,
    (_PINNED, _Change.GO): _GONE,
    (_REAPING, _Change.GO): _GONE,
    (_GONE, _Change.GO): _GONE,
    (_GONE, _Change.END_REAP): _GONE,
}


class TransitionError(RuntimeError):
    """A change that the state of a :class:`WatchedWorker` does not allow (a bug)."""


class WatchedWorker:
    """The server's record of one worker (see the module docs).

    Args:
        pid: the worker's pid.
        state: where it starts: ``PINNED``, or ``UNPINNED`` when attaching ran out of
            file descriptors.
        start_time: what its request said of its start time, to pin it again with.

    Raises:
        TransitionError: ``state`` is not a starting state.
    """

    __slots__ = ("_exited", "_state", "pid", "start_time", "watcher")

    def __init__(self, pid: int, state: WatchState, *, start_time: int | None = None) -> None:
        if state not in (_PINNED, _UNPINNED):
            raise TransitionError(f"a worker starts pinned or unpinned, not {state.value}")
        self.pid = pid
        self.start_time = start_time
        self._state = state
        #: The watcher task's cancel scope, once it runs (cancelled when the worker goes).
        self.watcher: anyio.CancelScope | None = None
        # Set when the worker has gone; made by the first waiter (anyio makes events
        # only in tasks, and a record may be made outside one).
        self._exited: anyio.Event | None = None

    @property
    def state(self) -> WatchState:
        """The current state."""
        return self._state

    @property
    def gone(self) -> bool:
        """Whether the worker has gone (final)."""
        return self._state is _GONE

    def pin(self) -> None:
        """An unpinned worker is pinned now."""
        self._move(_Change.PIN)

    def begin_reap(self) -> None:
        """A reap of this pinned worker begins."""
        self._move(_Change.BEGIN_REAP)

    def end_reap(self) -> None:
        """The reap in progress ended (no change once the worker has gone)."""
        self._move(_Change.END_REAP)

    def go(self) -> bool:
        """The worker has gone: wake whoever waits for it, stop its watcher. ``False``
        if it had gone already (nothing to do)."""
        if self._state is _GONE:
            return False
        self._move(_Change.GO)
        if self._exited is not None:
            self._exited.set()
        if self.watcher is not None:
            self.watcher.cancel()
        return True

    async def wait_gone(self) -> None:
        """Return once the worker has gone."""
        if self._state is _GONE:
            return
        if self._exited is None:
            self._exited = anyio.Event()
        await self._exited.wait()

    def _move(self, change: _Change) -> None:
        new = _NEXT.get((self._state, change))
        if new is None:
            raise TransitionError(
                f"worker {self.pid} is {self._state.value}: it cannot {change.value}"
            )
        self._state = new

    def __repr__(self) -> str:
        return f"<WatchedWorker {self.pid} {self._state.value}>"


class Watchlist:
    """The workers one server run watches (see the module docs).

    Args:
        task_group: where the watcher tasks run.
        reaper: pins workers, waits for their exits, forgets them.
        on_gone: told ``(pid, reason)`` once per worker that has gone, after the reaper
            has forgotten it.
    """

    def __init__(
        self,
        *,
        task_group: anyio.abc.TaskGroup,
        reaper: Reaper,
        on_gone: Callable[[int, str], None],
    ) -> None:
        self._tg = task_group
        self._reaper = reaper
        self._on_gone = on_gone
        self._workers: dict[int, WatchedWorker] = {}

    @property
    def by_pid(self) -> Mapping[int, WatchedWorker]:
        """The watched workers' records by pid (a live, read-only view)."""
        return self._workers

    def get(self, pid: int) -> WatchedWorker | None:
        """The record of worker ``pid``, if it is watched."""
        return self._workers.get(pid)

    def pids(self) -> tuple[int, ...]:
        """The pids of the watched workers."""
        return tuple(self._workers)

    def is_reaping(self, pid: int) -> bool:
        """Whether a reap of worker ``pid`` is in progress."""
        worker = self._workers.get(pid)
        return worker is not None and worker.state is _REAPING

    def attach(self, pid: int, start_time: int | None) -> bool:
        """Start watching worker ``pid``: ``True`` if it is watched now (pinned, or
        unpinned for lack of file descriptors), ``False`` if the reaper cannot attach it
        (the worker is unknown)."""
        try:
            attached = self._pin(pid, start_time)
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                logger.exception("reaper.attach(%d) raised; treating the worker as unknown", pid)
                return False
            _out_of_descriptors(pid, exc)
            self._workers[pid] = WatchedWorker(pid, _UNPINNED, start_time=start_time)
            return True
        except Exception:
            logger.exception("reaper.attach(%d) raised; treating the worker as unknown", pid)
            return False
        if attached:
            worker = self._workers[pid] = WatchedWorker(pid, _PINNED)
            self._tg.start_soon(self._watch, worker, name=f"aiotimer-watch-{pid}")
        return attached

    def pin_again(self, worker: WatchedWorker) -> bool:
        """Pin an unpinned worker (its timer expired); ``True`` if it now is. A worker
        the reaper finds gone goes."""
        try:
            attached = self._pin(worker.pid, worker.start_time)
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                _out_of_descriptors(worker.pid, exc)
            else:
                logger.exception("reaper.attach(%d) raised", worker.pid)
            return False
        except Exception:
            logger.exception("reaper.attach(%d) raised", worker.pid)
            return False
        if not attached:  # it has gone meanwhile
            self.gone(worker, "gone before signal")
            return False
        worker.pin()
        self._tg.start_soon(self._watch, worker, name=f"aiotimer-watch-{worker.pid}")
        return True

    def gone(self, worker: WatchedWorker, reason: str) -> None:
        """``worker`` has gone (``reason`` says how): forget it, once."""
        if not worker.go():
            return
        if self._workers.get(worker.pid) is worker:
            del self._workers[worker.pid]
        self._detach(worker.pid)
        self._on_gone(worker.pid, reason)

    def close(self) -> None:
        """Detach every remaining worker (the run is over; its tasks are cancelled)."""
        for pid in list(self._workers):
            del self._workers[pid]
            self._detach(pid)

    def _pin(self, pid: int, start_time: int | None) -> bool:
        # start_time only when the request has one: older reapers lack the keyword.
        if start_time is None:
            return self._reaper.attach(pid)
        return self._reaper.attach(pid, start_time=start_time)

    def _detach(self, pid: int) -> None:
        try:
            self._reaper.detach(pid)
        except Exception:
            logger.exception("reaper.detach(%d) raised", pid)

    async def _watch(self, worker: WatchedWorker) -> None:
        if worker.gone:
            return
        with anyio.CancelScope() as worker.watcher:
            try:
                await self._reaper.wait_exit(worker.pid)
            except Exception:
                logger.exception("reaper.wait_exit(%d) raised; worker exit unwatched", worker.pid)
                return
            self.gone(worker, "exited")


def _out_of_descriptors(pid: int, exc: OSError) -> None:
    logger.critical(
        "out of file descriptors (%s) pinning worker %d: its identity cannot be "
        "proven, so it cannot be signalled until a descriptor is free. Raise the "
        "open-file limit (ulimit -n; the server raises the soft limit to the "
        "hard one) or run fewer workers per server",
        exc.strerror,
        pid,
    )
