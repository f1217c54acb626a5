"""Stack dumps, server side: read a hooked worker's dump, or ask py-spy.

:func:`collect_dump` checks the worker's header (same pid, same process start time, and
the signal the server expects: never one the header merely names), notes the file's
size, sends the signal through the caller's ``send_signal`` (a pidfd-pinned sender),
and waits, bounded, for the end marker (:func:`read_dump`).

Nothing here can block the event loop on a file an outsider controls: the file is
opened ``O_NONBLOCK | O_NOFOLLOW`` and read only if it is a regular file of this user in
a private directory (:mod:`aiotimer._edges.files`), and every open and read runs in a
worker thread. A worker without the hook is never signalled: the default action of
``SIGUSR1`` would kill it. :func:`py_spy_dump` is the external fallback when ``py-spy``
is installed. The worker side (the hook, the file's format) is :mod:`aiotimer.diagnostics`.
"""

from __future__ import annotations

import logging
import math
import os
import selectors
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import anyio
import anyio.to_thread

from aiotimer._edges.files import check_private_dir, open_owned
from aiotimer._edges.procfs import read_start_time
from aiotimer.errors import ProcessGoneError
from aiotimer.reapers._stackbound import StackCaps, StackTextBound
from aiotimer.wire import (
    DEFAULT_DUMP_SIGNAL,
    END_MARKER,
    HEADER_TAG,
    MAX_DUMP_BYTES,
    dump_path_for,
)

logger = logging.getLogger("aiotimer")

__all__ = [
    "END_GRACE",
    "PY_SPY_CAPS",
    "HookInfo",
    "NoDump",
    "collect_dump",
    "collect_dump_or_why",
    "hook_info",
    "prepare_dump",
    "py_spy_dump",
    "py_spy_dump_or_why",
    "py_spy_executable",
    "read_dump",
    "read_dump_or_why",
]


@dataclass(frozen=True, slots=True)
class NoDump:
    """Why no stack dump came: what a reaper's ``dump_stacks`` returns instead of text,
    so the ``stacks_dumped`` event can say it (no hook, no py-spy, timed out ...)."""

    reason: str


#: How a worker gets the hook, for the reason a dump did not come.
_HOOK_HINT = (
    "the worker installs it with aiotimer.configure(), with its first block in the main "
    "thread when it finds its server through the environment, or with "
    "aiotimer.diagnostics.install_dump_handler()"
)


@dataclass(frozen=True, slots=True)
class HookInfo:
    """What a dump file's header says about the hook that wrote it."""

    path: Path
    pid: int
    start_time: int | None
    signum: int


def _parse_header(line: str, path: Path) -> HookInfo | None:
    parts = line.split()
    if len(parts) != 4 or parts[0] != HEADER_TAG:
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


def _open_checked(path: Path) -> int:
    """Open ``path`` for reading without blocking, if it is a regular file of this user
    in a private directory.

    Raises:
        OSError: it is anything else (a FIFO, a symlink, another user's file ...).
    """
    check_private_dir(path.parent, what="dump directory")
    return open_owned(path, what="dump file")


def hook_info(pid: int, dump_dir: str | os.PathLike[str] | None = None) -> HookInfo | None:
    """The dump hook of the live process ``pid``, or ``None`` if it has none.

    ``None`` also when the file was left by an earlier process with the same pid (its
    start time differs), cannot be read, or is not a regular file of this user in a
    private directory. Never blocks on the file (:func:`collect_dump` still calls it in
    a worker thread: a disk can be slow).
    """
    path = dump_path_for(pid, dump_dir)
    try:
        fd = _open_checked(path)
    except OSError as exc:
        if not isinstance(exc, FileNotFoundError):
            logger.warning("stack dump of worker %d: %s", pid, exc)
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
        fd = _open_checked(path)
    except OSError:
        return ""
    try:
        data = os.pread(fd, MAX_DUMP_BYTES, offset)
    finally:
        os.close(fd)
    return data.decode("utf-8", "replace")


def _size(path: Path) -> int | None:
    try:
        fd = _open_checked(path)
    except OSError:
        return None
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


#: Seconds :func:`read_dump` waits for a dump's end marker once its first part came.
END_GRACE: Final[float] = 1.0


async def read_dump(
    path: str | os.PathLike[str],
    *,
    offset: int = 0,
    timeout: float = 2.0,
    poll_interval: float = 0.01,
) -> str | None:
    """Wait (at most ``timeout`` seconds) for a complete dump after byte ``offset``.

    Polls the file (``poll_interval``, doubling up to 0.1 s). Returns the dump up to and
    including :data:`END_MARKER`. The thread stacks come from the worker's signal
    handler at once, the rest only when its main thread runs Python again, which one
    stuck in C code does not: once the first part came, the marker is awaited at most
    :data:`END_GRACE` seconds more. Without it, returns what was written (typically the
    thread stacks alone, kept even if the worker removed its file meanwhile) plus a
    note that the dump is incomplete; ``None`` if nothing was.
    """
    if not (math.isfinite(timeout) and timeout >= 0):
        raise ValueError(f"timeout must be a finite number >= 0, got {timeout!r}")
    target = Path(path)
    started = anyio.current_time()
    deadline = started + timeout
    delay = poll_interval
    text = ""
    while True:
        # The longest read wins: a worker that exits meanwhile removes its file.
        text = max(text, await anyio.to_thread.run_sync(_read_tail, target, offset), key=len)
        end = text.find(END_MARKER)
        if end != -1:
            return text[: end + len(END_MARKER)] + "\n"
        now = anyio.current_time()
        if text and deadline > now + END_GRACE:
            deadline = now + END_GRACE  # the first part came: the rest soon, or never
        remaining = deadline - now
        if remaining <= 0:
            break
        await anyio.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.1)
    if not text.strip():
        return None
    waited = anyio.current_time() - started
    return (
        text + f"\n[aiotimer: dump incomplete: no end marker within {waited:.3g}s; the "
        "worker's main thread did not get to run Python code (stuck in C code?)]\n"
    )


async def collect_dump(
    pid: int,
    *,
    send_signal: Callable[[int], None],
    signum: int = DEFAULT_DUMP_SIGNAL,
    dump_dir: str | os.PathLike[str] | None = None,
    timeout: float = 2.0,
) -> str | None:
    """Ask worker ``pid`` for a stack dump and return it (``None`` if it has no hook).

    Args:
        pid: the worker.
        send_signal: sends a signal to exactly that worker, e.g. the bound method
            ``PinnedProcess.send_signal`` (a pidfd-pinned sender; its errors propagate).
        signum: the signal the hook must listen to (the server's choice: a header
            naming another signal counts as no hook, and is never obeyed).
        dump_dir: the dump directory (see :func:`dump_path_for`).
        timeout: how long to wait for the end marker (see :func:`read_dump`).

    The worker is signalled only when its dump file's header proves the hook is there,
    installed by this very process (same pid and start time).
    :func:`collect_dump_or_why` says why when no dump comes.
    """
    result = await collect_dump_or_why(
        pid, send_signal=send_signal, signum=signum, dump_dir=dump_dir, timeout=timeout
    )
    return result if isinstance(result, str) else None


async def collect_dump_or_why(
    pid: int,
    *,
    send_signal: Callable[[int], None],
    signum: int = DEFAULT_DUMP_SIGNAL,
    dump_dir: str | os.PathLike[str] | None = None,
    timeout: float = 2.0,
) -> str | NoDump:
    """:func:`collect_dump`, with the reason instead of ``None`` when no dump came."""
    prepared = await anyio.to_thread.run_sync(prepare_dump, pid, signum, dump_dir)
    if isinstance(prepared, NoDump):
        return prepared
    send_signal(signum)
    return await read_dump_or_why(prepared, timeout=timeout)


def prepare_dump(
    pid: int, signum: int = DEFAULT_DUMP_SIGNAL, dump_dir: str | os.PathLike[str] | None = None
) -> tuple[Path, int] | NoDump:
    """Before signalling worker ``pid`` for a dump: its dump file and the offset its
    next dump starts at, or why it must not be signalled (no hook of its own, a hook
    listening to another signal). Reads two small files: call it in a worker thread, or
    where a short blocking read is acceptable."""
    info = hook_info(pid, dump_dir)
    if info is None:
        where = dump_path_for(pid, dump_dir)
        return NoDump(f"no dump hook in the worker (no valid {where}; {_HOOK_HINT})")
    if info.signum != signum:
        return NoDump(
            f"the worker's dump hook listens to signal {info.signum}, not {signum}: "
            "it is not signalled"
        )
    offset = _size(info.path)
    if offset is None:
        return NoDump(f"the worker's dump file {info.path} vanished")
    return info.path, offset


async def read_dump_or_why(prepared: tuple[Path, int], *, timeout: float) -> str | NoDump:
    """:func:`read_dump` of a dump asked for after :func:`prepare_dump`, or why none came."""
    text = await read_dump(prepared[0], offset=prepared[1], timeout=timeout)
    if text is None:
        return NoDump(f"the worker's dump hook wrote nothing within {timeout:g}s")
    return text


def py_spy_executable() -> str | None:
    """The ``py-spy`` executable: on ``PATH``, or beside this Python (an unactivated venv)."""
    found = shutil.which("py-spy")
    if found is not None:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if os.access(beside, os.X_OK) else None


#: How many times :func:`py_spy_dump_or_why` runs a py-spy that keeps crashing.
PY_SPY_ATTEMPTS: Final[int] = 3
#: How much of py-spy's output is kept (see :class:`~aiotimer.reapers._stackbound.StackCaps`):
#: at most about 1.3 MB of text per dump, whatever the worker's stacks.
PY_SPY_CAPS: Final[StackCaps] = StackCaps()
_CHUNK: Final[int] = 64 * 1024
_MAX_STDERR: Final[int] = 16 * 1024


async def py_spy_dump(pid: int, *, timeout: float = 10.0) -> str | None:
    """``py-spy dump --full-filenames --pid <pid>`` output, or ``None`` (not installed,
    failed, timed out).

    py-spy reads the process from outside (ptrace), so it needs no hook in the worker,
    but it needs the permission to trace it (same user and ``ptrace_scope`` 0, or
    ``CAP_SYS_PTRACE``). :func:`py_spy_dump_or_why` says why when no dump comes.
    """
    result = await py_spy_dump_or_why(pid, timeout=timeout)
    return result if isinstance(result, str) else None


async def py_spy_dump_or_why(pid: int, *, timeout: float = 10.0) -> str | NoDump:
    """:func:`py_spy_dump`, with the reason instead of ``None`` when no dump came.

    py-spy's output is as large as the worker makes it (threads, depth, name lengths),
    so it is read as it streams, in a worker thread, into a bounded copy
    (:class:`~aiotimer.reapers._stackbound.StackTextBound` with :data:`PY_SPY_CAPS`: lines
    cut to 512 characters, 50 frames per thread, 50 threads, 16 MiB read, then py-spy is
    stopped); the text ends with a note of what was left out. Nothing of it is held or
    parsed in the event loop.

    A py-spy that dies of a signal (it reads a live process's memory, and can crash
    when the process changes under it) is run again while ``timeout`` lasts, at most
    :data:`PY_SPY_ATTEMPTS` times in all; a refusal (exit status > 0) is not retried.
    """
    exe = py_spy_executable()
    if exe is None:
        return NoDump("py-spy is not installed")
    argv = [exe, "dump", "--full-filenames", "--pid", str(pid)]
    stop = threading.Event()
    deadline = time.monotonic() + max(0.0, timeout)
    try:
        return await anyio.to_thread.run_sync(
            _py_spy_attempts, argv, deadline, timeout, stop, abandon_on_cancel=True
        )
    finally:
        stop.set()  # cancelled: the thread stops py-spy and ends


def _py_spy_attempts(
    argv: list[str], deadline: float, timeout: float, stop: threading.Event
) -> str | NoDump:
    why = NoDump(f"py-spy timed out after {timeout:g}s")
    for attempt in range(1, PY_SPY_ATTEMPTS + 1):
        result = _py_spy_once(argv, deadline, stop)
        if result is None:
            return why  # timed out, or stopped
        code, out, err = result
        if code == 0 or (out is not None and code is None):
            return out or ""
        lines = err.strip().splitlines()
        tries = f", {attempt} attempts" if attempt > 1 else ""
        why = NoDump(
            f"py-spy failed (exit status {code}{tries}"
            + (f": {lines[-1][:200]})" if lines else ")")
        )
        if code is None or code > 0:
            break
    return why


def _py_spy_once(
    argv: list[str], deadline: float, stop: threading.Event
) -> tuple[int | None, str | None, str] | None:
    """Run py-spy once: ``(exit status, bounded output, stderr's end)``; the status is
    ``None`` when its output reached the read cap (py-spy is then stopped, and the
    output kept). ``None`` when ``deadline`` passed or ``stop`` was set first."""
    bound = StackTextBound(PY_SPY_CAPS)
    err = bytearray()
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    except OSError as exc:
        return 127, None, str(exc)
    assert proc.stdout is not None and proc.stderr is not None
    capped = False
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            sel.register(proc.stderr, selectors.EVENT_READ)
            while sel.get_map() and not capped:
                left = deadline - time.monotonic()
                if left <= 0 or stop.is_set():
                    return None
                for key, _ in sel.select(min(left, 0.1)):
                    chunk = os.read(key.fd, _CHUNK)
                    if not chunk:
                        sel.unregister(key.fileobj)
                    elif key.fileobj is proc.stdout:
                        capped = not bound.feed(chunk)
                    elif len(err) < _MAX_STDERR:
                        err += chunk[: _MAX_STDERR - len(err)]
        if capped:
            return None, bound.text(), ""
        code = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    return code, bound.text(), err.decode("utf-8", "replace")
