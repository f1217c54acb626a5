"""The worker side: ``expires()`` blocks, and which client they talk through.

>>> with expires(after=10):                # doctest: +SKIP
...     load_batch()

Transports: :class:`FifoClient` (the FIFO of ``aiotimer serve`` or torch's server),
:class:`QueueClient` (a ``multiprocessing`` queue), :class:`InProcessClient` (a server in
this process). The block itself is :class:`Expires` (see its docs for the two tiers of
an ``async with`` block). :func:`launch_info` tells a worker what launched it
(``aiotimer run``, torchrun, or nothing) and its place in the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from aiotimer._faces import face_getattr
from aiotimer.client._expires import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_KILL_AFTER,
    DEFAULT_SIGNAL,
    DEFAULT_WRITE_TIMEOUT,
    MAX_DEADLINE_AHEAD,
    Expires,
    FifoClient,
    InProcessClient,
    Learned,
    QueueClient,
    QueueRequest,
    RequestSubmitter,
    TimerClient,
    configure,
    current_client,
    expires,
    expires_at,
    learned,
    scope_site,
    timer_server_configured,
    use_client,
)
from aiotimer.client._launch import Launcher, LaunchInfo, launch_info

if TYPE_CHECKING:
    from aiotimer.client._dump_hook import (
        ensure_dump_handler,
        install_dump_handler,
        private_dump_dir,
        uninstall_dump_handler,
    )
    from aiotimer.client._launch import (
        ENV_RESTART_COUNT,
        ENV_RUN_ID,
        TORCH_ENV_MAX_RESTARTS,
        TORCH_ENV_RESTART_COUNT,
        TORCH_ENV_RUN_ID,
    )
    from aiotimer.client._queue import PutQueue
    from aiotimer.client._task_stacks import format_tasks
    from aiotimer.client._transport import release_failed
    from aiotimer.client._watchdog import LoopWatchdog, Watchdog, loop_watchdog, watchdog

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_KILL_AFTER",
    "DEFAULT_SIGNAL",
    "DEFAULT_WRITE_TIMEOUT",
    "ENV_RESTART_COUNT",
    "ENV_RUN_ID",
    "MAX_DEADLINE_AHEAD",
    "TORCH_ENV_MAX_RESTARTS",
    "TORCH_ENV_RESTART_COUNT",
    "TORCH_ENV_RUN_ID",
    "Expires",
    "FifoClient",
    "InProcessClient",
    "LaunchInfo",
    "Launcher",
    "Learned",
    "LoopWatchdog",
    "PutQueue",
    "QueueClient",
    "QueueRequest",
    "RequestSubmitter",
    "TimerClient",
    "Watchdog",
    "configure",
    "current_client",
    "ensure_dump_handler",
    "expires",
    "expires_at",
    "format_tasks",
    "install_dump_handler",
    "launch_info",
    "learned",
    "loop_watchdog",
    "private_dump_dir",
    "release_failed",
    "scope_site",
    "timer_server_configured",
    "uninstall_dump_handler",
    "use_client",
    "watchdog",
]

_LAZY: Final[dict[str, str]] = {
    "PutQueue": "aiotimer.client._queue",
    "ENV_RESTART_COUNT": "aiotimer.client._launch",
    "ENV_RUN_ID": "aiotimer.client._launch",
    "LoopWatchdog": "aiotimer.client._watchdog",
    "TORCH_ENV_MAX_RESTARTS": "aiotimer.client._launch",
    "TORCH_ENV_RESTART_COUNT": "aiotimer.client._launch",
    "TORCH_ENV_RUN_ID": "aiotimer.client._launch",
    "Watchdog": "aiotimer.client._watchdog",
    "ensure_dump_handler": "aiotimer.client._dump_hook",
    "format_tasks": "aiotimer.client._task_stacks",
    "install_dump_handler": "aiotimer.client._dump_hook",
    "loop_watchdog": "aiotimer.client._watchdog",
    "private_dump_dir": "aiotimer.client._dump_hook",
    "release_failed": "aiotimer.client._transport",
    "uninstall_dump_handler": "aiotimer.client._dump_hook",
    "watchdog": "aiotimer.client._watchdog",
}

__getattr__, __dir__ = face_getattr("aiotimer.client", globals(), lazy=_LAZY)
