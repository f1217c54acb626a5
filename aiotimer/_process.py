"""Process identity: pin a worker once, then signal only that very process.

A pid alone does not name a process: once a worker exits and is reaped, the kernel may
hand its pid to an unrelated process, and a watchdog that signals by pid would hit it.
:class:`WorkerProcess` pins a worker when it is first seen:

* with a **pidfd** (``os.pidfd_open``, Linux >= 5.3): the descriptor refers to that
  process forever. Signals go through it (``signal.pidfd_send_signal``), so a recycled
  pid is never hit, and it becomes readable when the process exits, so the exit can be
  awaited without polling;
* without one, by its **start time** (``/proc/<pid>/stat`` field 22, clock ticks since
  boot): before each signal the pid's current start time must match the pinned one.
  This still leaves the tiny window between the check and ``kill(2)``; only pidfds
  close it.

Where neither exists (no pidfd, no ``/proc``) identity cannot be proven and the pid is
trusted as is.
"""

from __future__ import annotations

import os
import select
import signal
import warnings
from types import TracebackType
from typing import Final

import anyio

from aiotimer.errors import ProcessGoneError, ReapError, RefusedTargetError

__all__ = ["WorkerProcess", "read_start_time"]

_PROC: Final[str] = "/proc"
#: 1-based index of ``starttime`` in ``/proc/<pid>/stat`` (see proc(5)).
_STAT_START_TIME_FIELD: Final[int] = 22
#: Process states that mean "has exited" (zombie, dead).
_EXITED_STATES: Final = frozenset({"Z", "X", "x"})


def _read_stat(pid: int) -> tuple[str, int] | None:
    """``(state, start_time)`` of ``pid`` from ``/proc``, or ``None`` if it does not exist.

    Raises:
        FileNotFoundError: the system has no ``/proc``.
    """
    try:
        with open(f"{_PROC}/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        if not os.path.isdir(_PROC):
            raise
        return None
    # The command name (field 2) is in parentheses and may itself contain ") ", so the
    # fixed fields start after the *last* closing parenthesis, at field 3.
    fields = data[data.rindex(b")") + 2 :].split()
    state = fields[0].decode("ascii")
    return state, int(fields[_STAT_START_TIME_FIELD - 3])


def read_start_time(pid: int) -> int | None:
    """The start time of ``pid`` (clock ticks since boot), or ``None`` without ``/proc``.

    Raises:
        ProcessGoneError: ``/proc`` exists but has no such process, or it has exited
            (a zombie).
    """
    try:
        stat = _read_stat(pid)
    except FileNotFoundError:
        return None
    if stat is None or stat[0] in _EXITED_STATES:
        raise ProcessGoneError(f"no process with pid {pid} (it has exited)")
    return stat[1]


def _open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid``, or ``None`` where the OS has none."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        fd: int = pidfd_open(pid)
    except ProcessLookupError:
        raise ProcessGoneError(f"no process with pid {pid}") from None
    except OSError:
        return None  # ENOSYS (old kernel) or a seccomp filter: fall back to start time
    os.set_inheritable(fd, False)
    return fd


def _fd_readable(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


class WorkerProcess:
    """A pinned worker process: signals reach it, and only it, or fail loudly.

    Create one with :meth:`pin`; release it with :meth:`close` (or use it as a context
    manager). Not thread-safe; :meth:`close` must not run while :meth:`wait_exit` waits.
    """

    __slots__ = ("_closed", "_pid", "_pidfd", "_start_time")

    def __init__(self, pid: int, start_time: int | None, pidfd: int | None) -> None:
        # Private: use pin() (or _from_identity() in tests). Takes ownership of pidfd.
        self._pid = pid
        self._start_time = start_time
        self._pidfd = pidfd
        self._closed = False

    @classmethod
    def pin(cls, pid: int) -> WorkerProcess:
        """Pin the process that has ``pid`` now.

        Raises:
            RefusedTargetError: ``pid <= 0`` (those name process groups, not a process).
            ProcessGoneError: there is no such process, or it has already exited.
        """
        if isinstance(pid, bool) or not isinstance(pid, int):
            raise TypeError(f"pid must be an int, got {type(pid).__name__}")
        if pid <= 0:
            raise RefusedTargetError(f"pid {pid} does not name a single process")
        pidfd = _open_pidfd(pid)
        try:
            start_time = read_start_time(pid)
            # The pidfd pins the process; if it is still running after the stat was read,
            # that stat was this process's and not a successor's.
            if pidfd is not None and _fd_readable(pidfd):
                raise ProcessGoneError(f"process {pid} has exited")
        except BaseException:
            if pidfd is not None:
                os.close(pidfd)
            raise
        return cls(pid, start_time, pidfd)

    @classmethod
    def _from_identity(
        cls, pid: int, start_time: int | None, pidfd: int | None = None
    ) -> WorkerProcess:
        """Build a handle from a recorded identity, without checking it (for tests).

        With ``pidfd=None`` the handle uses the start-time check, so a ``start_time``
        that does not match the live ``pid`` models a recycled pid.
        """
        return cls(pid, start_time, pidfd)

    @property
    def pid(self) -> int:
        """The worker's pid."""
        return self._pid

    @property
    def start_time(self) -> int | None:
        """The pinned start time (``/proc/<pid>/stat`` field 22), or ``None`` without /proc."""
        return self._start_time

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has run."""
        return self._closed

    def fileno(self) -> int | None:
        """The pidfd, or ``None`` where the OS has none (or after :meth:`close`)."""
        return self._pidfd

    def is_alive(self) -> bool:
        """True while this same process exists and has not exited (zombies have exited).

        A recycled pid (another process now) reports False. A closed handle reports False.
        """
        if self._closed:
            return False
        if self._pidfd is not None:
            return not _fd_readable(self._pidfd)
        try:
            stat = _read_stat(self._pid)
        except FileNotFoundError:  # no /proc: the pid is all there is
            try:
                os.kill(self._pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            return True
        if stat is None or stat[0] in _EXITED_STATES:
            return False
        return self._start_time is None or stat[1] == self._start_time

    def send_signal(self, signum: int, *, group: bool = False) -> None:
        """Send ``signum`` to this process, or with ``group=True`` to its process group.

        Raises:
            RefusedTargetError: the target is pid <= 1, this process, or (``group``) this
                process's own group or a group id <= 1.
            ProcessGoneError: the process has exited or its pid now names another process.
            ReapError: the signal could not be sent (e.g. permission denied), or the
                handle is closed.
        """
        pid = self._pid
        if pid <= 1:
            raise RefusedTargetError(f"refusing to signal pid {pid}")
        if pid == os.getpid():
            raise RefusedTargetError(f"refusing to signal the server's own process ({pid})")
        if self._closed:
            raise ReapError(f"the handle of process {pid} is closed")
        if not self.is_alive():
            raise ProcessGoneError(f"process {pid} has exited (or its pid was recycled)")
        try:
            if group:
                pgid = os.getpgid(pid)
                if pgid <= 1 or pgid == os.getpgrp():
                    raise RefusedTargetError(
                        f"refusing to signal process group {pgid} of pid {pid}: "
                        "it is the server's own group or a system group"
                    )
                os.killpg(pgid, signum)
            elif self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, signum)
            else:
                os.kill(pid, signum)
        except ProcessLookupError:
            raise ProcessGoneError(f"process {pid} has exited") from None
        except PermissionError as exc:
            target = "the process group of" if group else "process"
            raise ReapError(f"not permitted to signal {target} {pid}: {exc}") from exc
        except OSError as exc:
            raise ReapError(f"failed to signal process {pid}: {exc}") from exc

    async def wait_exit(self, *, poll_interval: float = 0.5) -> None:
        """Return once the process has exited (a zombie counts as exited).

        Waits on the pidfd when there is one (no polling); otherwise polls
        :meth:`is_alive` every ``poll_interval`` seconds.
        """
        if self._pidfd is not None:
            await anyio.wait_readable(self._pidfd)
            return
        while self.is_alive():
            await anyio.sleep(poll_interval)

    def close(self) -> None:
        """Release the pidfd. Idempotent."""
        if self._closed:
            return
        self._closed = True
        fd, self._pidfd = self._pidfd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        # Like an unclosed file: close it, and warn, since owners must close explicitly.
        if not self._closed and self._pidfd is not None:
            warnings.warn(f"unclosed {self!r}", ResourceWarning, stacklevel=2)
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "alive" if self.is_alive() else "exited"
        return f"<WorkerProcess pid={self._pid} pidfd={self._pidfd} {state}>"
