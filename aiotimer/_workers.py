"""Worker processes of a supervisor: their environment, launch handle and exit watch.

Private helpers of :mod:`aiotimer.supervisor`.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import anyio

from aiotimer._launch import (
    ENV_RESTART_COUNT,
    ENV_RUN_ID,
    TORCH_ENV_MAX_RESTARTS,
    TORCH_ENV_RESTART_COUNT,
    TORCH_ENV_RUN_ID,
)
from aiotimer._protocol import ENV_FIFO, TORCH_ENV_FIFO
from aiotimer.reapers import Reaper

__all__ = [
    "WORKER_ENV",
    "Attempt",
    "ObservedReaper",
    "free_port",
    "pidfd",
    "wait_exit",
    "worker_env",
]

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
    reaped: tuple[str, ...] | None = None
    expired: tuple[str, ...] = ()
    timer_pids: set[int] = field(default_factory=set)
    done: anyio.Event = field(default_factory=anyio.Event)

    @property
    def pid(self) -> int:
        return self.popen.pid


class ObservedReaper:
    """Wraps the server's reaper to learn when a process first registers a timer."""

    def __init__(self, inner: Reaper, on_attach: Callable[[int], None]) -> None:
        self.inner = inner
        self._on_attach = on_attach

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
        """The inner reaper's."""
        self.inner.signal(pid, signum, group=group)

    async def dump_stacks(self, pid: int, timeout: float) -> str | None:
        """The inner reaper's."""
        return await self.inner.dump_stacks(pid, timeout)

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


async def wait_exit(att: Attempt) -> None:
    if att.pidfd is not None:
        await anyio.wait_readable(att.pidfd)
        return
    while att.popen.poll() is None:  # no pidfds (Linux < 5.3): poll, 10 times a second
        await anyio.sleep(0.1)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
