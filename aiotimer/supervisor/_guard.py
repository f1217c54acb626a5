"""The guard of ``aiotimer run``: what stops a run's processes once its supervisor is
killed (SIGKILL, the OOM killer) and cannot.

:func:`start_guard`, called before the supervisor starts any thread, forks the guard:
its own session, re-parented away from the supervisor (so stopping the supervisor's
children never finds it). Where a cgroup v2 can be made, it makes the run's cgroup
(:class:`~aiotimer._edges.cgroups.RunCgroup`) first, and the supervisor moves itself
into it once the guard is out: everything the run starts is born there, and stays
there whatever its session, group or environment. The guard keeps its end of a link
(:mod:`aiotimer.supervisor._guardlink`) through which the supervisor hands it a pidfd
of every worker as it is launched.

The guard waits for the supervisor's end (its pidfd) while it reads the link. Then:

- a clean stop (the run file is gone): it removes the run's cgroup, killing first
  whatever is still in it (nothing should be) and saying so;
- otherwise (the supervisor died without stopping its workers): it kills the run's
  cgroup (``cgroup.kill``) and waits for it to empty; without a cgroup it stops what
  the pinned workers prove to be theirs
  (:func:`~aiotimer.supervisor._pins.stop_leftovers`). Then it removes the run's
  private runtime directory and its run file, and says on stderr what it stopped.

It never signals a process by its pid number: the cgroup names no pid, and the pidfds
were taken while the run lived. The guard cannot catch orphans as a child subreaper
would: it is no ancestor of the workers (the supervisor is the process that was started
and killed, and the workers must be its descendants); the supervisor itself is the run's
subreaper while it lives.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import threading
from pathlib import Path
from typing import Final

from aiotimer._edges.cgroups import RunCgroup
from aiotimer._edges.files import remove_owned
from aiotimer.supervisor import _guardlink
from aiotimer.supervisor._pins import Pin, close_pins, stop_leftovers
from aiotimer.supervisor._runfile import (
    kill_cgroup,
    read_run_file,
    remove_runtime_dir,
    run_file_name,
    this_process,
)

__all__ = ["start_guard"]

#: The longest the guard waits for the run's cgroup to empty once killed.
CGROUP_EMPTY_TIMEOUT: Final[float] = 10.0
#: What the guard may spend telling stderr what it did (it may be a full pipe).
_REPORT_TIMEOUT: Final[int] = 2
#: The largest message on the link, and the most descriptors one carries.
_MESSAGE: Final[int] = 64


def start_guard(directory: Path) -> str | None:
    """Fork the guard of this process's run (see the module docs), its run file in
    ``directory``. Returns why no guard was started (``None``: started): this process
    has other threads (forking it would be unsafe), or the system has no pidfds; the
    run then relies on the next run's sweep.

    Call it before starting any thread or event loop. Where a cgroup v2 can be made,
    this process is in the run's cgroup when it returns.

    Raises:
        OSError: the guard cannot be forked.
    """
    if threading.active_count() > 1:
        return "this process has other threads"
    me = this_process()
    try:
        watch = os.pidfd_open(me.pid)
    except (AttributeError, OSError) as exc:
        return f"no pidfd to watch this process with ({exc})"
    try:
        cgroup: RunCgroup | None = RunCgroup.make(f"{me.pid}-{me.start_time}")
    except OSError:
        cgroup = None  # not here (no cgroup v2, not writable): the guard goes without
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        child = os.fork()
        if child == 0:  # pragma: no cover  (runs in the forked guard)
            code = 1
            try:
                os.setsid()
                if os.fork() == 0:
                    ours.close()
                    _guard(watch, theirs, directory / run_file_name(me), cgroup)
                code = 0
            finally:
                os._exit(code)
        os.waitpid(child, 0)
    except BaseException:
        ours.close()
        if cgroup is not None:
            cgroup.remove()
        raise
    finally:
        os.close(watch)
        theirs.close()
    entered = ""
    if cgroup is not None:
        with contextlib.suppress(OSError):  # not ours to enter: the guard removes it
            cgroup.enter()
            entered = str(cgroup.path)
    link = _guardlink.GuardLink(ours, entered)
    _guardlink.install(link)
    if entered:
        link.entered_cgroup()
    return None


class _Pins:
    """What the guard was told over the link."""

    def __init__(self) -> None:
        self.workers: dict[int, list[Pin]] = {}
        self.entered = False
        self.closed = False

    def receive(self, sock: socket.socket) -> None:
        """Take every message waiting on ``sock``, without blocking."""
        while not self.closed:
            try:
                data, fds, _, _ = socket.recv_fds(sock, _MESSAGE, _MESSAGE, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError:
                data, fds = b"", []
            if not data:
                self.closed = True  # the supervisor's end is closed
            try:
                kept = self._apply(data, fds)
            except ValueError:  # not a message of ours: ignored
                kept = set()
            for fd in fds:
                if fd not in kept:
                    os.close(fd)

    def _apply(self, data: bytes, fds: list[int]) -> set[int]:
        if data == b"c":
            self.entered = True
        elif data[:1] == b"+" and len(fds) == 1:
            pid, start = (int(x) for x in data[1:].split())
            self.workers.setdefault(pid, []).append(Pin(pid, start, fds[0]))
            return {fds[0]}
        elif data[:1] == b"-" and (pins := self.workers.get(int(data[1:]))):
            close_pins([pins.pop(0)])
        return set()

    def all(self) -> list[Pin]:
        return [p for pins in self.workers.values() for p in pins]


def _guard(
    watch: int, sock: socket.socket, path: Path, cgroup: RunCgroup | None
) -> None:  # pragma: no cover  (runs in the forked guard)
    """The guard's body: wait for the supervisor's end, stop what its run left."""
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    told = _Pins()
    poller = select.poll()
    poller.register(watch, select.POLLIN)
    poller.register(sock, select.POLLIN)
    while True:
        ready = {fd for fd, _ in poller.poll()}
        if sock.fileno() in ready:
            told.receive(sock)
            if told.closed:
                poller.unregister(sock)
        if watch in ready:
            break
    told.receive(sock)  # what the supervisor said before it ended
    run = cgroup if cgroup is not None and told.entered else None
    try:
        record = read_run_file(path)
        if isinstance(record, str):  # a clean stop removed it (or it was never written)
            if run is not None and run.populated():
                killed, errors = kill_cgroup(run, CGROUP_EMPTY_TIMEOUT)
                _report(
                    f"aiotimer run guard: the run stopped, but {len(killed)} process(es) "
                    f"of it were left: stopped them: pids {', '.join(map(str, killed))}\n",
                    errors,
                )
            elif cgroup is not None:
                cgroup.remove()
            return
        if run is not None:
            killed, errors = kill_cgroup(run, CGROUP_EMPTY_TIMEOUT)
        else:
            killed, errors = stop_leftovers(told.all(), record.fifo)
            if cgroup is not None:
                cgroup.remove()
        remove_runtime_dir(record)
        with contextlib.suppress(OSError):
            remove_owned(path, what="run file")
        if killed or errors:
            _report(
                f"aiotimer run guard: supervisor {record.supervisor.pid} died without "
                f"stopping its workers; stopped {len(killed)} process(es) they left: pids "
                f"{', '.join(map(str, killed))}\n",
                errors,
            )
    except Exception as exc:  # say it, then end: nothing else can
        _report(f"aiotimer run guard: could not stop the leftovers of {path}: {exc}\n", [])
    finally:
        close_pins(told.all())


class _TimedOut(Exception):
    pass


def _time_out(signum: int, frame: object) -> None:  # pragma: no cover  (in the guard)
    raise _TimedOut


def _report(line: str, errors: list[str]) -> None:  # pragma: no cover  (in the guard)
    """Write ``line`` and ``errors`` to stderr, giving up after a while (nobody may
    read it)."""
    text = line + "".join(f"aiotimer run guard: {e}\n" for e in errors)
    signal.signal(signal.SIGALRM, _time_out)
    signal.alarm(_REPORT_TIMEOUT)
    with contextlib.suppress(OSError, _TimedOut):
        os.write(2, text.encode())
    signal.alarm(0)
