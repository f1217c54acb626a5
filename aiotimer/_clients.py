"""Transport clients: how a worker's requests reach a timer server.

Every client implements :class:`TimerClient`: ``send(request)`` for synchronous code and
``await send_async(request)`` for async code. Both faces share one implementation: the
sending logic is written once as a generator that *yields* what it needs to wait for
(:class:`_Sleep` or :class:`_Writable`); :func:`_drive` waits by blocking (bounded),
:func:`_drive_async` waits by awaiting. The common case (descriptor open, room in the
pipe) never creates the generator at all: one ``os.write`` under a lock. For
:func:`aiotimer.expires` blocks, :class:`FifoClient` also takes the acquire without a
:class:`~aiotimer._protocol.Request` object and encodes both lines of the block at once
(``FifoClient._acquire_now``, ``FifoClient._release_now``): that is the path measured by
``benchmarks/bench_client.py``.

Clients:

* :class:`FifoClient` — the named pipe of ``aiotimer serve`` or of torch's
  ``FileTimerServer`` (torch-identical lines; the ``mono`` extension only for aiotimer);
* :class:`QueueClient` — a ``multiprocessing`` queue (torch's ``TimerRequest`` shape);
* :class:`InProcessClient` — a server embedded in this very process.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import queue as _queue
import select
import signal as _signal
import stat
import threading
import time
import weakref
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Final, Protocol, runtime_checkable

import anyio

from aiotimer._protocol import MARKER_SUFFIX, Request, block_encoder, encode
from aiotimer.errors import ClientBackpressureError, ServerUnavailableError

__all__ = [
    "FifoClient",
    "InProcessClient",
    "QueueClient",
    "QueueRequest",
    "RequestSubmitter",
    "TimerClient",
]

log = logging.getLogger("aiotimer.client")

#: The signal a timer kills with unless told otherwise (torch's default).
DEFAULT_SIGNAL: Final[int] = int(_signal.SIGKILL)
#: How long a client keeps retrying while no server reads its FIFO.
DEFAULT_CONNECT_TIMEOUT: Final[float] = 2.0
#: How long a client waits for room in a full pipe (or a full queue).
DEFAULT_WRITE_TIMEOUT: Final[float] = 2.0
#: How many times in a row a broken pipe (server gone) triggers an immediate reopen.
_MAX_REOPENS: Final[int] = 3
_RETRY_FIRST: Final[float] = 0.001
_RETRY_MAX: Final[float] = 0.05


@runtime_checkable
class TimerClient(Protocol):
    """What :func:`aiotimer.expires` needs from a transport.

    ``send`` may block the calling thread for a bounded time (no server yet, full pipe);
    ``send_async`` waits by awaiting instead. Both raise
    :class:`~aiotimer.errors.ServerUnavailableError` or
    :class:`~aiotimer.errors.ClientBackpressureError` when the bound is exceeded.
    A client decides what goes on the wire: extension fields such as ``mono`` are sent
    only to servers known to understand them.
    """

    @property
    def signal(self) -> int:
        """The signal timers acquired through this client are reaped with by default."""
        ...

    def send(self, request: Request) -> None:
        """Deliver ``request`` to the server (acquire or release)."""
        ...

    async def send_async(self, request: Request) -> None:
        """Deliver ``request`` to the server, awaiting instead of blocking."""
        ...


# -- the shared wait machinery --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class _Writable:
    fd: int  # a descriptor private to this wait (a dup), so nobody closes it under us
    timeout: float


_Wait = _Sleep | _Writable
_Steps = Generator[_Wait, bool | None, None]


def _drive(steps: _Steps) -> None:
    """Run a sending generator, waiting by blocking the calling thread."""
    ready: bool | None = None  # a generator must be started with None
    while True:
        try:
            step = steps.send(ready)
        except StopIteration:
            return
        if isinstance(step, _Sleep):
            time.sleep(step.seconds)
            ready = True
        else:
            poller = select.poll()
            poller.register(step.fd, select.POLLOUT)
            ready = bool(poller.poll(max(0.0, step.timeout) * 1000.0))


async def _drive_async(steps: _Steps, *, shield: bool = False) -> None:
    """Run a sending generator, waiting by awaiting (the event loop stays free).

    With ``shield`` the waits are not interrupted by cancellation: used for releases, so
    a cancelled task still tells the server it left its block (every wait is bounded).
    """
    with anyio.CancelScope(shield=shield):
        ready: bool | None = None  # a generator must be started with None
        while True:
            try:
                step = steps.send(ready)
            except StopIteration:
                return
            if isinstance(step, _Sleep):
                await anyio.sleep(step.seconds)
                ready = True
            else:
                with anyio.move_on_after(step.timeout):
                    await anyio.wait_writable(step.fd)
                    ready = True
                    continue
                ready = False


def _next_retry(delay: float) -> float:
    return min(delay * 2, _RETRY_MAX)


# -- FIFO -------------------------------------------------------------------------------


class _Outcome:
    """Why an attempt to write did not complete (see ``FifoClient._attempt``)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class _NoReader(_Outcome):
    error: OSError


@dataclass(frozen=True, slots=True)
class _Full(_Outcome):
    dup_fd: int


@dataclass(frozen=True, slots=True)
class _Broken(_Outcome):
    error: OSError


_SENT: Final = None
_monotonic: Final = time.monotonic
_write: Final = os.write
_NO_READER_ERRNOS: Final = frozenset({errno.ENXIO, errno.ENOENT})
_live_fifo_clients: weakref.WeakSet[FifoClient] = weakref.WeakSet()


class FifoClient:
    """Send requests into a timer server's named pipe (aiotimer's or torch's).

    Which server is on the other end decides how the client talks, per connection:

    * **aiotimer server** (its marker file ``path + ".aiotimer"`` names a live process):
      one persistent ``O_WRONLY | O_NONBLOCK`` descriptor, one ``os.write`` per request,
      lines carry the ``mono`` (``time.monotonic()``) deadline extension;
    * **anything else** (torch's ``FileTimerServer``): open, write, close for every
      request, exactly torch's bytes — torch's server reads with a blocking
      ``readline()`` and stops reaping while any writer keeps the pipe open.

    Failure handling:

    * no server (no FIFO, or no reader: ``ENOENT``/``ENXIO``) → retry with short sleeps
      for up to ``connect_timeout`` seconds, then
      :class:`~aiotimer.errors.ServerUnavailableError`;
    * server restarted (``EPIPE`` on the persistent descriptor, or a new marker: checked
      at most every ``marker_check_interval`` seconds, when a request is sent) → reopen
      at once, then re-send the acquires of every block still open in this process (the
      new server starts empty) before the request itself; a marker gone means the
      aiotimer server left: the descriptor is closed and the client talks torch's way;
    * full pipe (``EAGAIN``) → wait for room up to ``write_timeout`` seconds (``send``
      polls, ``send_async`` awaits writability), then
      :class:`~aiotimer.errors.ClientBackpressureError`.

    Thread-safe (a lock guards the descriptor) and fork-safe (a forked child drops the
    parent's descriptor and open blocks and reconnects on first use).

    Args:
        path: the FIFO's path.
        signal: the default signal for timers acquired through this client.
        connect_timeout: seconds to keep retrying while no server reads the FIFO.
        write_timeout: seconds to wait for room in a full pipe.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        signal: int = DEFAULT_SIGNAL,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        write_timeout: float = DEFAULT_WRITE_TIMEOUT,
    ) -> None:
        if not (math.isfinite(connect_timeout) and connect_timeout >= 0):
            raise ValueError(f"connect_timeout must be a finite number >= 0: {connect_timeout}")
        if not (math.isfinite(write_timeout) and write_timeout >= 0):
            raise ValueError(f"write_timeout must be a finite number >= 0: {write_timeout}")
        self._path = os.fspath(path)
        self._signal = int(signal)
        self.connect_timeout = float(connect_timeout)
        self.write_timeout = float(write_timeout)
        #: At most this often (seconds), a request also checks that the server that
        #: published the marker is still the one reading (see the class docstring).
        self.marker_check_interval = 1.0
        self._lock = threading.Lock()
        self._pid = os.getpid()  # refreshed in a forked child, with the encoder
        self._encode_block = block_encoder(self._pid, self._signal)
        self._fd: int | None = None  # persistent descriptor (aiotimer server only)
        self._server: _Marker | None = None  # whom the persistent descriptor talks to
        self._recheck_at = 0.0  # when the marker is due to be checked again (monotonic)
        self._connected_before = False
        # Live blocks: scope -> (acquire line, release line). The acquire lines are
        # replayed after a restart; the release line is ready for the block's exit.
        self._open_scopes: dict[str, tuple[bytes, bytes]] = {}
        self._backlog: list[bytes] = []  # replayed acquires not yet written
        _live_fifo_clients.add(self)

    @property
    def path(self) -> str:
        """The FIFO's path."""
        return self._path

    @property
    def signal(self) -> int:
        """The default signal for timers acquired through this client."""
        return self._signal

    @property
    def persistent(self) -> bool:
        """True while a persistent descriptor to an aiotimer server is open."""
        return self._fd is not None

    def send(self, request: Request) -> None:
        """Deliver ``request``, blocking at most ``connect_timeout + write_timeout``."""
        if not self._try_send(request):
            _drive(self._sending(request))

    async def send_async(self, request: Request) -> None:
        """Deliver ``request``; waits are awaited (releases are shielded from cancellation)."""
        if not self._try_send(request):
            await _drive_async(self._sending(request), shield=request.is_release)

    def close(self) -> None:
        """Close the persistent descriptor, if any (the client reconnects on next use)."""
        with self._lock:
            self._close_locked()

    def __enter__(self) -> FifoClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)  # None also when __init__ raised early
        if fd is not None:
            self._fd = None
            os.close(fd)

    def __repr__(self) -> str:
        mode = "persistent" if self._fd is not None else "per-request"
        return f"<FifoClient {self._path!r} {mode}, {len(self._open_scopes)} open scopes>"

    # -- internals --------------------------------------------------------------------

    def _try_send(self, request: Request) -> bool:
        """Track ``request`` for replay, then the fast path (:meth:`_acquire_now`,
        :meth:`_release_now`) if the request is one it writes. False means: take the slow
        path (:meth:`_sending`)."""
        scope = request.scope_id
        plain = request.grace is None and not (request.group or request.dump)
        if plain and request.pid == self._pid:
            if request.expiration_time < 0:
                if request.signal == 0:  # the release line _release_now writes
                    return self._release_now(scope, _monotonic())
            elif request.mono is not None:
                return self._acquire_now(
                    scope, request.expiration_time, request.signal, request.mono, _monotonic()
                )
        # Any other request takes the slow path, which writes encode(request) as is.
        if request.expiration_time < 0:
            self._open_scopes.pop(scope, None)
        else:
            self._open_scopes[scope] = (
                encode(request),
                encode(Request(request.pid, scope, -1, 0)),
            )
        return False

    def _acquire_now(
        self, scope: str, expiration_time: float, signal: int | None, mono: float, now: float
    ) -> bool:
        """The fast path of an acquire of this process (``signal`` ``None`` means the
        client's; ``mono`` is the deadline on ``time.monotonic()``, ``now`` the time).

        Encodes both lines of the block (:func:`~aiotimer._protocol.block_encoder`) and
        tracks them for replay, then writes the acquire line (see :meth:`_release_now`).
        :func:`aiotimer.expires` blocks call it directly, with no :class:`Request` built.
        False means: send the equivalent :class:`Request` with :meth:`send` or
        :meth:`send_async`; nothing was written then.
        """
        encode_block = (
            self._encode_block
            if signal is None or signal == self._signal
            else block_encoder(self._pid, signal)
        )
        lines = self._open_scopes[scope] = encode_block(scope, expiration_time, mono)
        if now > self._recheck_at:
            return False
        lock = self._lock
        lock.acquire()  # cheaper than `with` on the hot path
        try:
            fd = self._fd
            if fd is None or self._backlog:
                return False
            _write(fd, lines[0])
        except OSError:
            return False
        finally:
            lock.release()
        return True

    def _release_now(self, scope: str, now: float = -math.inf) -> bool:
        """The fast path of the release of ``scope`` by this process: the line encoded
        on acquire, written with one ``os.write`` on the persistent descriptor if it is
        open, has no replay pending and room for the line (<= ``PIPE_BUF``: all or
        nothing). ``now`` is ``time.monotonic()``; the default ``-inf`` skips the marker
        check, as a block's release does: a release that reaches a new server it does not
        concern is ignored there, and the block's acquire, or the next one, runs the
        check (and the replay) anyway.
        """
        tracked = self._open_scopes.pop(scope, None)
        # Untracked: a second release of a shared scope, or one after a fork (the child
        # tracks none of its parent's blocks): the release of this process.
        line = encode(Request(self._pid, scope, -1, 0)) if tracked is None else tracked[1]
        if now > self._recheck_at:
            return False
        lock = self._lock
        lock.acquire()  # cheaper than `with` on the hot path
        try:
            fd = self._fd
            if fd is None or self._backlog:
                return False
            _write(fd, line)
        except OSError:
            return False
        finally:
            lock.release()
        return True

    def _sending(self, request: Request) -> _Steps:
        """The whole sending logic; yields what it must wait for (see module docstring)."""
        started = time.monotonic()
        retry = _RETRY_FIRST
        reopens = 0
        while True:
            with self._lock:
                outcome = self._attempt(request)
            if outcome is _SENT:
                return
            if isinstance(outcome, _Broken):
                reopens += 1
                if reopens > _MAX_REOPENS:
                    raise ServerUnavailableError(
                        f"the timer server's FIFO {self._path!r} keeps closing "
                        f"({outcome.error.strerror}); is the server restarting in a loop?"
                    ) from outcome.error
                continue
            if isinstance(outcome, _NoReader):
                waited = time.monotonic() - started
                if waited >= self.connect_timeout:
                    raise ServerUnavailableError(self._unavailable_message(outcome.error, waited))
                yield _Sleep(min(retry, self.connect_timeout - waited))
                retry = _next_retry(retry)
                continue
            assert isinstance(outcome, _Full)
            try:
                remaining = self.write_timeout - (time.monotonic() - started)
                ready = remaining > 0 and (yield _Writable(outcome.dup_fd, remaining))
            finally:
                os.close(outcome.dup_fd)
            if not ready and time.monotonic() - started >= self.write_timeout:
                raise ClientBackpressureError(
                    f"the timer server's FIFO {self._path!r} stayed full for "
                    f"{self.write_timeout:g}s; the server is overloaded or stuck "
                    "(raise write_timeout, or check the server)"
                )

    def _attempt(self, request: Request) -> _Outcome | None:
        """Try once to write ``request`` (and any replay backlog). Holds the lock."""
        if self._fd is not None:
            self._recheck_marker_locked()
        if self._fd is None:
            try:
                fd = self._open_locked()
            except OSError as exc:
                if exc.errno in _NO_READER_ERRNOS:
                    return _NoReader(exc)
                raise ServerUnavailableError(
                    f"cannot open the timer server's FIFO {self._path!r}: {exc.strerror}"
                ) from exc
            persistent = self._fd is not None
        else:
            fd, persistent = self._fd, True
        try:
            if persistent:
                while self._backlog:
                    os.write(fd, self._backlog[0])
                    del self._backlog[0]
                os.write(fd, encode(request))
            else:
                os.write(fd, encode(_torch_request(request)))
        except BlockingIOError:
            return _Full(os.dup(fd))
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise ServerUnavailableError(
                    f"cannot write to the timer server's FIFO {self._path!r}: {exc.strerror}"
                ) from exc
            if persistent:
                self._close_locked()
            return _Broken(exc)
        finally:
            if not persistent:
                os.close(fd)
        return _SENT

    def _open_locked(self) -> int:
        """Open the FIFO; keep the descriptor (and queue a replay) for an aiotimer server."""
        fd = os.open(self._path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                raise ServerUnavailableError(
                    f"{self._path!r} is not a FIFO; point the client at the path the timer "
                    "server was started with (aiotimer serve --fifo PATH)"
                )
            server = _read_marker(self._path)
            if server is not None:
                self._fd, self._server = fd, server
                self._recheck_at = time.monotonic() + self.marker_check_interval
                if self._connected_before:
                    self._queue_replay_locked()
                self._connected_before = True
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _recheck_marker_locked(self) -> None:
        """Every ``marker_check_interval``: has another server taken over the FIFO?"""
        now = time.monotonic()
        if now <= self._recheck_at:
            return
        self._recheck_at = now + self.marker_check_interval
        server = _read_marker(self._path)
        if server == self._server:
            return
        if server is None:  # the aiotimer server left; whoever reads now, be torch-safe
            log.info("the aiotimer server of %s left; closing the descriptor", self._path)
            self._close_locked()
            return
        self._server = server  # a new server reads the same FIFO: it starts empty
        self._queue_replay_locked()

    def _queue_replay_locked(self) -> None:
        self._backlog = [lines[0] for lines in list(self._open_scopes.values())]
        log.info("(re)connected to %s; re-sending %d open scopes", self._path, len(self._backlog))

    def _close_locked(self) -> None:
        fd, self._fd = self._fd, None
        self._server = None
        self._backlog = []
        if fd is not None:
            os.close(fd)

    def _unavailable_message(self, error: OSError, waited: float) -> str:
        why = "does not exist" if error.errno == errno.ENOENT else "has no reader"
        return (
            f"no timer server reads {self._path!r} (the FIFO {why}; waited {waited:.2f}s): "
            "start one with `aiotimer serve --fifo PATH` (or embed TimerServer) before the "
            "workers, or raise connect_timeout if it is still starting"
        )

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._encode_block = block_encoder(self._pid, self._signal)
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        self._server = None
        self._backlog = []
        self._open_scopes = {}  # the parent's blocks are not the child's
        self._connected_before = False


def _torch_request(request: Request) -> Request:
    """``request`` without aiotimer's extension fields (torch's exact bytes)."""
    return Request(
        pid=request.pid,
        scope_id=request.scope_id,
        expiration_time=request.expiration_time,
        signal=request.signal,
    )


@dataclass(frozen=True, slots=True)
class _Marker:
    """Which aiotimer server published a marker: its file's identity and its pid."""

    inode: int
    mtime_ns: int
    pid: int | None


def _read_marker(fifo_path: str) -> _Marker | None:
    """The marker beside ``fifo_path`` if it names a live aiotimer server, else ``None``."""
    try:
        with open(fifo_path + MARKER_SUFFIX, "rb") as f:
            st = os.fstat(f.fileno())
            marker = json.loads(f.read(65536))
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("server") != "aiotimer":
        return None
    pid = marker.get("pid")
    if not (isinstance(pid, int) and pid > 0):
        pid = None
    elif pid != os.getpid():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None  # a stale marker left by a server that died
        except PermissionError:
            pass  # alive, owned by someone else
    return _Marker(st.st_ino, st.st_mtime_ns, pid)


def _reset_fifo_clients_in_child() -> None:
    for client in list(_live_fifo_clients):
        client._after_fork_in_child()


os.register_at_fork(after_in_child=_reset_fifo_clients_in_child)


# -- multiprocessing queue ----------------------------------------------------------------


class QueueRequest:
    """torch's ``TimerRequest`` shape (``worker_id``, ``scope_id``, ``expiration_time``)
    plus aiotimer's ``signal`` and ``mono`` attributes, which torch's server ignores.

    A negative ``expiration_time`` is a release.
    """

    __slots__ = ("expiration_time", "mono", "scope_id", "signal", "worker_id")

    def __init__(
        self,
        worker_id: int,
        scope_id: str,
        expiration_time: float,
        signal: int = DEFAULT_SIGNAL,
        mono: float | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.scope_id = scope_id
        self.expiration_time = expiration_time
        self.signal = signal
        self.mono = mono

    def __getstate__(self) -> tuple[int, str, float, int, float | None]:
        return (self.worker_id, self.scope_id, self.expiration_time, self.signal, self.mono)

    def __setstate__(self, state: tuple[int, str, float, int, float | None]) -> None:
        self.worker_id, self.scope_id, self.expiration_time, self.signal, self.mono = state

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, QueueRequest):
            return NotImplemented
        return self.__getstate__() == other.__getstate__()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"QueueRequest(worker_id={self.worker_id}, scope_id={self.scope_id!r}, "
            f"expiration_time={self.expiration_time}, signal={self.signal})"
        )


class _PutQueue(Protocol):
    def put(self, obj: Any, block: bool = ..., timeout: float | None = ...) -> None: ...


class QueueClient:
    """Send requests through a ``multiprocessing`` queue (torch's ``LocalTimerClient`` style).

    Each request is a :class:`QueueRequest` — torch's ``TimerRequest`` attributes, so
    torch's ``LocalTimerServer`` accepts it too, plus ``signal`` and ``mono`` for
    aiotimer's queue source. A bounded queue that stays full for ``write_timeout``
    seconds raises :class:`~aiotimer.errors.ClientBackpressureError`.
    """

    def __init__(
        self,
        mp_queue: _PutQueue,
        *,
        signal: int = DEFAULT_SIGNAL,
        write_timeout: float = DEFAULT_WRITE_TIMEOUT,
    ) -> None:
        self._queue = mp_queue
        self._signal = int(signal)
        self.write_timeout = float(write_timeout)

    @property
    def signal(self) -> int:
        """The default signal for timers acquired through this client."""
        return self._signal

    def send(self, request: Request) -> None:
        """Put ``request`` on the queue, blocking at most ``write_timeout`` if it is full."""
        _drive(self._sending(request))

    async def send_async(self, request: Request) -> None:
        """Put ``request`` on the queue, awaiting (not blocking) while it is full."""
        await _drive_async(self._sending(request), shield=request.is_release)

    def _sending(self, request: Request) -> _Steps:
        item = QueueRequest(
            request.pid,
            request.scope_id,
            -1 if request.is_release else request.expiration_time,
            request.signal,
            request.mono,
        )
        started = time.monotonic()
        retry = _RETRY_FIRST
        while True:
            try:
                self._queue.put(item, block=False)
            except _queue.Full:
                waited = time.monotonic() - started
                if waited >= self.write_timeout:
                    raise ClientBackpressureError(
                        f"the timer server's queue stayed full for {self.write_timeout:g}s; "
                        "the server is overloaded or stuck"
                    ) from None
                yield _Sleep(min(retry, self.write_timeout - waited))
                retry = _next_retry(retry)
            else:
                return

    def __repr__(self) -> str:
        return f"<QueueClient {self._queue!r}>"


# -- in-process ---------------------------------------------------------------------------


class RequestSubmitter(Protocol):
    """A server embedded in this process: ``submit`` is thread-safe and never blocks."""

    def submit(self, request: Request) -> None:
        """Apply ``request`` (from any thread)."""
        ...


class InProcessClient:
    """Hand requests straight to a server running in this process (no pipe, no encoding).

    Note that a server never signals its own process: timers of the server's own pid
    are reported when they expire, not reaped.
    """

    def __init__(self, server: RequestSubmitter, *, signal: int = DEFAULT_SIGNAL) -> None:
        self._server = server
        self._signal = int(signal)

    @property
    def signal(self) -> int:
        """The default signal for timers acquired through this client."""
        return self._signal

    def send(self, request: Request) -> None:
        """Submit ``request`` to the embedded server."""
        self._server.submit(request)

    async def send_async(self, request: Request) -> None:
        """Submit ``request`` to the embedded server (never waits)."""
        self._server.submit(request)

    def __repr__(self) -> str:
        return f"<InProcessClient {self._server!r}>"
