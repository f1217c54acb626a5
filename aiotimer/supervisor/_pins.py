"""Stop a dead run's leftovers by what was pinned, never by a pid number alone.

Once a run's supervisor is gone, a pid number names whatever process has it now: a
worker that died and was reaped may have handed its pid to any process, which may
then lead a new session or process group of that number. So the run's guard and the
next run's sweep (:mod:`aiotimer.supervisor._runfile`) act only through **pins**: pidfds
(``os.pidfd_open``), each of which names one process for good, taken while that
process was known to be the run's (the guard's: by the supervisor at launch; the
sweep's: of a worker still alive with its recorded start time).

:func:`stop_leftovers` ends, in rounds until a round finds nothing left:

- every pinned worker's **process group**, through the worker's pidfd
  (``pidfd_send_signal(..., PIDFD_SIGNAL_PROCESS_GROUP)``, Linux >= 6.9): the kernel
  signals the group *object* that worker made, not a group of that number, and a group
  signal reaches a process forking meanwhile and its child too. It reaches the group's
  members even after the worker itself is dead and reaped; a group emptied once is never
  refilled (nobody can join a group that has no member);
- each process found in a pinned worker's session or group (by number, in ``/proc``),
  pinned itself first, then **proven** the run's by what the pins say after its
  ``/proc`` entry was read: its group still has a member (then the number was still
  that group's when it was read), or a pinned member of its session (the worker, or a
  process proven earlier) still shows that session and is not yet reaped (nobody can
  join a session either), or its own environment names the run's FIFO and it started
  after the worker. It is signalled through its own pidfd (and its group through it,
  when it leads one).

What no pin proves is left alone: a process that left its worker's group with
``setpgid()`` after every pinned member of its session was reaped, one that left the
session with ``setsid()``, one that scrubbed its environment. A run's cgroup
(:mod:`aiotimer._edges.cgroups`) reaches those; this is what works without one.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from aiotimer.supervisor._proctree import ProcInfo, proc_info, processes

__all__ = ["Pin", "close_pins", "pin", "signal_group", "stop_leftovers", "unreaped"]

logger = logging.getLogger("aiotimer")

#: ``pidfd_send_signal`` flag: signal the process group the pidfd's process leads.
PIDFD_SIGNAL_PROCESS_GROUP: Final[int] = 4
#: How many rounds :func:`stop_leftovers` looks again for processes forked meanwhile.
ROUNDS: Final[int] = 20
#: The longest a round waits for what it signalled to exit.
SETTLE: Final[float] = 0.1
_FIFO_VAR: Final[bytes] = b"AIOTIMER_FIFO="


@dataclass(frozen=True, slots=True)
class Pin:
    """A pinned process: its pid (a label), its start time and its pidfd (the name)."""

    pid: int
    start_time: int
    fd: int


def unreaped(fd: int) -> bool:
    """Whether the pidfd's process is not yet reaped (alive, or a zombie): while it is,
    its pid, session and group numbers are its own and nobody else's."""
    try:
        signal.pidfd_send_signal(fd, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists; only signalling it is not ours
    return True


def signal_group(fd: int, signum: int) -> bool | None:
    """Send ``signum`` to the process group the pidfd's process made (see the module
    docs): ``True`` if a member got it (``signum`` 0: the group has a member), ``False``
    if it has none left, ``None`` where the kernel cannot (Linux < 6.9).

    Raises:
        PermissionError: members that are not ours to signal.
        OSError: another failure.
    """
    try:
        signal.pidfd_send_signal(fd, signum, None, PIDFD_SIGNAL_PROCESS_GROUP)
    except ProcessLookupError:
        return False
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return None
        raise
    return True


def pin(pid: int, start_time: int | None = None) -> tuple[Pin, ProcInfo] | None:
    """Pin the process that has ``pid`` now, with what ``/proc`` showed of it while it
    was pinned; ``None`` if there is none, it has exited, or (``start_time``) it is
    not the process that started then.

    Raises:
        OSError: out of descriptors.
    """
    try:
        fd = os.pidfd_open(pid)
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            raise
        return None
    info = proc_info(pid)
    # Read after the pidfd was opened; the process not reaped after the read: the read
    # was of the pinned process, not of a successor that got its pid.
    if (
        info is None
        or info.exited
        or (start_time is not None and info.start_time != start_time)
        or not unreaped(fd)
    ):
        os.close(fd)
        return None
    return Pin(pid, info.start_time, fd), info


def close_pins(pins: Iterable[Pin]) -> None:
    """Close the pins' pidfds."""
    for p in pins:
        with contextlib.suppress(OSError):
            os.close(p.fd)


def _environ_names(pid: int, fifo: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read(1 << 20)
    except OSError:
        return False
    return _FIFO_VAR + fifo in data.split(b"\0")


def _in_session(members: Sequence[Pin], sid: int) -> bool:
    """A pinned member of session ``sid`` still shows it, and is not reaped after that."""
    for member in members:
        info = proc_info(member.pid)
        if info is not None and info.sid == sid and unreaped(member.fd):
            return True
    return False


def _wait_exit(pins: Sequence[Pin], timeout: float) -> None:
    """Wait until every pin's process has exited, at most ``timeout`` seconds."""
    poller = select.poll()
    left = {p.fd for p in pins}
    for fd in left:
        poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + timeout
    while left and (wait := deadline - time.monotonic()) > 0:
        for fd, _ in poller.poll(wait * 1000):
            poller.unregister(fd)
            left.discard(fd)


def stop_leftovers(
    workers: Sequence[Pin],
    fifo: str,
    *,
    unpinned: Mapping[int, int] | None = None,
    rounds: int = ROUNDS,
    settle: float = SETTLE,
) -> tuple[list[int], list[str]]:
    """SIGKILL what is proven to be left by ``workers`` (see the module docs), looking
    again until a round finds nothing (they may fork meanwhile), at most ``rounds``
    times. Returns the pids signalled and one line per failure.

    ``workers`` are pins of the run's workers (each led its own session and group);
    ``unpinned`` the pid and start time of workers that could not be pinned (dead: only
    what names ``fifo``, the run's FIFO, in its own environment is proven theirs). The
    pins stay the caller's; the others are closed.
    """
    leaders = {w.pid: w for w in workers}
    starts = {**(unpinned or {}), **{w.pid: w.start_time for w in workers}}
    sessions = {w.pid: [w] for w in workers}  # pinned members of each worker's session
    fifo_bytes = os.fsencode(fifo)
    held: dict[int, Pin] = {}  # processes pinned so far (not the workers)
    killed: set[int] = set()
    errors: list[str] = []
    try:
        for _ in range(rounds):
            found = _look(starts, leaders, held)
            if not found:
                break
            # Proven after every read above (see the module docs), before any signal.
            groups = {w.pid: _has_members(w) for w in workers}
            proven = []  # (process, what /proc showed, reached by its group's signal)
            for proc, info in found:
                if groups.get(info.pgid):
                    proven.append((proc, info, True))
                elif (info.sid in sessions and _in_session(sessions[info.sid], info.sid)) or (
                    _claims_run(proc, info, starts, fifo_bytes)
                ):
                    proven.append((proc, info, False))
            if not proven:
                break
            for w in workers:
                if groups[w.pid]:
                    _send(w.pid, errors, signal_group, w.fd, signal.SIGKILL)
            for proc, info, by_group in proven:
                killed.add(proc.pid)
                if by_group:
                    continue
                _send(proc.pid, errors, signal.pidfd_send_signal, proc.fd, signal.SIGKILL)
                if info.pgid == proc.pid:  # it leads a group of its own: that group too
                    _send(proc.pid, errors, signal_group, proc.fd, signal.SIGKILL)
                if info.sid in sessions and proc not in sessions[info.sid]:
                    sessions[info.sid].append(proc)
            _wait_exit([proc for proc, _, _ in proven], settle)
    finally:
        close_pins(held.values())
    return sorted(killed), errors


def _look(
    starts: Mapping[int, int], leaders: Mapping[int, Pin], held: dict[int, Pin]
) -> list[tuple[Pin, ProcInfo]]:
    """The live processes in a worker's session or group (by number: ``starts``' keys),
    each pinned (a pin taken before is reused while its process is not reaped)."""
    me = os.getpid()
    found = []
    for p in processes():
        if p.exited or p.pid == me or (p.sid not in starts and p.pgid not in starts):
            continue
        old = held.get(p.pid) or leaders.get(p.pid)
        if old is not None and unreaped(old.fd):
            info = proc_info(p.pid)
            if info is not None and not info.exited and unreaped(old.fd):
                found.append((old, info))
            continue
        if (stale := held.pop(p.pid, None)) is not None:
            close_pins([stale])  # reaped: its pid is another process's now
        pinned = pin(p.pid)
        if pinned is not None:
            held[p.pid] = pinned[0]
            found.append(pinned)
    return found


def _has_members(worker: Pin) -> bool:
    try:
        return bool(signal_group(worker.fd, 0))
    except PermissionError:
        return True


def _claims_run(proc: Pin, info: ProcInfo, starts: Mapping[int, int], fifo: bytes) -> bool:
    """Its own environment names the run's FIFO, and it started after its worker."""
    start = starts.get(info.sid, starts.get(info.pgid))
    return (
        start is not None
        and info.start_time >= start
        and _environ_names(proc.pid, fifo)
        and unreaped(proc.fd)
    )


def _send(pid: int, errors: list[str], send: Callable[[int, int], object], *args: int) -> None:
    try:
        send(*args)
    except ProcessLookupError:
        pass
    except OSError as exc:
        errors.append(f"could not stop process {pid} (or its group): {exc}")
