"""Process trees of supervised workers: find every process a worker left, stop them all.

Each worker is started in its own session (``start_new_session``), so it leads a new
session and process group whose id is its pid; its children stay in that session (and
usually that group) unless they call ``setsid()``. :func:`scan` finds processes by
session or group id, reading ``/proc``. A descendant that escaped with ``setsid()`` and
lost its parent is found only if the supervisor is a *child subreaper*
(:func:`become_subreaper`): the kernel then re-parents orphans to it instead of to init,
and :func:`scan` reports children of this process in a session other than its own.

:func:`terminate` stops what a finder returns: SIGTERM, wait up to ``timeout``, SIGKILL,
rescanning after every wait (processes may fork while they stop), each process pinned by
a pidfd (:class:`~aiotimer.reapers._identity.PinnedProcess`) so a recycled pid is never signalled.
It waits on pidfds, never polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

import anyio

from aiotimer._edges.procfs import EXITED_STATES, stat_fields
from aiotimer.errors import ProcessGoneError, ReapError, RefusedTargetError
from aiotimer.reapers import PinnedProcess

__all__ = [
    "ProcInfo",
    "become_subreaper",
    "proc_info",
    "processes",
    "reap_orphans",
    "scan",
    "terminate",
    "with_parent_death_signal",
]

logger = logging.getLogger("aiotimer")

_PR_SET_CHILD_SUBREAPER: Final[int] = 36


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux >= 3.4); ``False`` where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


#: Run by a fresh interpreter in the child, between its fork and its command's exec:
#: ask the kernel for the parent-death signal, check the parent did not die meanwhile,
#: undo the signals Python ignores (an ignored signal survives exec), become the command.
_TRAMPOLINE: Final[str] = """\
import ctypes, os, signal, sys
parent, signum, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
if ctypes.CDLL(None, use_errno=True).prctl(1, signum, 0, 0, 0) != 0:
    sys.stderr.write(f"aiotimer: no parent-death signal for {argv[0]!r}\\n")
if os.getppid() != parent:
    os.kill(os.getpid(), signum)
for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ"):
    if hasattr(signal, name):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
try:
    os.execvp(argv[0], argv)
except OSError as exc:
    sys.stderr.write(f"aiotimer: cannot run {argv[0]!r}: {exc.strerror}\\n")
    os._exit(127 if isinstance(exc, FileNotFoundError) else 126)
"""


def with_parent_death_signal(command: Sequence[str], signum: int) -> list[str]:
    """``command``, run so that the child gets ``signum`` when this process dies
    (``PR_SET_PDEATHSIG``, through ``ctypes`` in the child before it execs ``command``).

    The child is first a fresh interpreter (``python -I -S``, ~20 ms of CPU) that sets
    the signal and execs ``command`` in place: same pid, environment and descriptors;
    exit status 127 (126) when ``command`` cannot be found (run). Not a ``preexec_fn``:
    that forks this process with its threads, and a gRPC client's (``--etcd``) at-fork
    handlers then crash some children (SIGSEGV) and log a line per fork.

    The kernel sends the signal when the *thread* that forked the child ends, so start
    it from a thread that lives as long as this process (the loop's). The setting is
    kept across ``exec`` (not into set-uid programs) and not passed to the command's
    own children.
    """
    return [sys.executable, "-I", "-S", "-c", _TRAMPOLINE, str(os.getpid()), str(signum),
            *command]  # fmt: skip


@dataclass(frozen=True, slots=True)
class ProcInfo:
    """One process as ``/proc/<pid>/stat`` shows it."""

    pid: int
    state: str
    ppid: int
    pgid: int
    sid: int
    start_time: int
    """Clock ticks since boot (``/proc/<pid>/stat`` field 22)."""

    @property
    def exited(self) -> bool:
        """A zombie (or dead) process."""
        return self.state in EXITED_STATES


def processes() -> Iterator[ProcInfo]:
    """Every process ``/proc`` shows (none without ``/proc``)."""
    try:
        names = os.listdir("/proc")
    except FileNotFoundError:
        return
    for name in names:
        if name.isdigit() and (info := proc_info(int(name))) is not None:
            yield info


def proc_info(pid: int) -> ProcInfo | None:
    """Process ``pid`` as ``/proc`` shows it now; ``None`` if there is none."""
    try:  # os.open/os.read: half the cost of open() here (no buffered file object)
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None  # it exited meanwhile
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    if not data:
        return None
    fields = stat_fields(data)
    return ProcInfo(
        pid,
        fields[0].decode("ascii"),
        int(fields[1]),
        int(fields[2]),
        int(fields[3]),
        int(fields[19]),
    )


def scan(
    sessions: Collection[int], *, orphans: bool = False, exclude: Collection[int] = ()
) -> list[ProcInfo]:
    """Live processes in one of ``sessions`` (as session or process group id).

    With ``orphans``, also this process's children in a session other than its own
    (descendants of workers re-parented here by the subreaper). Zombies and ``exclude``
    are left out.
    """
    me, my_sid = os.getpid(), os.getsid(0)
    found = []
    for p in processes():
        if p.exited or p.pid in exclude or p.pid == me:
            continue
        if (
            p.sid in sessions
            or p.pgid in sessions
            or (orphans and p.ppid == me and p.sid != my_sid)
        ):
            found.append(p)
    return found


def reap_orphans(exclude: Collection[int]) -> None:
    """Collect exited re-parented orphans: zombie children of this process in another
    session than its own, except ``exclude`` (the workers, waited for elsewhere)."""
    me, my_sid = os.getpid(), os.getsid(0)
    for p in processes():
        if p.exited and p.ppid == me and p.sid != my_sid and p.pid not in exclude:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(p.pid, os.WNOHANG)


async def terminate(
    find: Callable[[], list[int]],
    *,
    timeout: float,
    unkillable_after: float = 5.0,
    hurry: asyncio.Event | None = None,
) -> tuple[int, ...]:
    """Stop every process ``find()`` returns, until it returns none.

    SIGTERM first; what is left ``timeout`` seconds later, or once ``hurry`` is set,
    gets SIGKILL. Returns the pids still found ``unkillable_after`` seconds after
    SIGKILL (stuck in the kernel), ``()`` when all are gone.
    """
    kill_at = anyio.current_time() + timeout
    pinned: dict[int, tuple[PinnedProcess, int]] = {}  # pid -> (handle, last signal sent)
    try:
        while True:
            pids = find()
            now = anyio.current_time()
            if hurry is not None and hurry.is_set() and now < kill_at:
                kill_at = now
            if not pids:
                return ()
            sig = int(signal.SIGKILL if now >= kill_at else signal.SIGTERM)
            if sig == signal.SIGKILL and now >= kill_at + unkillable_after:
                return tuple(pids)
            waiting = []
            for pid in pids:
                entry = pinned.get(pid)
                if entry is None:
                    try:
                        entry = pinned[pid] = (PinnedProcess.pin(pid), 0)
                    except (ProcessGoneError, RefusedTargetError):
                        continue
                proc, sent = entry
                if sent != sig:
                    try:
                        proc.send_signal(sig)
                    except ProcessGoneError:
                        continue
                    except ReapError as exc:
                        logger.error("could not stop process %d: %s", pid, exc)
                    pinned[pid] = (proc, sig)
                waiting.append(proc)
            until = kill_at if sig == signal.SIGTERM else kill_at + unkillable_after
            with anyio.move_on_after(max(0.0, until - now)):
                async with anyio.create_task_group() as tg:
                    if hurry is not None and sig == signal.SIGTERM:
                        tg.start_soon(_cancel_when_set, hurry, tg.cancel_scope)
                    if waiting:
                        await _all_exited(waiting)
                    else:  # found but not pinnable (it exited meanwhile): look again soon
                        await anyio.sleep(0.01)
                    tg.cancel_scope.cancel()
    finally:
        for proc, _ in pinned.values():
            proc.close()


async def _cancel_when_set(event: asyncio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def _all_exited(procs: list[PinnedProcess]) -> None:
    async with anyio.create_task_group() as tg:
        for proc in procs:
            tg.start_soon(proc.wait_exit)
