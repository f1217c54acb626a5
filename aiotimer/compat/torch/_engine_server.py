"""What torch's servers share here: a :class:`~aiotimer.compat.torch.TimerServer` run by
aiotimer's deadline-driven engine, in a daemon thread.

How this works
--------------
:class:`EngineServer` is a subclass of torch's ABC whose table is the engine's: the
engine reads the transport (FIFO or queue), sleeps until the next deadline and reaps at
it, without a polling round. torch's hooks are the points where the engine meets the
worker, so a subclass (or a test's ``mock.patch``) that overrides them is obeyed:

* ``_reap_worker`` is called for every reap: the engine's reaper is a
  :class:`TorchHooks` that hands each signal to it (a ``False`` result is a failed
  attempt, retried with back-off; an exception is reported and retried too);
* ``is_process_running`` is asked when the engine sees a worker exit (its pidfd): while
  it says the process runs, the worker's timers stay and expire as usual;
* ``_run_watchdog()`` is one synchronous round: what the transport holds now is taken
  and applied, and every timer due is reaped
  (:meth:`aiotimer.server.TimerServer.flush`).

``register_timers``, ``clear_timers`` and ``get_expired_timers`` are operations on the
engine's table (thread-safe). The engine takes in what it reads itself, so overriding
them changes those calls only: a subclass that overrides one is told so in the log. A
server with a table of its own subclasses :class:`~aiotimer.compat.torch.TimerServer`
directly, whose watchdog runs torch's round over its four methods.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import Final, Self

import anyio

from aiotimer._edges.clock import Clock, MonotonicClock
from aiotimer._edges.procfs import EXITED_STATES, read_stat
from aiotimer.compat.torch._api import RequestQueue, TimerServer
from aiotimer.compat.torch._requests import TimerRequest, _to_request
from aiotimer.errors import ReapError
from aiotimer.events import Event
from aiotimer.reapers import NoDump, Reaper, SignalReaper
from aiotimer.server import TimerInfo, TimerServerThread
from aiotimer.server import TimerServer as _AioTimerServer

__all__ = ["EngineServer", "TorchHooks"]

logger = logging.getLogger("aiotimer.compat.torch")

#: How long ``start()`` waits for the server to accept requests.
_START_TIMEOUT: Final[float] = 30.0
#: The longest ``_run_watchdog()`` waits for requests still in transit on a queue.
ROUND_WAIT: Final[float] = 5.0
#: The table operations the engine does not call (see the module docs).
_TABLE_METHODS: Final = ("register_timers", "clear_timers", "get_expired_timers")


class TorchHooks:
    """The reaper an :class:`EngineServer` runs its engine with: ``reaper`` underneath,
    with each reap handed to the server's ``_reap_worker`` and each exit checked with its
    ``is_process_running`` (a :class:`~aiotimer.reapers.Reaper`)."""

    __slots__ = ("_owner", "inner")

    def __init__(self, owner: EngineServer, inner: Reaper) -> None:
        self._owner = owner
        #: The reaper that pins, watches and signals the workers.
        self.inner = inner

    def attach(self, pid: int, *, start_time: int | None = None) -> bool:
        """Pin worker ``pid`` through the inner reaper."""
        if start_time is None:  # older reapers lack the keyword
            return self.inner.attach(pid)
        return self.inner.attach(pid, start_time=start_time)

    async def wait_exit(self, pid: int) -> None:
        """Return when worker ``pid`` has exited and ``is_process_running`` agrees."""
        await self.inner.wait_exit(pid)
        try:
            running = bool(self._owner.is_process_running(pid))
        except Exception:
            logger.exception("is_process_running(%d) raised; the worker is taken as gone", pid)
            return
        if running:
            logger.warning(
                "worker %d has exited, but is_process_running(%d) says it runs: its "
                "timers are kept and expire as usual",
                pid,
                pid,
            )
            await anyio.sleep_forever()

    def signal(self, pid: int, signum: int, *, group: bool = False) -> None:
        """Reap ``pid`` through the server's ``_reap_worker``; a process-group signal
        (an aiotimer request's ``group`` key) goes to the inner reaper.

        Raises:
            ReapError: ``_reap_worker`` returned a false value (retried).
        """
        if group:
            self.inner.signal(pid, signum, group=True)
        elif not self._owner._reap_with(pid, signum):
            raise ReapError(f"_reap_worker({pid}) returned False; retrying")

    async def dump_stacks(self, pid: int, timeout: float) -> str | NoDump | None:
        """The worker's stack dump, through the inner reaper."""
        return await self.inner.dump_stacks(pid, timeout)

    def detach(self, pid: int) -> None:
        """Forget worker ``pid`` (the inner reaper releases its pin)."""
        self.inner.detach(pid)


class EngineServer(TimerServer):
    """torch's ``TimerServer`` on aiotimer's engine, in a daemon thread (see the module
    docs). Subclasses build the aiotimer server (:meth:`_build`) and say how a reap
    calls their ``_reap_worker`` (:meth:`_reap_with`)."""

    def __init__(
        self,
        request_queue: RequestQueue,
        max_interval: float,
        daemon: bool,
        *,
        reaper: Reaper | None,
        clock: Clock | None,
        on_event: Callable[[Event], None] | None,
    ) -> None:
        super().__init__(request_queue, max_interval, daemon)
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._on_event = on_event
        self._last_beat: float | None = None
        self._hooks = TorchHooks(self, reaper if reaper is not None else SignalReaper())
        for name in _TABLE_METHODS:
            if getattr(type(self), name) is not getattr(EngineServer, name):
                logger.warning(
                    "%s overrides %s(): aiotimer's engine takes in and expires requests "
                    "itself, so only explicit calls use it (see "
                    "docs/migrating-from-torch.md; subclass TimerServer for a table of "
                    "your own)",
                    type(self).__name__,
                    name,
                )

    def _build(self, server: _AioTimerServer) -> None:
        self._server = server
        self._thread = TimerServerThread(server)

    @property
    def server(self) -> _AioTimerServer:
        """The aiotimer server underneath (``get_state()``, counters, ...)."""
        return self._server

    @property
    def running(self) -> bool:
        """True while the server's thread runs."""
        return self._thread.running

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start serving in a daemon thread; return once requests are accepted.

        A second call while running is logged and ignored (torch starts a second
        watchdog thread).

        Raises:
            SourceError: the FIFO path is taken (not a FIFO, or another server's).
        """
        if self._thread.running:
            logger.warning("%s.start(): already running; ignored", type(self).__name__)
            return
        self._thread.stop()  # reap a thread that ended on its own, if any
        self._thread.start(_START_TIMEOUT)
        self._last_beat = self._clock.time()

    def stop(self) -> None:
        """Stop serving; return once the thread has ended. Idempotent; can be restarted."""
        self._thread.stop()
        self._last_beat = None

    def _run_watchdog(self) -> None:
        """One synchronous round: take what the transport holds now (waiting up to
        :data:`ROUND_WAIT` seconds for requests still in transit on the queue), apply
        it, and reap every timer due. A server not running is started first: the
        engine needs its loop, and keeps reaping at the deadlines after the round.
        """
        if not self._thread.running:
            logger.info("%s._run_watchdog(): starting the server first", type(self).__name__)
            self.start()
        end = time.monotonic() + ROUND_WAIT
        pause = 0.0005
        with contextlib.suppress(NotImplementedError):  # no qsize() on this platform
            while self._request_queue.size() > 0 and time.monotonic() < end:
                time.sleep(pause)
                pause = min(2 * pause, 0.01)
        self._server.flush()

    def get_last_progress_time(self) -> int:
        """Epoch seconds when the server's loop last proved responsive.

        Each call asks the loop for a heartbeat and returns the time of the previous one,
        so a stuck loop shows an ageing value (torchrun's health check reads this). The
        current time before the first heartbeat or when not running, as torch does.
        """
        loop, last = self._thread.loop, self._last_beat
        if loop is None or last is None:
            return int(self._clock.time())
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(self._beat)
        return int(last)

    def _beat(self) -> None:
        self._last_beat = self._clock.time()

    # -- torch's hooks ----------------------------------------------------------------------

    @staticmethod
    def is_process_running(pid: int) -> bool:
        """Whether process ``pid`` runs: it exists, this process may signal it, and it
        has not exited (a zombie has; torch counts one as running). ``False`` for
        ``pid <= 0``, which names process groups, not a process."""
        if pid <= 0:
            return False
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        try:
            stat = read_stat(pid)
        except OSError:  # no /proc: the signal test is all there is
            return True
        return stat is not None and stat[0] not in EXITED_STATES

    def _signal_worker(self, pid: int, signum: int) -> bool:
        """What the default ``_reap_worker`` does: send ``signum`` to the pinned worker.

        Raises:
            ProcessGoneError: the worker has exited (its timers are then cleared).
            RefusedTargetError: it must never be signalled (pid <= 1, this process, or
                never pinned).
            ReapError: the signal failed this time (retried).
        """
        self._hooks.inner.signal(pid, signum)
        return True

    @abc.abstractmethod
    def _reap_with(self, pid: int, signum: int) -> bool:
        """Call this server's ``_reap_worker`` for a reap of ``pid`` with ``signum``."""

    # -- the table (the engine's) -----------------------------------------------------------

    def register_timers(self, timer_requests: Iterable[TimerRequest]) -> None:
        """Apply acquires and releases as if clients had sent them; return once applied.

        ``TimerRequest`` objects carry no signal: SIGKILL. Invalid requests (a
        ``worker_id`` of 0 or less, say) are reported as rejection events. Thread-safe.

        Raises:
            ServerStateError: the server is not running.
            TypeError: a ``worker_id`` is not a pid.
        """
        for request in timer_requests:
            self._server.submit(_to_request(request))
        self._sync()

    def clear_timers(self, worker_ids: Iterable[int]) -> None:
        """Drop every timer of ``worker_ids`` (no signal is sent); return once applied.

        Raises:
            ServerStateError: the server is not running.
        """
        ids = set(worker_ids)
        for timer in self._server.get_state().timers:
            if timer.pid in ids:
                self._server.release(timer.scope_id, pid=timer.pid)
        self._sync()

    def get_expired_timers(self, deadline: float) -> dict[int, list[TimerRequest]]:
        """The live timers due at ``deadline`` (epoch seconds) or earlier, by pid.

        The server reaps expired timers as soon as they are due, so with
        ``deadline=time.time()`` this is normally empty; a later ``deadline`` shows what
        will expire by then (``math.inf``: every live timer).
        """
        due: dict[int, list[TimerRequest]] = {}
        for key, request in self._timers.items():
            if request.expiration_time <= deadline:
                due.setdefault(key[0], []).append(request)
        return due

    @property
    def _timers(self) -> dict[tuple[int, str], TimerRequest]:
        """torch's table as a fresh copy: ``(pid, scope_id) -> request`` for every live
        timer (a full snapshot of the engine: O(n log n) per read)."""
        return {
            (t.pid, t.scope_id): self._report(t, t.deadline)  # epoch seconds
            for t in self._server.get_state().timers
        }

    def _report(self, timer: TimerInfo, expiration_time: float) -> TimerRequest:
        return TimerRequest(timer.pid, timer.scope_id, expiration_time)

    def _sync(self) -> None:
        """Wait until the loop has applied everything submitted so far: a snapshot from
        another thread is taken after it (an empty one: nothing is listed)."""
        self._server.snapshot(0, sites=0)

    def _dispatch(self, event: Event) -> None:
        """The aiotimer server's ``on_event`` (runs in the server's loop thread)."""
        self._translate(event)
        if self._on_event is not None:
            self._on_event(event)

    def _translate(self, event: Event) -> None:
        """Hook for torch-style reporting of ``event``."""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._server!r}>"
