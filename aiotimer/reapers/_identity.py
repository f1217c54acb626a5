"""Process identity: pin a worker once, then signal only that very process.

A pid alone does not name a process: once a worker exits and is reaped, the kernel may
hand its pid to an unrelated process, and a watchdog that signals by pid would hit it.
:class:`PinnedProcess` pins a worker when it is first seen:

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

Only a **thread-group leader** can be a worker: a thread id names a thread, and
``kill(tid, ...)`` would take its whole process (the server's own, when the tid is one of
the server's threads). ``pidfd_open`` refuses a thread id with ``EINVAL``; that is a
refusal, never a reason to fall back to the start time, and without pidfds ``Tgid``
in ``/proc/<pid>/status`` must equal the pid.

A request may carry the start time its sender had when it **sent** the request
(``start_time`` on the wire). :meth:`PinnedProcess.pin` compares it with the process
that has the pid when the request is *read*: if the sender died and its pid was reused
in between, the start times differ and the new process is not pinned.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import warnings
from types import TracebackType

import anyio

from aiotimer._edges.procfs import EXITED_STATES, ancestors, read_start_time, read_stat, read_status
from aiotimer.errors import ProcessGoneError, ReapError, RefusedTargetError
from aiotimer.reapers._kill_policy import ServerIdentity, Target

__all__ = [
    "PinnedProcess",
    "server_identity",
]


def server_identity() -> ServerIdentity:
    """This process as the kill policy sees it (read afresh: ancestors can change)."""
    pid = os.getpid()
    return ServerIdentity(pid, os.geteuid(), os.getpgrp(), frozenset(ancestors(pid)))


def _open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid``, or ``None`` where the OS has none.

    Raises:
        ProcessGoneError: there is no such process.
        RefusedTargetError: ``pid`` is a thread id, not a process.
    """
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        fd: int = pidfd_open(pid)
    except ProcessLookupError:
        raise ProcessGoneError(f"no process with pid {pid}") from None
    except OSError as exc:
        # A thread id: EINVAL (up to Linux 6.8), ENOENT (since). Never a reason to fall
        # back to the start time, which /proc/<tid>/stat has too.
        if exc.errno == errno.EINVAL:
            raise _not_a_process(pid) from None
        if exc.errno == errno.ENOENT:
            _check_leader(pid)
            raise ProcessGoneError(f"no process with pid {pid}") from None
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            raise  # out of descriptors: the server's failure, never a weaker identity
        return None  # ENOSYS (old kernel) or a seccomp filter: fall back to start time
    os.set_inheritable(fd, False)
    return fd


def _not_a_process(pid: int) -> RefusedTargetError:
    try:
        status = read_status(pid)
    except FileNotFoundError:
        status = None
    owner = f" of process {status.tgid}" if status is not None and status.tgid != pid else ""
    return RefusedTargetError(
        f"refusing pid {pid}: it is a thread{owner}, not a thread-group leader, and "
        "signalling it would take its whole process"
    )


def _check_leader(pid: int) -> None:
    """Refuse a thread id (``Tgid != pid``); a no-op without ``/proc``."""
    try:
        status = read_status(pid)
    except FileNotFoundError:
        return
    if status is None:
        raise ProcessGoneError(f"no process with pid {pid} (it has exited)")
    if status.tgid != pid:
        raise _not_a_process(pid)


def _fd_readable(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


class PinnedProcess:
    """A pinned process identity (a worker's, or any process the supervisor stops):
    signals reach that very process, and only it, or fail loudly.

    Create one with :meth:`pin` (the constructor takes an identity as recorded, without
    checking it); release it with :meth:`close` (or use it as a context manager). Not
    thread-safe; :meth:`close` must not run while :meth:`wait_exit` waits.
    """

    __slots__ = ("_closed", "_pid", "_pidfd", "_start_time")

    def __init__(self, pid: int, start_time: int | None, pidfd: int | None = None) -> None:
        """A handle for an identity already recorded, *unchecked*: :meth:`pin` is how a
        live process is pinned. Takes ownership of ``pidfd``.

        Without a ``pidfd`` the handle proves identity by ``start_time`` before each
        signal (a ``start_time`` that does not match the live ``pid`` is a recycled pid,
        refused); with neither, the pid is trusted as is.

        Args:
            pid: the worker's pid.
            start_time: its start time (``/proc/<pid>/stat`` field 22), or ``None``.
            pidfd: a pidfd of that very process, or ``None``.
        """
        self._pid = pid
        self._start_time = start_time
        self._pidfd = pidfd
        self._closed = False

    @classmethod
    def pin(cls, pid: int, *, start_time: int | None = None) -> PinnedProcess:
        """Pin the process that has ``pid`` now.

        ``start_time``, when given, is the start time the worker reported when it sent
        its request: a process with another start time is a successor that got the
        worker's pid, and is not pinned.

        Raises:
            RefusedTargetError: ``pid <= 0`` (those name process groups, not a process)
                or ``pid`` is a thread id rather than a process's (thread-group leader's).
            ProcessGoneError: there is no such process, it has already exited, or its
                start time differs from ``start_time`` (the pid was reused).
        """
        if isinstance(pid, bool) or not isinstance(pid, int):
            raise TypeError(f"pid must be an int, got {type(pid).__name__}")
        if pid <= 0:
            raise RefusedTargetError(f"pid {pid} does not name a single process")
        pidfd = _open_pidfd(pid)
        try:
            _check_leader(pid)
            actual = read_start_time(pid)
            if start_time is not None and actual is not None and actual != start_time:
                raise ProcessGoneError(
                    f"pid {pid} now names another process (start time {actual}, not the "
                    f"{start_time} its request was sent with): the worker has exited"
                )
            # The pidfd pins the process; if it is still running after the stat was read,
            # that stat was this process's and not a successor's.
            if pidfd is not None and _fd_readable(pidfd):
                raise ProcessGoneError(f"process {pid} has exited")
        except BaseException:
            if pidfd is not None:
                os.close(pidfd)
            raise
        return cls(pid, actual, pidfd)

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
            stat = read_stat(self._pid)
        except FileNotFoundError:  # no /proc: the pid is all there is
            try:
                os.kill(self._pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            return True
        if stat is None or stat[0] in EXITED_STATES:
            return False
        return self._start_time is None or stat[1] == self._start_time

    def target(self, server_pid: int, *, ancestry: bool = True) -> Target:
        """The facts a kill policy judges this worker by (read now, from ``/proc``).

        ``server_pid`` is the process whose descendants count as descendants; with
        ``ancestry=False`` that walk up the process tree (a ``/proc`` read per
        ancestor) is skipped and ``descendant`` is ``None`` (unknown).
        """
        pid = self._pid
        descendant: bool | None = None
        try:
            status = read_status(pid)
            if ancestry:
                descendant = server_pid in ancestors(pid)
        except FileNotFoundError:  # no /proc: unknown
            status = None
        try:
            pgid: int | None = os.getpgid(pid)
        except OSError:
            pgid = None
        uid = None if status is None else status.uid
        return Target(pid, registered=not self._closed, uid=uid, descendant=descendant, pgid=pgid)

    def send_signal(self, signum: int, *, group: bool = False) -> None:
        """Send ``signum`` to this process, or with ``group=True`` to its process group.

        Raises:
            RefusedTargetError: the target is pid <= 1, this process, or (``group``) this
                process's own group or a group id <= 1.
            ProcessGoneError: the process has exited or its pid now names another process.
            RefusedTargetError: also when the kernel refuses for good (``EPERM``,
                ``EINVAL``): retrying cannot help.
            ReapError: the signal could not be sent this time, or the handle is closed.
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
            raise RefusedTargetError(
                f"not permitted to signal {target} {pid} (permanent, not retried): {exc}"
            ) from exc
        except OSError as exc:
            if exc.errno == errno.EINVAL:  # no such signal: retrying cannot help
                raise RefusedTargetError(
                    f"cannot send signal {signum} to process {pid} (permanent, not retried): {exc}"
                ) from exc
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

    def __enter__(self) -> PinnedProcess:
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
        return f"<PinnedProcess pid={self._pid} pidfd={self._pidfd} {state}>"
