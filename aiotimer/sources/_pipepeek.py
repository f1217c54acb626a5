"""Reading what a pipe holds without taking it out: Linux ``tee(2)``.

Why
---
Before an expiry the FIFO's drain must see everything the pipe holds, to find a release
of a due worker written before the deadline. Reading it all empties a full pipe at once,
and every client blocked on it wakes and refills it: up to a pipe's worth of writes
(a megabyte, milliseconds of CPU) competing with the server for a CPU just when it is
about to reap, so the reap's latency grew with the pipe's size under load. ``tee(2)``
duplicates the pipe's contents into a private pipe without consuming them (page
references, no copy in the kernel); the private pipe is then read. Nobody wakes, and
the drain takes out of the FIFO only the lines it has to apply.

``tee`` is not in :mod:`os`; it is called through :mod:`ctypes` from the C library.
Where it is missing (not Linux), or the private pipe cannot hold as much as the
pipe peeked at, :func:`open_peek` returns ``None`` and the caller reads instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
from collections.abc import Callable
from typing import Final

__all__ = ["PipePeek", "open_peek", "read_exactly"]

_SPLICE_F_NONBLOCK: Final[int] = 2


def _load_tee() -> Callable[[int, int, int, int], int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        tee = libc.tee
    except (OSError, AttributeError):
        return None
    tee.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_uint)
    tee.restype = ctypes.c_ssize_t
    result: Callable[[int, int, int, int], int] = tee
    return result


_TEE: Final = _load_tee()


def read_exactly(fd: int, size: int) -> bytes:
    """``size`` bytes from the non-blocking pipe ``fd``, in as many reads as it takes;
    fewer only if it holds fewer (someone else read it, or its writers are gone)."""
    parts: list[bytes] = []
    while size > 0:
        try:
            data = os.read(fd, size)
        except BlockingIOError:
            break
        if not data:
            break
        parts.append(data)
        size -= len(data)
    return parts[0] if len(parts) == 1 else b"".join(parts)


class PipePeek:
    """Copies of what a pipe holds, its contents left in place (see the module docs).

    Owns a private pipe at least as large as the pipe it peeks at; :meth:`close` it.
    """

    __slots__ = ("_r", "_size", "_tee", "_w")

    def __init__(self, tee: Callable[[int, int, int, int], int], r: int, w: int, size: int) -> None:
        self._tee = tee
        self._r, self._w, self._size = r, w, size

    def peek(self, fd: int) -> bytes:
        """What the pipe ``fd`` holds now (``b""`` when empty), still unread there.

        Raises:
            OSError: ``tee(2)`` failed other than for an empty pipe.
        """
        n = self._tee(fd, self._w, self._size, _SPLICE_F_NONBLOCK)
        if n < 0:
            err = ctypes.get_errno()
            if err == errno.EAGAIN:
                return b""
            raise OSError(err, f"tee: {os.strerror(err)}")
        return read_exactly(self._r, n)

    def close(self) -> None:
        """Close the private pipe."""
        for fd in (self._r, self._w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._r = self._w = -1


def open_peek(fd: int) -> PipePeek | None:
    """A :class:`PipePeek` for the pipe ``fd``, or ``None`` where one cannot work: no
    ``tee(2)``, or no private pipe as large as ``fd``'s (then part of a full pipe could
    not be seen)."""
    get_size = getattr(fcntl, "F_GETPIPE_SZ", None)
    set_size = getattr(fcntl, "F_SETPIPE_SZ", None)
    if _TEE is None or get_size is None or set_size is None:
        return None
    try:
        need = fcntl.fcntl(fd, get_size)
        r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        size = fcntl.fcntl(w, set_size, need)
    except OSError:
        size = 0
    if size < need:
        for each in (r, w):
            os.close(each)
        return None
    return PipePeek(_TEE, r, w, size)
