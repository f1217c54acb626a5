"""``torch.distributed.elastic.timer.file_based_local_timer`` on aiotimer: the named-pipe
client and server (see :mod:`aiotimer.compat.torch`).

Besides torch's ``__all__`` it exports the names torch's module imports, so
``from ...file_based_local_timer import TimerRequest`` switches too, and
:class:`FileTimerServer` calls :func:`log_debug_info_for_expired_timers` through this
module, so a test that patches it here sees every call, as with torch.
"""

from __future__ import annotations

import signal as _signal
from collections.abc import Callable

from aiotimer._edges.clock import Clock
from aiotimer.compat.torch._api import RequestQueue, TimerClient
from aiotimer.compat.torch._clients import FileTimerClient
from aiotimer.compat.torch._engine_server import EngineServer
from aiotimer.compat.torch._requests import FileTimerRequest, TimerRequest
from aiotimer.compat.torch.debug_info_logging import log_debug_info_for_expired_timers
from aiotimer.events import (
    Event,
    ServerStarted,
    ServerStopped,
    TimerExpired,
    WorkerExited,
    WorkerReaped,
)
from aiotimer.reapers import Reaper
from aiotimer.server import TimerInfo
from aiotimer.server import TimerServer as _AioTimerServer

__all__ = [
    "FileTimerClient",
    "FileTimerRequest",
    "FileTimerServer",
    "TimerClient",
    "TimerRequest",
    "log_debug_info_for_expired_timers",
]


class _ThroughTheFifo(RequestQueue):
    """The request queue of a :class:`FileTimerServer`: its requests come through the
    FIFO, which the engine reads itself, so none ever waits here."""

    def size(self) -> int:
        """Always 0."""
        return 0

    def get(self, size: int, timeout: float) -> list[TimerRequest]:
        """Always empty (at once)."""
        return []


class FileTimerServer(EngineServer):
    """A FIFO timer server with torch's signature, on aiotimer's engine.

    Serves torch's ``FileTimerClient`` and aiotimer's clients alike. ``log_event(name,
    request)`` receives torch's event names — ``"watchdog started"``, ``"timer
    expired"``, ``"kill worker process"`` (with :class:`FileTimerRequest` objects) and
    ``"watchdog stopped"`` — in the server's thread.

    A subclass of :class:`~aiotimer.compat.torch.TimerServer` (torch's is not). Every
    reap calls :meth:`_reap_worker` and every worker exit is checked with
    :meth:`is_process_running`, so overriding or patching them works as in torch (see
    :mod:`aiotimer.compat.torch._engine_server`).

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
        reaper: how workers are pinned and signalled (default: pidfd-pinned signals);
            inject :class:`aiotimer.testing.RecordingReaper` in tests.
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
        super().__init__(
            _ThroughTheFifo(), max_interval, daemon, reaper=reaper, clock=clock, on_event=on_event
        )
        self._file_path = file_path
        self._run_id = run_id
        self._log_event = log_event
        self._reaping: dict[int, FileTimerRequest] = {}
        self._build(
            _AioTimerServer(
                fifo=file_path,
                fifo_mode=fifo_mode,
                reaper=self._hooks,
                clock=self._clock,
                on_event=self._dispatch,
                self_kill_after_reap=self_kill,
            )
        )

    @property
    def file_path(self) -> str:
        """The FIFO's path."""
        return self._file_path

    @property
    def _request_count(self) -> int:
        """Valid requests taken in by the current (or last) run: torch's test counter."""
        return self._server.snapshot(0, sites=0).counters.requests

    def run_once(self) -> None:
        """Apply every request already written to the FIFO (and reap what is due), then
        stop: torch's test hook."""
        if self.running:
            self._server.flush()
        self.stop()

    def _reap_worker(self, worker_pid: int, signal: int = _signal.SIGKILL) -> bool:
        """Send ``signal`` to the worker (pinned when it registered: never a recycled
        pid); ``True`` once sent. Called in the server's thread for every reap;
        override it to reap another way (it must not block).

        Raises:
            ProcessGoneError: the worker has exited (its timers are then cleared).
            RefusedTargetError: it must never be signalled (pid <= 1, this process).
            ReapError: the signal failed this time (retried).
        """
        return self._signal_worker(worker_pid, signal)

    def _reap_with(self, pid: int, signum: int) -> bool:
        return self._reap_worker(pid, signum)

    def _report(self, timer: TimerInfo, expiration_time: float) -> TimerRequest:
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
