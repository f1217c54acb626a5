"""torch's servers (``FileTimerServer``, ``LocalTimerServer``) on aiotimer's engine, run in
a daemon thread."""

from __future__ import annotations

import array
import contextlib
import fcntl
import logging
import os
import termios
import time
from collections.abc import Callable, Iterable
from typing import Any, Final, Self

from aiotimer._edges.clock import Clock, MonotonicClock
from aiotimer.compat.torch._requests import FileTimerRequest, TimerRequest, _to_request
from aiotimer.core._table import Timer
from aiotimer.errors import ServerStateError
from aiotimer.events import (
    Event,
    ServerStarted,
    ServerStopped,
    TimerExpired,
    WorkerExited,
    WorkerReaped,
)
from aiotimer.reapers._signal import Reaper
from aiotimer.server._server import TimerServer as _AioTimerServer
from aiotimer.server._thread import TimerServerThread

logger = logging.getLogger("aiotimer.compat.torch")

#: How long ``register_timers``/``clear_timers`` wait for the server's loop to apply them.
_SYNC_TIMEOUT: Final[float] = 10.0
#: How long ``start()`` waits for the server to accept requests.
_START_TIMEOUT: Final[float] = 30.0


# -- servers on aiotimer's engine -------------------------------------------------------


def log_debug_info_for_expired_timers(run_id: str, expired_timers: dict[int, list[str]]) -> None:
    """Log the expired timers of run ``run_id`` (pid → JSON lines), as torch does."""
    if expired_timers:
        logger.info("Timers expired for run:[%s] [%s].", run_id, expired_timers)


class _EngineServer:
    """What the compat servers share: an aiotimer server run in a daemon thread."""

    def __init__(
        self,
        *,
        max_interval: float,
        daemon: bool,
        clock: Clock | None,
        on_event: Callable[[Event], None] | None,
    ) -> None:
        self._max_interval = max_interval
        self._daemon = daemon
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._on_event = on_event
        self._last_beat: float | None = None

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

    def start(self) -> None:
        """Start serving in a daemon thread; return once requests are accepted.

        Raises:
            ServerStateError: the server is already running.
            SourceError: the FIFO path is taken (not a FIFO, or another server's).
        """
        if self._thread.running:
            raise ServerStateError(f"{type(self).__name__} is already running")
        self._thread.stop()  # reap a thread that ended on its own, if any
        self._thread.start(_START_TIMEOUT)
        self._last_beat = self._clock.time()

    def stop(self) -> None:
        """Stop serving; return once the thread has ended. Idempotent; can be restarted."""
        self._thread.stop()
        self._last_beat = None

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

    def register_timers(self, timer_requests: Iterable[TimerRequest]) -> None:
        """Apply acquires and releases as if clients had sent them; return once applied.

        ``TimerRequest`` objects carry no signal: SIGKILL. Invalid requests are reported
        as rejection events. Thread-safe.

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
        clock = self._clock
        offset = clock.time() - clock.monotonic()
        due: dict[int, list[TimerRequest]] = {}
        for timer in self._server.get_state().timers:
            expiration_time = timer.deadline + offset
            if expiration_time <= deadline:
                due.setdefault(timer.pid, []).append(self._report(timer, expiration_time))
        return due

    def _report(self, timer: Timer, expiration_time: float) -> TimerRequest:
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


def _unread_bytes(fd: int) -> int:
    """How many bytes wait in the pipe behind ``fd`` (``FIONREAD``)."""
    count = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, count)
    return count[0]


class FileTimerServer(_EngineServer):
    """A FIFO timer server with torch's signature, on aiotimer's engine.

    Serves torch's ``FileTimerClient`` and aiotimer's clients alike. ``log_event(name,
    request)`` receives torch's event names — ``"watchdog started"``, ``"timer
    expired"``, ``"kill worker process"`` (with :class:`FileTimerRequest` objects) and
    ``"watchdog stopped"`` — in the server's thread.

    Args:
        file_path: the FIFO to create (a stale FIFO there is replaced; anything else,
            or a FIFO another server reads, is refused).
        run_id: the job's id, for :func:`log_debug_info_for_expired_timers`.
        max_interval: accepted for compatibility; expiry is deadline-driven, so it does
            not bound latency.
        daemon: accepted for compatibility; the server thread is always a daemon.
        log_event: torch's event callback.
        self_kill: after reaping a worker, send the same signal to this process, as
            torch 2.13 does. Off by default.
        fifo_mode: the FIFO's permission bits (torch: 0666 minus umask).
        reaper: how workers are acted on (default: pidfd-pinned signals); inject
            :class:`aiotimer.testing.RecordingReaper` in tests.
        clock: the server's clock.
        on_event: also receive every aiotimer :class:`~aiotimer.events.Event`.
    """

    def __init__(
        self,
        file_path: str,
        run_id: str,
        max_interval: float = 10,
        daemon: bool = True,
        log_event: Callable[[str, FileTimerRequest | None], None] | None = None,
        *,
        self_kill: bool = False,
        fifo_mode: int = 0o600,
        reaper: Reaper | None = None,
        clock: Clock | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        super().__init__(max_interval=max_interval, daemon=daemon, clock=clock, on_event=on_event)
        self._file_path = file_path
        self._run_id = run_id
        self._log_event = log_event
        self._reaping: dict[int, FileTimerRequest] = {}
        self._build(
            _AioTimerServer(
                fifo=file_path,
                fifo_mode=fifo_mode,
                reaper=reaper,
                clock=self._clock,
                on_event=self._dispatch,
                self_kill_after_reap=self_kill,
            )
        )

    @property
    def file_path(self) -> str:
        """The FIFO's path."""
        return self._file_path

    def run_once(self, timeout: float = _SYNC_TIMEOUT) -> None:
        """Apply every request already written to the FIFO, then stop (torch's test hook).

        Raises:
            TimeoutError: the FIFO still held unread bytes after ``timeout`` seconds.
        """
        if self.running:
            self._drain(timeout)
            self._sync()
        self.stop()

    def _drain(self, timeout: float) -> None:
        """Wait until the server has read everything in the FIFO."""
        fd = os.open(self._file_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            end = time.monotonic() + timeout
            while _unread_bytes(fd) > 0:
                if time.monotonic() > end:
                    raise TimeoutError(f"the FIFO still held unread requests after {timeout}s")
                time.sleep(0.001)
        finally:
            os.close(fd)

    def _report(self, timer: Timer, expiration_time: float) -> TimerRequest:
        return FileTimerRequest(timer.pid, timer.scope_id, expiration_time, timer.signal)

    def _translate(self, event: Event) -> None:
        log = self._log_event
        if isinstance(event, TimerExpired):
            request = FileTimerRequest(
                event.pid, event.scope_id, event.time - event.late, event.signal
            )
            log_debug_info_for_expired_timers(self._run_id, {event.pid: [request.to_json()]})
            if not event.report_only:
                self._reaping[event.pid] = request
            if log is not None:
                log("timer expired", request)
        elif isinstance(event, WorkerReaped):
            expired = self._reaping.get(event.pid)
            scope = expired.scope_id if expired else (event.scopes[0] if event.scopes else "")
            when = expired.expiration_time if expired else event.time
            if log is not None:
                log("kill worker process", FileTimerRequest(event.pid, scope, when, event.signal))
        elif isinstance(event, WorkerExited):
            self._reaping.pop(event.pid, None)
        elif isinstance(event, ServerStarted):
            if log is not None:
                log("watchdog started", None)
        elif isinstance(event, ServerStopped):
            self._reaping.clear()
            if log is not None:
                log("watchdog stopped", None)


class LocalTimerServer(_EngineServer):
    """A ``multiprocessing.Queue`` timer server with torch's signature, on aiotimer's engine.

    Serves torch's ``LocalTimerClient`` (``TimerRequest`` objects, reaped with SIGKILL)
    and :class:`LocalTimerClient`. ``max_interval`` and ``daemon`` are accepted for
    compatibility only (see :class:`FileTimerServer`); ``reaper``, ``clock`` and
    ``on_event`` as there.
    """

    def __init__(
        self,
        mp_queue: Any,
        max_interval: float = 60,
        daemon: bool = True,
        *,
        reaper: Reaper | None = None,
        clock: Clock | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        super().__init__(max_interval=max_interval, daemon=daemon, clock=clock, on_event=on_event)
        server = _AioTimerServer(
            queue=mp_queue, reaper=reaper, clock=self._clock, on_event=self._dispatch
        )
        self._build(server)
