"""``torch.distributed.elastic.timer``'s API on aiotimer's engine: switch with one import.

Replace::

    import torch.distributed.elastic.timer as timer

with::

    import aiotimer.compat.torch as timer

and keep the rest: ``timer.configure(timer.FileTimerClient(path))``, ``with
timer.expires(after=60): ...``, ``timer.FileTimerServer(path, run_id).start()``,
``timer.LocalTimerServer(mp_queue).start()``. Importing this module does not import
torch; the requests and lines it produces are the ones torch's servers and clients
expect, in both directions.

What is different (aiotimer's semantics; see docs/migrating-from-torch.md):

* **Prompt expiry.** The servers sleep until the next deadline instead of polling:
  ``max_interval`` is accepted (and kept) but does not bound latency any more.
* **No self-kill.** torch 2.13's ``FileTimerServer`` signals its own process after it
  reaps a worker; this one does not, unless built with ``self_kill=True``.
* **Identity-safe reaping.** Workers are pinned (pidfd) when they register, so a
  recycled pid is never signalled, and a worker that exits has its timers cleared at
  once. pid ``<= 1``, negative pids and the server itself are never signalled.
* **Monotonic deadlines.** The compat clients send, besides torch's epoch
  ``expiration_time``, the same deadline on ``time.monotonic()`` (the ``mono`` key) to
  aiotimer servers, so wall-clock steps cannot fire or postpone a timer.
* **Typed errors** that still satisfy torch's ``except`` clauses:
  :class:`TimerNotConfiguredError` is a ``RuntimeError``,
  :class:`TimerServerUnavailableError` a ``BrokenPipeError``,
  :class:`TimerRequestTooLargeError` a ``RuntimeError``.
* **Unique default scopes.** ``expires()`` without ``scope=`` names the caller's
  ``file:line`` plus a counter (cheap, no ``inspect.stack()``), so nested or concurrent
  blocks on one line are independent timers. Pass ``scope=`` to share one timer (torch's
  behaviour for recursive calls).
* A release that fails never hides the exception of the block it closes.

The servers run aiotimer's :class:`~aiotimer.server.TimerServer` in a daemon thread
(:class:`~aiotimer.server.TimerServerThread`); ``stop()`` is idempotent and a stopped
server can be started again. The clients use aiotimer's
:class:`~aiotimer.client.FifoClient` and :class:`~aiotimer.client.QueueClient`.
"""

from __future__ import annotations

import abc
import array
import contextlib
import fcntl
import json
import logging
import math
import os
import queue as _queue
import signal as _signal
import termios
import threading
import time
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Protocol, Self

from aiotimer._clock import Clock, MonotonicClock
from aiotimer._protocol import Request, RequestTooLargeError
from aiotimer._scope import current_pid, default_scope
from aiotimer._table import Timer
from aiotimer.client import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_WRITE_TIMEOUT,
    FifoClient,
    QueueClient,
)
from aiotimer.errors import NotConfiguredError, ServerStateError, ServerUnavailableError
from aiotimer.events import (
    Event,
    ServerStarted,
    ServerStopped,
    TimerExpired,
    WorkerExited,
    WorkerReaped,
)
from aiotimer.reapers import Reaper
from aiotimer.server import TimerServer as _AioTimerServer
from aiotimer.server import TimerServerThread

if TYPE_CHECKING:
    from aiotimer.client import TimerClient as _AioTimerClient

__all__ = [
    "FileTimerClient",
    "FileTimerRequest",
    "FileTimerServer",
    "LocalTimerClient",
    "LocalTimerServer",
    "MultiprocessingRequestQueue",
    "RequestQueue",
    "TimerClient",
    "TimerNotConfiguredError",
    "TimerRequest",
    "TimerRequestTooLargeError",
    "TimerServer",
    "TimerServerUnavailableError",
    "configure",
    "expires",
    "log_debug_info_for_expired_timers",
]

logger = logging.getLogger(__name__)

#: torch's default reap signal.
_SIGKILL: Final[int] = int(_signal.SIGKILL)
#: How long ``register_timers``/``clear_timers`` wait for the server's loop to apply them.
_SYNC_TIMEOUT: Final[float] = 10.0
#: How long ``start()`` waits for the server to accept requests.
_START_TIMEOUT: Final[float] = 30.0

# -- errors ------------------------------------------------------------------------------


class TimerNotConfiguredError(NotConfiguredError, RuntimeError):
    """``expires()`` found no client: call :func:`configure` first (or pass ``client=``).

    A ``RuntimeError``, as torch raises in this case.
    """


class TimerServerUnavailableError(ServerUnavailableError, BrokenPipeError):
    """No timer server reads the FIFO (within the client's ``connect_timeout``).

    A ``BrokenPipeError``, as torch's ``FileTimerClient`` raises in this case.
    """


class TimerRequestTooLargeError(RequestTooLargeError, RuntimeError):
    """A request line would exceed ``PIPE_BUF`` bytes (use a shorter ``scope_id``).

    A ``RuntimeError``, as torch raises in this case.
    """


# -- requests ----------------------------------------------------------------------------


class TimerRequest:
    """An acquire (``expiration_time >= 0``, epoch seconds) or a release (negative).

    Same attributes, constructor and equality as torch's ``TimerRequest``; ``worker_id``
    is a pid for every server in this module.
    """

    __slots__ = ("expiration_time", "scope_id", "worker_id")

    def __init__(self, worker_id: Any, scope_id: str, expiration_time: float) -> None:
        self.worker_id = worker_id
        self.scope_id = scope_id
        self.expiration_time = expiration_time

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TimerRequest):
            return (
                self.worker_id == other.worker_id
                and self.scope_id == other.scope_id
                and self.expiration_time == other.expiration_time
            )
        return False

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value (as torch's)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(worker_id={self.worker_id!r}, scope_id={self.scope_id!r}, "
            f"expiration_time={self.expiration_time!r})"
        )


class FileTimerRequest(TimerRequest):
    """A :class:`TimerRequest` with the ``signal`` to reap with (``<= 0``: report only).

    Same constructor, attributes, equality and :meth:`to_json` as torch's
    ``FileTimerRequest``.
    """

    __slots__ = ("signal", "version")

    def __init__(
        self, worker_pid: int, scope_id: str, expiration_time: float, signal: int = 0
    ) -> None:
        super().__init__(worker_id=worker_pid, scope_id=scope_id, expiration_time=expiration_time)
        self.version = 1
        self.signal = signal

    @property
    def worker_pid(self) -> int:
        """The worker's pid (``worker_id``)."""
        pid: int = self.worker_id
        return pid

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FileTimerRequest):
            return (
                super().__eq__(other)
                and self.version == other.version
                and self.signal == other.signal
            )
        return False

    __hash__ = None

    def to_json(self) -> str:
        """The request as torch's ``FileTimerRequest.to_json()`` writes it (same bytes)."""
        return json.dumps(
            {
                "version": self.version,
                "pid": self.worker_pid,
                "scope_id": self.scope_id,
                "expiration_time": self.expiration_time,
                "signal": self.signal,
            }
        )

    def __repr__(self) -> str:
        return (
            f"FileTimerRequest(worker_pid={self.worker_id!r}, scope_id={self.scope_id!r}, "
            f"expiration_time={self.expiration_time!r}, signal={self.signal!r})"
        )


def _to_request(request: TimerRequest) -> Request:
    """``request`` as an aiotimer request (``TimerRequest`` has no signal: SIGKILL)."""
    pid = request.worker_id
    if not isinstance(pid, int) or isinstance(pid, bool):
        raise TypeError(f"worker_id must be a pid (an int), got {pid!r}")
    signal = getattr(request, "signal", _SIGKILL)
    return Request(
        pid=pid,
        scope_id=request.scope_id,
        expiration_time=request.expiration_time,
        signal=int(signal),
    )


# -- the abstract API (torch's shapes) ---------------------------------------------------


class TimerClient(abc.ABC):
    """Acquires and releases timers for the process that holds it (torch's ABC).

    Subclass it for a custom transport; :func:`expires` calls :meth:`acquire` and
    :meth:`release`.
    """

    @abc.abstractmethod
    def acquire(self, scope_id: str, expiration_time: float) -> None:
        """Set the timer ``scope_id`` of this worker to expire at ``expiration_time``
        (epoch seconds)."""

    @abc.abstractmethod
    def release(self, scope_id: str) -> None:
        """Release the timer ``scope_id`` of this worker (unknown scopes are ignored)."""


class RequestQueue(abc.ABC):
    """A consumer queue of timer requests (torch's ABC)."""

    @abc.abstractmethod
    def size(self) -> int:
        """The number of requests in the queue now (it may grow before :meth:`get`)."""

    @abc.abstractmethod
    def get(self, size: int, timeout: float) -> list[TimerRequest]:
        """Up to ``size`` requests, waiting at most ``timeout`` seconds in all."""


class TimerServer(abc.ABC):
    """torch's polling ``TimerServer`` ABC, for custom servers written against it.

    A watchdog thread repeatedly takes a batch from ``request_queue`` (waiting up to
    ``max_interval``), registers it, and reaps every worker with expired timers. Unlike
    torch's, :meth:`stop` is idempotent and a stopped server can be started again.

    :class:`FileTimerServer` and :class:`LocalTimerServer` do not poll: they run
    aiotimer's deadline-driven engine and are not subclasses of this class.
    """

    def __init__(
        self, request_queue: RequestQueue, max_interval: float, daemon: bool = True
    ) -> None:
        self._request_queue = request_queue
        self._max_interval = max_interval
        self._daemon = daemon
        self._watchdog_thread: threading.Thread | None = None
        self._stop_event = threading.Event()

    @abc.abstractmethod
    def register_timers(self, timer_requests: list[TimerRequest]) -> None:
        """Apply acquires (set or replace a timer) and releases (negative expiration)."""

    @abc.abstractmethod
    def clear_timers(self, worker_ids: set[Any]) -> None:
        """Drop every timer of ``worker_ids``."""

    @abc.abstractmethod
    def get_expired_timers(self, deadline: float) -> dict[Any, list[TimerRequest]]:
        """The timers with ``expiration_time <= deadline``, by worker id."""

    @abc.abstractmethod
    def _reap_worker(self, worker_id: Any) -> bool:
        """Reap ``worker_id``; ``True`` on success (an exception also counts as reaped)."""

    def _reap_worker_no_throw(self, worker_id: Any) -> bool:
        """:meth:`_reap_worker`, treating an exception as a successful reap (torch's rule)."""
        try:
            return self._reap_worker(worker_id)
        except Exception:
            logger.exception("_reap_worker(%r) raised; the worker is considered reaped", worker_id)
            return True

    def _run_watchdog(self) -> None:
        """One watchdog round: take a batch, register it, reap the expired workers."""
        batch_size = max(1, self._request_queue.size())
        self.register_timers(self._request_queue.get(batch_size, self._max_interval))
        reaped: set[Any] = set()
        for worker_id, expired in self.get_expired_timers(time.time()).items():
            scopes = [r.scope_id for r in expired]
            logger.info("reaping worker %r; expired timers: %s", worker_id, scopes)
            if self._reap_worker_no_throw(worker_id):
                reaped.add(worker_id)
            else:
                logger.error("could not reap worker %r; retrying next round", worker_id)
        self.clear_timers(reaped)

    def _watchdog_loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self._run_watchdog()
            except Exception:
                logger.exception("the watchdog round failed")

    def start(self) -> None:
        """Start the watchdog thread.

        Raises:
            ServerStateError: it is already running.
        """
        if self._watchdog_thread is not None:
            raise ServerStateError(f"{type(self).__name__} is already running")
        self._stop_event = threading.Event()
        self._watchdog_thread = threading.Thread(
            target=self._watchdog_loop,
            args=(self._stop_event,),
            name=f"{type(self).__name__}-watchdog",
            daemon=self._daemon,
        )
        self._watchdog_thread.start()

    def stop(self) -> None:
        """Stop the watchdog thread and wait for it to end its round. Idempotent."""
        thread, self._watchdog_thread = self._watchdog_thread, None
        self._stop_event.set()
        if thread is not None:
            thread.join()


# -- configure / expires ----------------------------------------------------------------

_timer_client: TimerClient | None = None


def configure(timer_client: TimerClient | None) -> None:
    """Set the client :func:`expires` uses when given none (``None`` removes it)."""
    global _timer_client
    _timer_client = timer_client
    logger.debug("timer client configured: %s", type(timer_client).__name__)


class _Expires:
    """The context manager :func:`expires` returns (usable once)."""

    __slots__ = ("_after", "_client", "_entered", "scope")

    def __init__(self, after: float, scope: str, client: TimerClient | None) -> None:
        self._after = after
        self.scope = scope
        self._client = client
        self._entered = False

    def __enter__(self) -> None:
        if self._entered:
            raise RuntimeError("an expires() block can be entered only once")
        self._entered = True
        client = self._client if self._client is not None else _timer_client
        if client is None:
            raise TimerNotConfiguredError(
                "no timer client: call aiotimer.compat.torch.configure(FileTimerClient(path)) "
                "before using expires(), or pass client=; aiotimer.expires() also finds the "
                "server through TORCHELASTIC_TIMER_FILE"
            )
        self._client = client
        client.acquire(self.scope, time.time() + self._after)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._client is not None
        try:
            self._client.release(self.scope)
        except Exception as release_exc:
            if exc is None:
                raise
            logger.warning(
                "releasing scope %r failed (%s: %s) while the block raised %s; the block's "
                "exception propagates",
                self.scope,
                type(release_exc).__name__,
                release_exc,
                type(exc).__name__,
            )


def expires(after: float, scope: str | None = None, client: TimerClient | None = None) -> _Expires:
    """A block that must finish within ``after`` seconds, or its process is reaped.

    torch's signature: ``with expires(after=10): ...``. Calls ``client.acquire(scope,
    time.time() + after)`` on entry and ``client.release(scope)`` on exit.

    Args:
        after: seconds from entering the block to its deadline.
        scope: the timer's id; by default ``"file.py:LINE#N"`` for the caller's line,
            unique per block (blocks that pass the same ``scope`` share one timer).
        client: the client; by default the one given to :func:`configure`.

    Raises:
        TimerNotConfiguredError: (on entry) no client given or configured.
        TimerServerUnavailableError: (on entry or exit) no server reads the FIFO.

    A failing release never hides the block's own exception (it is logged instead).
    """
    return _Expires(after, default_scope() if scope is None else scope, client)


# -- clients ------------------------------------------------------------------------------


def _acquire_request(scope_id: str, expiration_time: float, signal: int) -> Request:
    """An acquire carrying both torch's epoch deadline and the same one on the monotonic
    clock (sent only to aiotimer servers)."""
    mono = None
    if expiration_time >= 0 and math.isfinite(expiration_time):
        mono = time.monotonic() + (expiration_time - time.time())
    return Request(
        pid=current_pid(),
        scope_id=scope_id,
        expiration_time=expiration_time,
        signal=int(signal),
        mono=mono,
    )


def _release_request(scope_id: str) -> Request:
    return Request(pid=current_pid(), scope_id=scope_id, expiration_time=-1, signal=0)


def _send(client: _AioTimerClient, request: Request) -> None:
    """Send through an aiotimer client, raising torch-compatible typed errors."""
    try:
        client.send(request)
    except ServerUnavailableError as exc:
        raise TimerServerUnavailableError(str(exc)) from exc
    except RequestTooLargeError as exc:
        raise TimerRequestTooLargeError(str(exc)) from exc


class FileTimerClient(TimerClient):
    """Client of a FIFO timer server: aiotimer's, or torch's ``FileTimerServer``.

    torch's signature. Built on :class:`aiotimer.client.FifoClient`: against an aiotimer
    server it keeps one descriptor open and adds the monotonic deadline; against torch's
    server it opens, writes and closes per request, with torch's exact bytes.

    Args:
        file_path: the server's FIFO.
        signal: the signal to reap with (``<= 0``: report only). Can be changed later
            through the ``signal`` attribute, as in torch.
        connect_timeout: seconds to keep retrying while no server reads the FIFO (torch
            retries for about one second), then :class:`TimerServerUnavailableError`.
        write_timeout: seconds to wait for room in a full pipe, then
            :class:`~aiotimer.errors.ClientBackpressureError`.
    """

    def __init__(
        self,
        file_path: str,
        signal: int = _SIGKILL,
        *,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        write_timeout: float = DEFAULT_WRITE_TIMEOUT,
    ) -> None:
        self._file_path = file_path
        self.signal = signal
        self._client = FifoClient(
            file_path,
            signal=signal,
            connect_timeout=connect_timeout,
            write_timeout=write_timeout,
        )

    @property
    def client(self) -> FifoClient:
        """The aiotimer client underneath (usable with ``aiotimer.expires(client=...)``)."""
        return self._client

    def acquire(self, scope_id: str, expiration_time: float) -> None:
        """Set this process's timer ``scope_id`` to expire at ``expiration_time`` (epoch)."""
        _send(self._client, _acquire_request(scope_id, expiration_time, self.signal))

    def release(self, scope_id: str) -> None:
        """Release this process's timer ``scope_id``."""
        _send(self._client, _release_request(scope_id))

    def close(self) -> None:
        """Close the persistent descriptor, if any (reopened on next use)."""
        self._client.close()

    def __repr__(self) -> str:
        return f"<FileTimerClient {self._file_path!r} signal={self.signal}>"


class _PutQueue(Protocol):
    def put(self, obj: Any, block: bool = ..., timeout: float | None = ...) -> None: ...


class LocalTimerClient(TimerClient):
    """Client of a queue timer server: :class:`LocalTimerServer` or torch's.

    torch's signature. Built on :class:`aiotimer.client.QueueClient`: each request has
    torch's ``TimerRequest`` attributes (so torch's ``LocalTimerServer`` takes it) plus
    ``signal`` (SIGKILL) and the monotonic deadline for aiotimer's queue source.
    """

    def __init__(
        self, mp_queue: _PutQueue, *, write_timeout: float = DEFAULT_WRITE_TIMEOUT
    ) -> None:
        self._mp_queue = mp_queue
        self._client = QueueClient(mp_queue, signal=_SIGKILL, write_timeout=write_timeout)

    @property
    def client(self) -> QueueClient:
        """The aiotimer client underneath (usable with ``aiotimer.expires(client=...)``)."""
        return self._client

    def acquire(self, scope_id: str, expiration_time: float) -> None:
        """Set this process's timer ``scope_id`` to expire at ``expiration_time`` (epoch)."""
        _send(self._client, _acquire_request(scope_id, expiration_time, _SIGKILL))

    def release(self, scope_id: str) -> None:
        """Release this process's timer ``scope_id``."""
        _send(self._client, _release_request(scope_id))

    def __repr__(self) -> str:
        return f"<LocalTimerClient {self._mp_queue!r}>"


class _GetQueue(Protocol):
    def qsize(self) -> int: ...
    def get(self, block: bool = ..., timeout: float | None = ...) -> Any: ...


class MultiprocessingRequestQueue(RequestQueue):
    """A :class:`RequestQueue` over a ``multiprocessing.Queue`` (torch's class)."""

    def __init__(self, mp_queue: _GetQueue) -> None:
        self._mp_queue = mp_queue

    def size(self) -> int:
        """The queue's approximate size."""
        return self._mp_queue.qsize()

    def get(self, size: int, timeout: float) -> list[TimerRequest]:
        """Up to ``size`` requests, waiting at most ``timeout`` seconds in all."""
        requests: list[TimerRequest] = []
        end = time.monotonic() + timeout
        for _ in range(size):
            wait = end - time.monotonic()
            try:
                requests.append(self._mp_queue.get(block=True, timeout=max(0.0, wait)))
            except _queue.Empty:
                break
            if end - time.monotonic() <= 0:
                break
        return requests


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
        """Wait until the loop has applied everything submitted so far."""
        with contextlib.suppress(ServerStateError):  # not running: nothing to wait for
            self._server._call_in_loop(lambda: None, _SYNC_TIMEOUT)

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
