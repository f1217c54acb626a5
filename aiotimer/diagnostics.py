"""Stack dumps of a hung worker: the worker-side hook and the server-side collector.

Worker side
-----------
:func:`install_dump_handler` (called by the worker, from its main thread) opens the dump
file (:func:`dump_path_for` of its pid: ``$AIOTIMER_DUMP_DIR`` or the system temp dir,
``aiotimer-dump-<pid>.txt``, mode 0600) and writes a header line naming the pid, the
process start time and the dump signal. On that signal (default ``SIGUSR1``):

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
:func:`collect_dump` checks the worker's header (same pid, same process start time, the
hook's signal), notes the file's size, sends the signal through the caller's
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
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import anyio

from aiotimer._process import read_start_time
from aiotimer.errors import ProcessGoneError

__all__ = [
    "DEFAULT_DUMP_SIGNAL",
    "END_MARKER",
    "ENV_DUMP_DIR",
    "HookInfo",
    "collect_dump",
    "dump_path_for",
    "ensure_dump_handler",
    "format_tasks",
    "hook_info",
    "install_dump_handler",
    "py_spy_dump",
    "py_spy_executable",
    "read_dump",
    "uninstall_dump_handler",
]

logger = logging.getLogger("aiotimer")

#: The environment variable naming the directory of dump files (worker and server alike).
ENV_DUMP_DIR: Final[str] = "AIOTIMER_DUMP_DIR"
#: The signal a worker's hook listens to unless told otherwise.
DEFAULT_DUMP_SIGNAL: Final[int] = int(signal.SIGUSR1)
#: The last line of a complete dump.
END_MARKER: Final[str] = "=== end of aiotimer dump ==="
#: The first word of a dump file's header line.
_HEADER_TAG: Final[str] = "aiotimer-dump-hook"
#: The most a reader takes of one dump.
MAX_DUMP_BYTES: Final[int] = 4 * 1024 * 1024
#: The longest await chain printed per task (guards against cycles).
_MAX_CHAIN: Final[int] = 200


def dump_path_for(pid: int, dump_dir: str | os.PathLike[str] | None = None) -> Path:
    """The dump file of worker ``pid``: ``<dir>/aiotimer-dump-<pid>.txt``.

    ``dir`` is ``dump_dir``, else ``$AIOTIMER_DUMP_DIR``, else the system temp dir
    (``tempfile.gettempdir()``, which follows ``$TMPDIR``: give the worker and the
    server the same environment, or set ``AIOTIMER_DUMP_DIR`` for both).
    """
    if dump_dir is None:
        dump_dir = os.environ.get(ENV_DUMP_DIR) or tempfile.gettempdir()
    return Path(dump_dir) / f"aiotimer-dump-{pid}.txt"


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
        OSError: the file cannot be created (e.g. a symlink or another user's file is in
            the way: the file is opened with ``O_NOFOLLOW``, mode 0600).
    """
    global _hook
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("install_dump_handler() must be called from the main thread")
    if _hook is not None:
        _remove(_hook, unlink=True)
        _hook = None
    pid = os.getpid()
    default_path = path is None
    target = dump_path_for(pid, dump_dir) if path is None else Path(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC
    fd = os.open(target, flags | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        header = f"{_HEADER_TAG} pid={pid} start={_start_time_field(pid)} signal={signum}\n"
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


# -- formatting tasks -------------------------------------------------------------------


def _where(frame: types.FrameType) -> str:
    code = frame.f_code
    return f"{code.co_qualname} at {code.co_filename}:{frame.f_lineno}"


def _short(obj: object, limit: int = 160) -> str:
    try:
        text = repr(obj)
    except Exception as exc:
        text = f"<unprintable {type(obj).__name__}: {exc!r}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _frame_of(obj: object) -> types.FrameType | None:
    for attr in ("cr_frame", "gi_frame", "ag_frame"):
        frame = getattr(obj, attr, None)
        if isinstance(frame, types.FrameType):
            return frame
    return None


def _awaited_by(obj: object) -> object | None:
    for attr in ("cr_await", "gi_yieldfrom", "ag_await"):
        inner: object = getattr(obj, attr, None)
        if inner is not None:
            return inner
    return None


def _running_frames(
    coro_frame: types.FrameType, current: types.FrameType | None
) -> list[types.FrameType] | None:
    """The frames from ``coro_frame`` down to ``current``, if ``current`` runs inside it."""
    frames: list[types.FrameType] = []
    f = current
    while f is not None:
        frames.append(f)
        if f is coro_frame:
            return frames[::-1]
        f = f.f_back
    return None


def _await_chain(coro: object, current: types.FrameType | None, waiter: object) -> list[str]:
    """One line per coroutine from the task's outermost one to where it is stuck.

    ``waiter`` is the future the task waits for, if known: it names the awaited object
    better than the opaque future iterator at the end of the chain.
    """
    lines: list[str] = []
    obj: object | None = coro
    for _ in range(_MAX_CHAIN):
        if obj is None:
            break
        frame = _frame_of(obj)
        if frame is None:
            if any(hasattr(obj, a) for a in ("cr_code", "gi_code", "ag_code")):
                name = getattr(obj, "__qualname__", type(obj).__name__)
                lines.append(f"{name} (finished or not started)")
            else:
                lines.append(f"awaiting {_describe_awaited(obj, waiter)}")
            break
        running = _running_frames(frame, current)
        if running is not None:
            # This coroutine is executing right now (the signal interrupted it, e.g. in
            # time.sleep): its callees are frames on the stack, not an await chain.
            lines.extend(_where(f) for f in running)
            lines.append("(running: interrupted in the innermost frame above)")
            break
        lines.append(_where(frame))
        obj = _awaited_by(obj)
        if obj is None and waiter is not None:
            lines.append(f"awaiting {_describe_awaited(None, waiter)}")
    return lines


def _describe_awaited(obj: object, waiter: object) -> str:
    if waiter is None:
        return _short(obj)
    if isinstance(waiter, asyncio.Task):
        return f"task {waiter.get_name()!r}"
    return _short(waiter)


def format_tasks(
    loop: asyncio.AbstractEventLoop, *, current_frame: types.FrameType | None = None
) -> str:
    """Every task of ``loop`` with its await chain, outermost coroutine first.

    ``current_frame`` is the frame executing in the loop's thread right now (a signal
    handler's ``frame``); the task running it is shown down to that frame.
    """
    tasks = sorted(asyncio.all_tasks(loop), key=lambda t: t.get_name())
    lines = [f"{len(tasks)} task(s) in {_short(loop, 100)}"]
    for task in tasks:
        coro = task.get_coro()
        waiter: object = getattr(task, "_fut_waiter", None)  # what a pending task awaits
        if task.done():
            state = "done"
        elif getattr(coro, "cr_running", False) or getattr(coro, "gi_running", False):
            state = "running"
        else:
            state = "pending"
        lines.append(f"Task {task.get_name()!r} ({state}):")
        lines.extend(f"    {line}" for line in _await_chain(coro, current_frame, waiter))
    return "\n".join(lines) + "\n"


# -- server side ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HookInfo:
    """What a dump file's header says about the hook that wrote it."""

    path: Path
    pid: int
    start_time: int | None
    signum: int


def _parse_header(line: str, path: Path) -> HookInfo | None:
    parts = line.split()
    if len(parts) != 4 or parts[0] != _HEADER_TAG:
        return None
    try:
        fields = dict(p.split("=", 1) for p in parts[1:])
        start = fields["start"]
        return HookInfo(
            path=path,
            pid=int(fields["pid"]),
            start_time=None if start == "-" else int(start),
            signum=int(fields["signal"]),
        )
    except (KeyError, ValueError):
        return None


def _open_for_reading(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))


def hook_info(pid: int, dump_dir: str | os.PathLike[str] | None = None) -> HookInfo | None:
    """The dump hook of the live process ``pid``, or ``None`` if it has none.

    ``None`` also when the file was left by an earlier process with the same pid (its
    start time differs) or cannot be read.
    """
    path = dump_path_for(pid, dump_dir)
    try:
        fd = _open_for_reading(path)
    except OSError:
        return None
    try:
        first = os.pread(fd, 256, 0).split(b"\n", 1)[0].decode("ascii", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)
    info = _parse_header(first, path)
    if info is None or info.pid != pid:
        return None
    try:
        start = read_start_time(pid)
    except ProcessGoneError:
        return None
    if info.start_time is not None and start is not None and info.start_time != start:
        return None
    return info


def _read_tail(path: Path, offset: int) -> str:
    try:
        fd = _open_for_reading(path)
    except FileNotFoundError:
        return ""
    try:
        data = os.pread(fd, MAX_DUMP_BYTES, offset)
    finally:
        os.close(fd)
    return data.decode("utf-8", "replace")


async def read_dump(
    path: str | os.PathLike[str],
    *,
    offset: int = 0,
    timeout: float = 2.0,
    poll_interval: float = 0.01,
) -> str | None:
    """Wait (at most ``timeout`` seconds) for a complete dump after byte ``offset``.

    Polls the file (``poll_interval``, doubling up to 0.1 s). Returns the dump up to and
    including :data:`END_MARKER`; on timeout, what was written (typically the thread
    stacks alone) plus a note that the dump is incomplete; ``None`` if nothing was.
    """
    if not (math.isfinite(timeout) and timeout >= 0):
        raise ValueError(f"timeout must be a finite number >= 0, got {timeout!r}")
    target = Path(path)
    deadline = anyio.current_time() + timeout
    delay = poll_interval
    while True:
        text = _read_tail(target, offset)
        end = text.find(END_MARKER)
        if end != -1:
            return text[: end + len(END_MARKER)] + "\n"
        remaining = deadline - anyio.current_time()
        if remaining <= 0:
            break
        await anyio.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.1)
    if not text.strip():
        return None
    return (
        text + f"\n[aiotimer: dump incomplete: no end marker within {timeout:g}s; the worker's"
        " main thread did not get to run Python code (stuck in C code holding the GIL?)]\n"
    )


async def collect_dump(
    pid: int,
    *,
    send_signal: Callable[[int], None],
    signum: int | None = None,
    dump_dir: str | os.PathLike[str] | None = None,
    timeout: float = 2.0,
) -> str | None:
    """Ask worker ``pid`` for a stack dump and return it (``None`` if it has no hook).

    Args:
        pid: the worker.
        send_signal: sends a signal to exactly that worker, e.g. the bound method
            ``WorkerProcess.send_signal`` (a pidfd-pinned sender; its errors propagate).
        signum: the signal the hook must listen to; ``None`` uses the one its header
            names. A hook listening to another signal counts as no hook.
        dump_dir: the dump directory (see :func:`dump_path_for`).
        timeout: how long to wait for the end marker (see :func:`read_dump`).

    The worker is signalled only when its dump file's header proves the hook is there,
    installed by this very process (same pid and start time).
    """
    info = hook_info(pid, dump_dir)
    if info is None or (signum is not None and info.signum != signum):
        return None
    try:
        offset = info.path.stat().st_size
    except OSError:
        return None
    send_signal(info.signum)
    return await read_dump(info.path, offset=offset, timeout=timeout)


def py_spy_executable() -> str | None:
    """The ``py-spy`` executable: on ``PATH``, or beside this Python (an unactivated venv)."""
    found = shutil.which("py-spy")
    if found is not None:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if os.access(beside, os.X_OK) else None


async def py_spy_dump(pid: int, *, timeout: float = 10.0) -> str | None:
    """``py-spy dump --pid <pid>`` output, or ``None`` (not installed, failed, timed out).

    py-spy reads the process from outside (ptrace), so it needs no hook in the worker,
    but it needs the permission to trace it (same user and ``ptrace_scope`` 0, or
    ``CAP_SYS_PTRACE``).
    """
    exe = py_spy_executable()
    if exe is None:
        return None
    with anyio.move_on_after(timeout):
        result = await anyio.run_process([exe, "dump", "--pid", str(pid)], check=False)
        if result.returncode == 0:
            return result.stdout.decode("utf-8", "replace")
    return None
