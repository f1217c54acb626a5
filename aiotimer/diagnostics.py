"""Stack dumps of a hung worker: the worker-side hook and the server-side collector.

Worker side (:mod:`aiotimer.client._dump_hook`): :func:`install_dump_handler` makes the
worker write every thread's stack and every asyncio task's await chain to its dump file
on a signal (default ``SIGUSR1``); :func:`ensure_dump_handler` installs it once.

Server side (:mod:`aiotimer.reapers._dumps`): :func:`collect_dump` asks a hooked worker
for its dump and reads it, bounded; :func:`py_spy_dump` is the fallback when ``py-spy``
is installed. These are loaded on first use, so a worker importing this module loads no
server code.

The dump file's place and format (:func:`dump_path_for`, :data:`END_MARKER`) are shared
by both sides (:mod:`aiotimer.wire._dumpfile`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from aiotimer.client import (
    ensure_dump_handler,
    format_tasks,
    install_dump_handler,
    private_dump_dir,
    uninstall_dump_handler,
)
from aiotimer.wire import (
    DEFAULT_DUMP_SIGNAL,
    END_MARKER,
    ENV_DUMP_DIR,
    dump_dir_for,
    dump_path_for,
)

if TYPE_CHECKING:
    from aiotimer.reapers import (
        HookInfo,
        collect_dump,
        hook_info,
        py_spy_dump,
        py_spy_executable,
        read_dump,
    )

__all__ = [
    "DEFAULT_DUMP_SIGNAL",
    "END_MARKER",
    "ENV_DUMP_DIR",
    "HookInfo",
    "collect_dump",
    "dump_dir_for",
    "dump_path_for",
    "ensure_dump_handler",
    "format_tasks",
    "hook_info",
    "install_dump_handler",
    "private_dump_dir",
    "py_spy_dump",
    "py_spy_executable",
    "read_dump",
    "uninstall_dump_handler",
]

_SERVER_SIDE: Final = frozenset(
    {"HookInfo", "collect_dump", "hook_info", "py_spy_dump", "py_spy_executable", "read_dump"}
)


def __getattr__(name: str) -> Any:
    if name in _SERVER_SIDE:
        from aiotimer import reapers  # noqa: PLC0415 (lazy: server side)

        return getattr(reapers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_SERVER_SIDE})
