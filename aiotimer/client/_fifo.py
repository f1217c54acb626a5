"""The FIFO transport: requests into the named pipe of ``aiotimer serve`` or of torch's
``FileTimerServer``.

How it works:

* **Which server** (:mod:`aiotimer.client._fifo_peer`): an aiotimer server (its marker
  beside the FIFO) gets one persistent descriptor, to the FIFO or to the server's Unix
  socket, and the ``mono`` extension; any other reader torch's exact bytes, with an
  open, a write and a close per request.
* **The fast path** (:mod:`aiotimer.client._fifo_blocks`, :meth:`FifoClient.send_nowait`
  by a request's fields): with the descriptor open and room in the pipe, a request is one
  ``os.write`` under a lock. An acquire of this process encodes both lines of its block
  at once (:func:`~aiotimer.wire.block_encoder`), so the release line is ready when the
  block ends. An acquire due in less than the
  server's ``bell_lead`` also rings its bell (:mod:`aiotimer.client._fifo_link`), so a
  server pacing a trickle reads it at once. When the server's marker asks for it
  (``stamps``), both lines of a block end with the ``at`` extension (:func:`stamped`):
  when the block began and ended, on the worker's monotonic clock. A learned block's
  lines always do (the server learns from its real duration, whatever its read pace).
* **The slow path** (:meth:`FifoClient._sending`, driven blocking or awaiting): connect,
  retry while no server reads, reopen after a broken pipe, wait for room in a full pipe.
* **Replay.** The client remembers the acquire line of every open block it delivered
  (an acquire that failed is forgotten); its link to the server
  (:mod:`aiotimer.client._fifo_link`) re-sends them before anything else when it
  reconnects to a new server (a broken pipe, or a new marker, checked at most every
  ``marker_check_interval`` seconds on an acquire), because a new server starts empty;
  it also retries, from a background thread, a release that found the pipe full.
"""

from __future__ import annotations

import math
import os
import time
import weakref
from dataclasses import dataclass
from typing import Final

import msgspec

from aiotimer._edges.procfs import own_start_time
from aiotimer.client._fifo_blocks import FifoBlocks, learned_ended, stamped
from aiotimer.client._fifo_link import FifoLink
from aiotimer.client._fifo_peer import (
    BROKEN_ERRNOS,
    NO_READER_ERRNOS,
    torch_request,
    unavailable_message,
)
from aiotimer.client._transport import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_SIGNAL,
    DEFAULT_WRITE_TIMEOUT,
    RETRY_FIRST,
    Sleep,
    Steps,
    Writable,
    client_signal,
    delivered_late,
    drive,
    drive_async,
    next_retry,
)
from aiotimer.errors import ClientBackpressureError, ServerUnavailableError
from aiotimer.wire import Request, encode, fits_block_encoder

__all__ = ["FifoClient", "stamped"]

#: How many times in a row a broken pipe (server gone) triggers an immediate reopen.
_MAX_REOPENS: Final[int] = 3
_monotonic: Final = time.monotonic


_live_fifo_clients: weakref.WeakSet[FifoClient] = weakref.WeakSet()


# Why one attempt to write did not complete (see FifoClient._attempt; None: it did).
@dataclass(frozen=True, slots=True)
class _NoReader:
    error: OSError


@dataclass(frozen=True, slots=True)
class _Full:
    dup_fd: int


@dataclass(frozen=True, slots=True)
class _Broken:
    error: OSError


_Outcome = _NoReader | _Full | _Broken


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
      at most every ``marker_check_interval`` seconds, when an acquire is sent) → reopen
      at once, then re-send the acquires of every block still open in this process (the
      new server starts empty) before the request itself; a marker gone means the
      aiotimer server left: the descriptor is closed and the client talks torch's way;
    * full pipe (``EAGAIN``) → wait for room up to ``write_timeout`` seconds (``send``
      polls, ``send_async`` awaits writability), then
      :class:`~aiotimer.errors.ClientBackpressureError`; a release that failed so is
      still written before anything else and by a background thread once there is room,
      while the same server is there;
    * an acquire that raised is forgotten (never replayed); one that had to wait is sent
      with its deadline moved later by the wait.

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
        self._signal = client_signal(signal)
        self.connect_timeout = float(connect_timeout)
        self.write_timeout = float(write_timeout)
        #: At most this often (seconds), an acquire also checks that the server that
        #: published the marker is still the one reading (see the class docstring).
        self.marker_check_interval = 1.0
        # Live blocks: scope -> (acquire line, release line). The acquire lines are
        # replayed after a restart; the release line is ready for the block's exit.
        open_scopes: dict[str, tuple[bytes, bytes]] = {}
        # The persistent descriptor (aiotimer server only) and what goes out first.
        self._link = FifoLink(self._path, open_scopes)
        # This process's encoders, its open blocks and the fast path through them.
        self._blocks = FifoBlocks(
            self._link, open_scopes, self._signal, os.getpid(), own_start_time()
        )
        #: The fast path a block takes directly, unless a subclass replaced
        #: ``send_nowait`` (whose calls must then all go through it).
        self._block_nowait = (
            self._blocks if type(self).send_nowait is FifoClient.send_nowait else None
        )
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
        return self._link.fd is not None

    def send(self, request: Request) -> None:
        """Deliver ``request``, blocking at most ``connect_timeout + write_timeout``.

        Raises:
            ServerUnavailableError: no server read the FIFO within ``connect_timeout``,
                the path is not the server's FIFO, or the server keeps closing it.
            ClientBackpressureError: the pipe stayed full for ``write_timeout`` (a
                release is then retried in the background, see the class docs).
        """
        if not self._send_request_nowait(request):
            drive(self._sending(request))

    async def send_async(self, request: Request) -> None:
        """Deliver ``request``; waits are awaited (releases are shielded from
        cancellation). Raises as :meth:`send` does."""
        if not self._send_request_nowait(request):
            await drive_async(self._sending(request), shield=request.is_release)

    def send_nowait(  # noqa: PLR0917 (positional: the hot path)
        self,
        scope_id: str,
        expiration_time: float,
        signal: int | None = None,
        mono: float | None = None,
        dump: bool = False,
        kill_after: float = 0.0,
        cancelled: bool = False,
    ) -> bool:
        """This process's request for ``scope_id`` (see :class:`~aiotimer.TimerClient`),
        with one ``os.write`` if nothing needs a wait: the persistent descriptor is open,
        nothing is queued before it, the marker is not due for a check (acquires only)
        and the pipe has room. ``False``: nothing was written; :meth:`send` or
        :meth:`send_async` will.

        A delivered acquire's block is remembered for replay, with both its lines
        encoded at once (the release line is ready for the block's end; a block
        ``cancelled`` at its deadline ends with a release line that says so); a release
        forgets its block whether or not it is delivered.
        """
        if expiration_time < 0:  # a release: it forgets its block
            return self._blocks.release(scope_id, cancelled)
        if mono is None:
            return False
        return self._blocks.acquire(
            scope_id, expiration_time, mono, _monotonic(), signal, dump, kill_after
        )

    def close(self) -> None:
        """Close the persistent descriptor, if any (the client reconnects on next use)."""
        link = self._link
        with link.lock:
            link.close_locked()

    def __enter__(self) -> FifoClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "persistent" if self._link.fd is not None else "per-request"
        return f"<FifoClient {self._path!r} {mode}, {len(self._blocks.open_scopes)} open scopes>"

    # -- internals --------------------------------------------------------------------

    def _send_request_nowait(self, request: Request) -> bool:
        """:meth:`send_nowait` for ``request``, if it is one (a request of this process
        with no other extension): what ``send`` tries first."""
        if request.pid != self._blocks.pid or not fits_block_encoder(request):
            return False
        if request.is_release:
            return (
                request.signal == 0
                and not request.dump
                and self.send_nowait(request.scope_id, -1, 0, None, False, 0.0, request.cancelled)
            )
        return self.send_nowait(
            request.scope_id,
            request.expiration_time,
            request.signal,
            request.mono,
            request.dump,
            request.kill_after or 0.0,
        )

    def _block_lines(self, request: Request) -> tuple[bytes, bytes]:
        """The acquire line of ``request`` and the release line of its block."""
        mono = request.mono
        blocks = self._blocks
        if mono is not None and request.pid == blocks.pid and fits_block_encoder(request):
            encoder = blocks.encoder(request.signal, request.dump, request.kill_after or 0.0)
            return encoder(request.scope_id, request.expiration_time, mono)
        if request.pid == blocks.pid and request.start_time is None:  # as the fast path does
            request = msgspec.structs.replace(request, start_time=blocks.start_time)
        return encode(request), encode(Request(request.pid, request.scope_id, -1, 0))

    def _sending(self, request: Request) -> Steps:
        """The whole sending logic; yields what it must wait for (see the module docstring)."""
        started = time.monotonic()
        retry = RETRY_FIRST
        reopens = 0
        waited = False
        while True:
            # Waiting for the server is not counted against the block (TimerClient).
            now = request if not waited else delivered_late(request, time.monotonic() - started)
            with self._link.lock:
                outcome = self._attempt(now)
            if outcome is None:
                return
            if isinstance(outcome, _Broken):
                reopens += 1
                if reopens > _MAX_REOPENS:
                    raise ServerUnavailableError(
                        f"the timer server's FIFO {self._path!r} keeps closing "
                        f"({outcome.error.strerror}); is the server restarting in a loop?"
                    ) from outcome.error
                continue
            waited = True
            if isinstance(outcome, _NoReader):
                elapsed = time.monotonic() - started
                if elapsed >= self.connect_timeout:
                    raise ServerUnavailableError(
                        unavailable_message(self._path, outcome.error, elapsed)
                    )
                yield Sleep(min(retry, self.connect_timeout - elapsed))
                retry = next_retry(retry)
                continue
            try:
                remaining = self.write_timeout - (time.monotonic() - started)
                ready = remaining > 0 and (yield Writable(outcome.dup_fd, remaining))
            finally:
                os.close(outcome.dup_fd)
            if not ready and time.monotonic() - started >= self.write_timeout:
                if request.is_release:
                    self._link.retry_release(encode(request))
                raise ClientBackpressureError(
                    f"the timer server's FIFO {self._path!r} stayed full for "
                    f"{self.write_timeout:g}s; the server is overloaded or stuck "
                    "(raise write_timeout, or check the server)"
                    + ("; the release is retried in the background" if request.is_release else "")
                )

    def _attempt(self, request: Request) -> _Outcome | None:
        """Try once to write what is queued, then ``request``; on success an acquire's
        block is remembered for replay. Holds the link's lock."""
        link = self._link
        if link.fd is not None:
            link.recheck_locked(self.marker_check_interval)
        if link.fd is None:
            try:
                fd = link.open_locked(self.marker_check_interval)
            except OSError as exc:
                if exc.errno in NO_READER_ERRNOS:
                    return _NoReader(exc)
                raise ServerUnavailableError(
                    f"cannot open the timer server's FIFO {self._path!r}: {exc.strerror}"
                ) from exc
            persistent = link.fd is not None
        else:
            fd, persistent = link.fd, True
        lines = None if request.is_release else self._block_lines(request)
        try:
            if persistent:
                link.write_backlog_locked(fd)
                line = encode(request) if lines is None else lines[0]
                if request.at is None and (link.stamps or self._learned(request)):
                    line = stamped(line, _monotonic())
                os.write(fd, line)
                lead = math.inf if lines is None else _lead(request)
                if lead < link.bell_lead:
                    link.ring_locked(lead, _monotonic())
            else:
                os.write(fd, encode(torch_request(request)))
        except BlockingIOError:
            if persistent:  # the pipe is full: a paced reader reads at once, not in 2 s
                link.ring_locked(0.0, _monotonic())
            return _Full(os.dup(fd))
        except OSError as exc:
            if exc.errno not in BROKEN_ERRNOS:
                raise ServerUnavailableError(
                    f"cannot write to the timer server's FIFO {self._path!r}: {exc.strerror}"
                ) from exc
            if persistent:
                link.close_locked()
            return _Broken(exc)
        finally:
            if not persistent:
                os.close(fd)
        if lines is not None:
            self._blocks.open_scopes[request.scope_id] = lines
        return None

    def _learned(self, request: Request) -> bool:
        """Whether ``request`` is a line of a learned block (always stamped)."""
        if request.learned is not None:
            self._blocks.learned_scopes.add(request.scope_id)
            return True
        return request.is_release and learned_ended(self._blocks.learned_scopes, request.scope_id)

    def _after_fork_in_child(self) -> None:
        self._blocks.reset(os.getpid(), own_start_time())  # the parent's blocks are not its
        self._link.reset_in_child()


def _lead(request: Request) -> float:
    """Seconds from now to the deadline of the acquire ``request``."""
    if request.mono is not None:
        return request.mono - _monotonic()
    return request.expiration_time - time.time()


def _reset_fifo_clients_in_child() -> None:
    for client in list(_live_fifo_clients):
        client._after_fork_in_child()


os.register_at_fork(after_in_child=_reset_fifo_clients_in_child)
