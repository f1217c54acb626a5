"""Worker processes of a supervisor: their environment, launch, watch and stop.

Private helpers of :mod:`aiotimer.supervisor`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio

from aiotimer.client import (
    ENV_RESTART_COUNT,
    ENV_RUN_ID,
    TORCH_ENV_MAX_RESTARTS,
    TORCH_ENV_RESTART_COUNT,
    TORCH_ENV_RUN_ID,
)
from aiotimer.events import TimerExpired, WorkerReaped
from aiotimer.reapers import NoDump, Reaper
from aiotimer.supervisor import _proctree
from aiotimer.supervisor._exits import ExitReason, classify_exit
from aiotimer.supervisor._runfile import RunFile
from aiotimer.wire import ENV_FIFO, TORCH_ENV_FIFO

__all__ = [
    "WORKER_ENV",
    "Attempt",
    "ObservedReaper",
    "WorkerPool",
    "free_port",
    "worker_env",
]

logger = logging.getLogger("aiotimer")

#: The variables every worker gets (besides the supervisor's own environment).
WORKER_ENV: tuple[str, ...] = (
    ENV_FIFO,
    TORCH_ENV_FIFO,
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    ENV_RESTART_COUNT,
    ENV_RUN_ID,
    TORCH_ENV_RESTART_COUNT,
    TORCH_ENV_MAX_RESTARTS,
    TORCH_ENV_RUN_ID,
    "TORCHELASTIC_USE_AGENT_STORE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def worker_env(
    base: Mapping[str, str],
    *,
    fifo: str,
    rank: int,
    nproc: int,
    restarts: int,
    max_restarts: int,
    run_id: str,
    master_port: int,
) -> dict[str, str]:
    """The environment of worker ``rank``: ``base`` plus every name in :data:`WORKER_ENV`
    (``MASTER_ADDR``/``MASTER_PORT`` only where ``base`` has none)."""
    env = dict(base)
    n = str(nproc)
    env.update(
        {
            ENV_FIFO: fifo,
            TORCH_ENV_FIFO: fifo,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": n,
            "LOCAL_WORLD_SIZE": n,
            "GROUP_RANK": "0",
            "GROUP_WORLD_SIZE": "1",
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": n,
            "ROLE_NAME": "default",
            ENV_RESTART_COUNT: str(restarts),
            ENV_RUN_ID: run_id,
            TORCH_ENV_RESTART_COUNT: str(restarts),
            TORCH_ENV_MAX_RESTARTS: str(max_restarts),
            TORCH_ENV_RUN_ID: run_id,
            "TORCHELASTIC_USE_AGENT_STORE": "False",
        }
    )
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("MASTER_PORT", str(master_port))
    return env


@dataclass(eq=False)
class Attempt:
    """One running process of a slot."""

    rank: int
    number: int
    popen: subprocess.Popen[bytes]
    pidfd: int | None  # None where the OS has no pidfds
    started_at: float
    stop_requested: bool = False
    final: bool = False  # stopped for good (a shutdown, an operator's stop): no restart
    reaped: tuple[str, ...] | None = None  # the reap's scopes (the expired one first)
    reaped_omitted: int = 0  # the reap's scopes not listed
    culprit: tuple[str, str | None] | None = None  # the task holding the loop, its block
    expired: tuple[str, ...] = ()
    timer_pids: set[int] = field(default_factory=set)
    done: anyio.Event = field(default_factory=anyio.Event)

    @property
    def pid(self) -> int:
        """The worker's pid (its session and process group id too)."""
        return self.popen.pid

    def exited(self) -> bool:
        """Whether the process has exited (and was waited for)."""
        return self.popen.poll() is not None


class ObservedReaper:
    """Wraps the server's reaper to learn when a process first registers a timer, and
    when a reap begins (``before_reap(pid, dumping)``, before its first signal or dump;
    ``dumped(pid, result)`` once a dump step is done)."""

    def __init__(
        self,
        inner: Reaper,
        on_attach: Callable[[int], None],
        before_reap: Callable[[int, bool], None] = lambda pid, dumping: None,
        dumped: Callable[[int, str | NoDump | None], None] = lambda pid, result: None,
    ) -> None:
        self.inner = inner
        self._on_attach = on_attach
        self._before_reap = before_reap
        self._dumped = dumped

    def attach(self, pid: int, *, start_time: int | None = None) -> bool:
        """Attach through the inner reaper; tell ``on_attach`` if the pid is live."""
        if start_time is None:
            ok = self.inner.attach(pid)
        else:
            ok = self.inner.attach(pid, start_time=start_time)
        if ok:
            self._on_attach(pid)
        return ok

    async def wait_exit(self, pid: int) -> None:
        """The inner reaper's."""
        await self.inner.wait_exit(pid)

    def signal(self, pid: int, signum: int, *, group: bool = False) -> None:
        """The inner reaper's, after ``before_reap``."""
        self._before_reap(pid, False)
        self.inner.signal(pid, signum, group=group)

    async def dump_stacks(self, pid: int, timeout: float) -> str | NoDump | None:
        """The inner reaper's, between ``before_reap`` and ``dumped``."""
        self._before_reap(pid, True)
        result = await self.inner.dump_stacks(pid, timeout)
        self._dumped(pid, result)
        return result

    def detach(self, pid: int) -> None:
        """The inner reaper's."""
        self.inner.detach(pid)


def pidfd(pid: int) -> int | None:
    """A pidfd for our child ``pid`` (valid even once it is a zombie), if the OS has them."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None
    os.set_inheritable(fd, False)
    return fd


class WorkerPool:
    """A supervisor's running worker processes: launch, watch, attribute, stop.

    Holds the running :class:`Attempt` of each rank, and which rank every process that
    registered a timer belongs to (a worker's own pid, or a descendant in its session),
    so the timer server's events can be attributed. Every wait is on a pidfd.

    Args:
        command: the workers' argv.
        cwd: their working directory.
        stop_timeout: seconds between SIGTERM and SIGKILL.
        subreaper: also stop orphans re-parented to this process (see
            :func:`~aiotimer.supervisor._proctree.become_subreaper`).
        parent_death_signal: the signal each worker gets when this process dies
            (``None``: none; see :func:`~aiotimer.supervisor._proctree.die_with_parent`).
    """

    def __init__(
        self,
        command: tuple[str, ...],
        *,
        cwd: str | os.PathLike[str] | None,
        stop_timeout: float,
        subreaper: bool,
        parent_death_signal: int | None = None,
    ) -> None:
        self.command = command
        self.attempts: dict[int, Attempt] = {}  # rank -> running attempt
        #: Where the running workers are recorded for the run's guard and the next run.
        self.run_file: RunFile | None = None
        self._cwd = cwd
        self._stop_timeout = stop_timeout
        self._subreaper = subreaper
        self._death_signal = parent_death_signal
        if parent_death_signal is not None and not sys.executable:
            self._death_signal = None
            logger.warning(
                "no Python interpreter to start the workers with a parent-death signal: "
                "if this process is killed, they run on"
            )
        self._pid_rank: dict[int, int] = {}  # a timer-registering pid -> its rank
        self._hurry = asyncio.Event()

    def hurry(self) -> None:
        """From now on, stop with SIGKILL at once: skip what is left of ``stop_timeout``."""
        self._hurry.set()

    def launch(self, rank: int, number: int, env: Mapping[str, str], now: float) -> Attempt:
        """Start attempt ``number`` of ``rank`` in a new session.

        Raises:
            OSError: the command could not be started.
        """
        death = self._death_signal
        argv = (
            self.command
            if death is None
            else _proctree.with_parent_death_signal(self.command, death)
        )
        popen = subprocess.Popen(
            argv, env=env, cwd=self._cwd, stdin=subprocess.DEVNULL, start_new_session=True
        )
        att = self.attempts[rank] = Attempt(rank, number, popen, pidfd(popen.pid), now)
        self._pid_rank[popen.pid] = rank
        if self.run_file is not None:
            self.run_file.record(a.pid for a in self.attempts.values())
            self.run_file.pin(att.pid, att.pidfd)
        return att

    async def wait(
        self, att: Attempt, *, while_running: Callable[[], Coroutine[Any, Any, None]]
    ) -> ExitReason:
        """Wait until ``att`` exits (running ``while_running`` meanwhile), stop what it
        left in its session, and classify its exit."""
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(while_running)
                await _wait_exit(att)
                tg.cancel_scope.cancel()
            # Stop what it left in its session while it is an unwaited zombie, so its
            # pid (the session id) cannot be reused meanwhile; then collect its status.
            await _proctree.terminate(
                lambda: [p.pid for p in _proctree.scan({att.pid})],
                timeout=self._stop_timeout,
                hurry=self._hurry,
            )
            returncode = att.popen.wait()  # it has exited: this does not block
        finally:
            if att.pidfd is not None:
                os.close(att.pidfd)
            if self.run_file is not None:
                self.run_file.unpin(att.pid)
            if self.attempts.get(att.rank) is att:
                del self.attempts[att.rank]
            for pid in (*att.timer_pids, att.pid):
                self._pid_rank.pop(pid, None)
        reaped = att.reaped
        if reaped is None and att.expired and returncode < 0:
            reaped = att.expired  # the reap's event has not arrived (yet)
        return classify_exit(
            returncode,
            reaped_scopes=reaped,
            stopped=att.stop_requested,
            omitted=att.reaped_omitted if att.reaped is not None else 0,
            culprit=att.culprit,
        )

    def owner(self, pid: int) -> Attempt | None:
        """The running attempt ``pid`` belongs to: the worker itself or a process in its
        session (remembered, as the first timer request of ``pid`` is seen)."""
        rank = self._pid_rank.get(pid)
        if rank is None:
            try:
                sid = os.getsid(pid)
            except OSError:
                return None
            att = next((a for a in self.attempts.values() if a.pid == sid), None)
            if att is None:
                return None
            att.timer_pids.add(pid)
            self._pid_rank[pid] = rank = att.rank
        return self.attempts.get(rank)

    def note(self, event: TimerExpired | WorkerReaped) -> Attempt | None:
        """Record a timer server event; the attempt if one of its own timers expired."""
        rank = self._pid_rank.get(event.pid)
        att = None if rank is None else self.attempts.get(rank)
        if att is None:
            return None
        if isinstance(event, TimerExpired):
            if not event.report_only and event.pid == att.pid:
                att.expired = (*att.expired, event.scope_id)
                return att
        elif event.pid == att.pid or event.group:
            att.reaped, att.reaped_omitted, att.culprit = event.scopes, event.omitted, event.culprit
        return None

    async def stop(self, ranks: Iterable[int], *, final: bool = False) -> None:
        """Stop the running attempts of ``ranks`` (``final``: for good, they will not be
        restarted); return once they are collected."""
        attempts = [a for r in ranks if (a := self.attempts.get(r)) is not None]
        if not attempts:
            return
        for att in attempts:
            att.stop_requested = True
            att.final = att.final or final
        sessions = {a.pid for a in attempts}
        await _proctree.terminate(
            lambda: [p.pid for p in _proctree.scan(sessions)],
            timeout=self._stop_timeout,
            hurry=self._hurry,
        )
        for att in attempts:
            await att.done.wait()

    async def stop_all(self) -> None:
        """Stop every attempt and everything the workers left (orphans too, as a
        subreaper); return once the attempts are collected. The run file is removed
        when nothing is left."""
        for att in self.attempts.values():
            att.stop_requested = att.final = True
        survivors = await _proctree.terminate(
            self._find_all, timeout=self._stop_timeout, hurry=self._hurry
        )
        if survivors:
            logger.critical("processes still alive after SIGKILL: %s", survivors)
        with anyio.move_on_after(self._stop_timeout + 5):
            for att in list(self.attempts.values()):
                await att.done.wait()
        if self.run_file is not None and not survivors:
            self.run_file.remove()

    def _find_all(self) -> list[int]:
        # Running workers' sessions (a leader is collected only after its session is
        # empty, so its pid, the session id, cannot have been reused), and orphans.
        leaders = {att.pid for att in self.attempts.values()}
        if self._subreaper:
            _proctree.reap_orphans(exclude=leaders)
        return [p.pid for p in _proctree.scan(leaders, orphans=self._subreaper)]


async def _wait_exit(att: Attempt) -> None:
    if att.pidfd is not None:
        await anyio.wait_readable(att.pidfd)
        return
    while att.popen.poll() is None:  # no pidfds (Linux < 5.3): poll, 10 times a second
        await anyio.sleep(0.1)


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (for ``MASTER_PORT``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
