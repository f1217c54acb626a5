"""What ``/proc`` says about a process (see proc(5)): its state and start time, its status
(thread group, parent, uid) and its ancestors. Light enough for the worker-side import."""

from __future__ import annotations

import functools
import os
from typing import Final, NamedTuple

from aiotimer.errors import ProcessGoneError

__all__ = [
    "EXITED_STATES",
    "ProcStatus",
    "ancestors",
    "boot_id",
    "is_descendant",
    "own_start_time",
    "parse_stat",
    "read_start_time",
    "read_stat",
    "read_status",
    "stat_fields",
]

#: 1-based index of ``starttime`` in ``/proc/<pid>/stat``.
_START_TIME_FIELD: Final[int] = 22
_PROC: Final[str] = "/proc"
_BOOT_ID: Final[str] = "/proc/sys/kernel/random/boot_id"
#: Process states that mean "has exited" (zombie, dead).
EXITED_STATES: Final = frozenset({"Z", "X", "x"})


def stat_fields(data: bytes) -> list[bytes]:
    """The fields of a ``/proc/<pid>/stat`` file from field 3 (``state``) on.

    The command name (field 2) is in parentheses and may itself contain ``") "``, so the
    fixed fields start after the *last* closing parenthesis.
    """
    return data[data.rindex(b")") + 2 :].split()


def parse_stat(data: bytes) -> tuple[str, int]:
    """``(state, start_time)`` from the contents of a ``/proc/<pid>/stat`` file."""
    fields = stat_fields(data)
    return fields[0].decode("ascii"), int(fields[_START_TIME_FIELD - 3])


def own_start_time() -> int | None:
    """This process's start time (clock ticks since boot), or ``None`` without ``/proc``.

    A client sends it with each acquire, so the server never pins a process that got
    this pid after this one died.
    """
    try:
        with open("/proc/self/stat", "rb") as f:
            return parse_stat(f.read())[1]
    except OSError:
        return None


@functools.cache
def boot_id() -> str | None:
    """This boot's id (Linux), or ``None``: monotonic times and start times are per boot.
    Read once per process (it never changes while the process lives)."""
    try:
        with open(_BOOT_ID) as f:
            return f.read().strip() or None
    except OSError:
        return None


def _read_proc(pid: int, name: str) -> bytes | None:
    """The contents of ``/proc/<pid>/<name>``, or ``None`` if there is no such process.

    Raises:
        FileNotFoundError: the system has no ``/proc``.
    """
    try:
        # os.open/os.read: four system calls where open() makes eight (fstat, ioctl,
        # lseek): the reap path reads these files.
        fd = os.open(f"{_PROC}/{pid}/{name}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            chunks = []
            while chunk := os.read(fd, 8192):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)
    except (FileNotFoundError, ProcessLookupError):
        if not os.path.isdir(_PROC):
            raise
        return None


def read_stat(pid: int) -> tuple[str, int] | None:
    """``(state, start_time)`` of ``pid`` from ``/proc``, or ``None`` if it does not exist.

    Raises:
        FileNotFoundError: the system has no ``/proc``.
    """
    data = _read_proc(pid, "stat")
    return None if data is None else parse_stat(data)


def read_start_time(pid: int) -> int | None:
    """The start time of ``pid`` (clock ticks since boot), or ``None`` without ``/proc``.

    Raises:
        ProcessGoneError: ``/proc`` exists but has no such process, or it has exited
            (a zombie).
    """
    try:
        stat = read_stat(pid)
    except FileNotFoundError:
        return None
    if stat is None or stat[0] in EXITED_STATES:
        raise ProcessGoneError(f"no process with pid {pid} (it has exited)")
    return stat[1]


class ProcStatus(NamedTuple):
    """What ``/proc/<pid>/status`` says about a task (see proc(5))."""

    tgid: int
    """The thread-group id: the pid of the process this task belongs to."""
    ppid: int
    """The parent's pid (0 for the root of the pid namespace)."""
    uid: int
    """The real uid."""


def read_status(pid: int) -> ProcStatus | None:
    """``pid``'s :class:`ProcStatus`, or ``None`` if ``/proc`` has no such task.

    Raises:
        FileNotFoundError: the system has no ``/proc``.
    """
    data = _read_proc(pid, "status")
    if data is None:
        return None
    return ProcStatus(_field(data, b"\nTgid:"), _field(data, b"\nPPid:"), _field(data, b"\nUid:"))


def _field(status: bytes, key: bytes) -> int:
    """The first number after ``key`` (a newline and a field name) in ``status``."""
    start = status.index(key) + len(key)
    end = status.find(b"\n", start)
    return int(status[start : end if end != -1 else len(status)].split()[0])


def ancestors(pid: int) -> tuple[int, ...]:
    """The pids of ``pid``'s parent, grandparent, ... up to the namespace's root.

    Empty without ``/proc``; stops where an ancestor has just exited.
    """
    chain: list[int] = []
    seen = {pid}
    while True:
        try:
            status = read_status(pid)
        except FileNotFoundError:
            return ()
        if status is None or status.ppid <= 0 or status.ppid in seen:
            return tuple(chain)
        pid = status.ppid
        chain.append(pid)
        seen.add(pid)


def is_descendant(pid: int, of: int) -> bool:
    """True when process ``of`` is an ancestor of ``pid`` (``False`` without ``/proc``)."""
    return of in ancestors(pid)
