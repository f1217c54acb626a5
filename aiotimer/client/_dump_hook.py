"""Stack dumps of a hung worker: the worker-side hook and the server-side collector.

Worker side
-----------
:func:`install_dump_handler` (called by the worker, from its main thread) creates the
dump file (:func:`dump_path_for` of its pid: ``aiotimer-dump-<pid>.txt`` in
``$AIOTIMER_DUMP_DIR``, else in the private directory ``aiotimer-dumps-<uid>`` of the
system temp dir) and writes a header line naming the pid, the process start time and
the dump signal.

Files in a shared directory are an attack surface, so: the dump directory must be a
real directory of this user that nobody else can write to (the default one is created
with mode 0700 by whoever comes first, worker or server; :func:`private_dump_dir`), and
the worker creates its file exclusively (``O_CREAT | O_EXCL | O_NOFOLLOW``, mode 0600):
it never adopts a file that was there before (a stale regular file of its own is
replaced; anything else is refused), so a FIFO planted at the path never blocks it.

On the dump signal (default ``SIGUSR1``):

1. :mod:`faulthandler`, from inside the C signal handler, appends every thread's stack.
   This works even when the main thread is stuck in C code and Python cannot run;
2. it then chains to a Python-level handler which, when the main thread next runs
   Python code (at once if it is blocked in ``time.sleep``, a lock, a read ...), appends
   every asyncio task's await chain (coroutine names, ``file:line``) and the line
   :data:`END_MARKER`.

A dump whose end marker never comes (the main thread holds the GIL in C code) still has
the thread stacks.

Server side
-----------
(In :mod:`aiotimer.reapers._dumps`; its names are importable from here too, loaded on
first use, so that a worker importing this module loads no server code.)

:func:`collect_dump` opens the file without blocking and only if it is a regular file of
this user in a private directory (a planted FIFO or a symlink is refused, never
waited on), reads it in a worker thread, checks the worker's header (same pid, same
process start time, and the signal the *server* expects: a header naming another signal
counts as no hook, so a forged header cannot make the server send, say, SIGSTOP), notes
the file's size, sends the signal through the caller's
``send_signal`` (a pidfd-pinned sender), and waits, bounded, for the end marker
(:func:`read_dump`). A worker without the hook is never signalled: the default action of
``SIGUSR1`` would kill it. :func:`py_spy_dump` is the external fallback when ``py-spy``
is installed.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import faulthandler
import logging
import os
import signal
import threading
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiotimer._edges.files import check_private_dir, create_exclusive, make_private_dir
from aiotimer._edges.procfs import read_start_time
from aiotimer.client._task_stacks import format_tasks
from aiotimer.errors import ProcessGoneError
from aiotimer.wire import (
    DEFAULT_DUMP_SIGNAL,
    END_MARKER,
    ENV_DUMP_DIR,
    HEADER_TAG,
    dump_dir_for,
    dump_path_for,
)

__all__ = [
    "DEFAULT_DUMP_SIGNAL",
    "END_MARKER",
    "ENV_DUMP_DIR",
    "dump_dir_for",
    "dump_path_for",
    "ensure_dump_handler",
    "format_tasks",
    "install_dump_handler",
    "private_dump_dir",
    "uninstall_dump_handler",
]

logger = logging.getLogger("aiotimer")


def private_dump_dir(
    dump_dir: str | os.PathLike[str] | None = None, *, create: bool = True
) -> Path:
    """:func:`dump_dir_for` ``(dump_dir)``, checked: a directory (not a symlink) of this
    user that neither group nor others can write to. Created with mode 0700 when missing
    and ``create`` (its parent must exist).

    Raises:
        UnsafePathError: it is not private (the message says why and what to do).
        OSError: it cannot be created, or is missing and not ``create``.
    """
    path = dump_dir_for(dump_dir)
    if create:
        make_private_dir(path, what="dump directory")
    else:
        check_private_dir(path, what="dump directory")
    return path


# -- worker side ------------------------------------------------------------------------


@dataclass(slots=True)
class _Hook:
    fd: int
    path: Path
    signum: int
    previous: Any  # the Python-level handler that was installed before ours
    default_path: bool
    dump_dir: str | None


# Only the main thread installs, removes and (in the signal handler) reads the hook.
_hook: _Hook | None = None


def _start_time_field(pid: int) -> str:
    try:
        start = read_start_time(pid)
    except ProcessGoneError:
        start = None
    return "-" if start is None else str(start)


def install_dump_handler(
    path: str | os.PathLike[str] | None = None,
    *,
    signum: int = DEFAULT_DUMP_SIGNAL,
    dump_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Make this process write a stack dump to a file when it receives ``signum``.

    Call it from the main thread (Python only runs signal handlers there), ideally early
    in the worker. Installing again replaces the previous hook. A forked child re-installs
    the hook for its own pid when the default path is used (and drops it otherwise, so it
    never writes into its parent's file).

    Args:
        path: the dump file; default :func:`dump_path_for` ``(os.getpid(), dump_dir)``,
            the path the server computes.
        signum: the dump signal (default ``SIGUSR1``).
        dump_dir: the directory for the default path (see :func:`dump_path_for`).

    Returns:
        The dump file's path.

    Raises:
        RuntimeError: not called from the main thread.
        OSError: the file cannot be created: the dump directory is not private (see
            :func:`private_dump_dir`), or something other than a stale file of this
            user is in the way (the file is created exclusively, mode 0600).
    """
    global _hook
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("install_dump_handler() must be called from the main thread")
    if _hook is not None:
        _remove(_hook, unlink=True)
        _hook = None
    pid = os.getpid()
    default_path = path is None
    target = Path(path) if path is not None else dump_path_for(pid, private_dump_dir(dump_dir))
    fd = create_exclusive(target, 0o600, what="dump file")
    try:
        header = f"{HEADER_TAG} pid={pid} start={_start_time_field(pid)} signal={signum}\n"
        _write_all(fd, header.encode())
        previous = signal.signal(signum, _on_dump_signal)
        try:
            faulthandler.register(signum, file=fd, all_threads=True, chain=True)
        except BaseException:
            signal.signal(signum, previous)
            raise
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            target.unlink()
        raise
    _hook = _Hook(
        fd=fd,
        path=target,
        signum=signum,
        previous=previous,
        default_path=default_path,
        dump_dir=None if dump_dir is None else os.fspath(dump_dir),
    )
    return target


def ensure_dump_handler() -> Path | None:
    """Install the default dump hook unless one is installed; never raises.

    For library code such as ``aiotimer.configure()``: a no-op when this process already
    has a hook (keeping its path and signal), and ``None`` instead of an error when the
    hook cannot be installed (not the main thread, or the dump file cannot be created;
    the latter is logged). The file is :func:`dump_path_for` ``(os.getpid())``, i.e. in
    ``$AIOTIMER_DUMP_DIR`` or the system temp dir, where the server looks by default.

    Returns:
        The dump file's path, or ``None`` if no hook is installed.
    """
    if _hook is not None:
        return _hook.path
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        return install_dump_handler()
    except OSError as exc:
        logger.warning("no stack dumps for this worker: cannot create its dump file: %s", exc)
        return None


def uninstall_dump_handler() -> None:
    """Remove the hook: restore the previous handler, close and delete the dump file.

    Does nothing when no hook is installed. Call it from the main thread.
    """
    global _hook
    if _hook is not None:
        _remove(_hook, unlink=True)
        _hook = None


def _remove(hook: _Hook, *, unlink: bool) -> None:
    faulthandler.unregister(hook.signum)
    signal.signal(hook.signum, hook.previous if hook.previous is not None else signal.SIG_DFL)
    os.close(hook.fd)
    if unlink:
        with contextlib.suppress(OSError):
            hook.path.unlink()


def _after_fork_in_child() -> None:
    global _hook
    inherited = _hook
    if inherited is None:
        return
    _hook = None
    try:
        _remove(inherited, unlink=False)  # the parent's file stays the parent's
        if inherited.default_path:
            install_dump_handler(signum=inherited.signum, dump_dir=inherited.dump_dir)
    except Exception:  # pragma: no cover - a forked child must not die of its diagnostics
        _hook = None


def _at_exit() -> None:
    with contextlib.suppress(Exception):
        uninstall_dump_handler()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _on_dump_signal(signum: int, frame: types.FrameType | None) -> None:
    """The Python-level half of a dump: asyncio tasks, then the end marker."""
    hook = _hook
    if hook is None:
        return
    try:
        text = _asyncio_section(frame)
    except Exception as exc:  # the dump must end even if formatting fails
        text = f"[aiotimer: formatting asyncio tasks failed: {exc!r}]\n"
    with contextlib.suppress(OSError):
        _write_all(hook.fd, (text + END_MARKER + "\n").encode("utf-8", "replace"))
    if callable(hook.previous):
        hook.previous(signum, frame)


def _asyncio_section(frame: types.FrameType | None) -> str:
    when = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    lines = [f"=== aiotimer asyncio tasks: pid {os.getpid()}, {when} ==="]
    loop = asyncio._get_running_loop()
    if loop is None:
        lines.append("no asyncio event loop is running in the main thread")
        return "\n".join(lines) + "\n"
    return "\n".join(lines) + "\n" + format_tasks(loop, current_frame=frame)
