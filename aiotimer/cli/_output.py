"""Writing to a stream nobody may read, without ever blocking for long.

``aiotimer run``'s log lines and its final summary table go to stderr, which may be a
pipe whose reader is gone or stuck. A plain write would then block for ever: the log
writer thread holding its handler's lock, the summary ``print`` after the work is done,
and ``logging.shutdown()`` at exit behind both. :func:`write_within` waits for the
stream at most ``timeout`` seconds, writes in pieces the pipe takes without blocking, and
drops the rest; :class:`BoundedStream` (:func:`bounded`) is a text stream that writes
that way, for a log handler and the summary, and says how much it dropped once the
stream moves again.
"""

from __future__ import annotations

import io
import os
import select
import time
from typing import IO, Final, cast

__all__ = ["BoundedStream", "bounded", "write_within"]

#: A write of at most this many bytes to a pipe that polls writable never blocks.
_PIECE: Final[int] = select.PIPE_BUF


def write_within(fd: int, text: str | bytes, timeout: float) -> int:
    """Write ``text`` to ``fd`` within ``timeout`` seconds; return how many bytes were
    dropped (0: all written).

    The descriptor stays as it is (blocking or not: other processes may share it); each
    piece is written only once ``poll`` says the stream takes it.
    """
    raw = text.encode(errors="replace") if isinstance(text, str) else text
    data = memoryview(raw)
    deadline = time.monotonic() + timeout
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    while data:
        left = max(0.0, deadline - time.monotonic())
        if not poller.poll(left * 1000):  # poll(0) still takes what fits now
            break
        try:
            written = os.write(fd, data[:_PIECE])
        except BlockingIOError:
            continue
        except OSError:
            break  # EPIPE, EBADF...: nothing more can be written
        data = data[written:]
    return len(data)


class BoundedStream(io.TextIOBase):
    """A text stream over ``fd`` whose writes wait at most ``timeout`` seconds each
    (see :func:`write_within`), and not at all while the stream is stuck (the last
    write dropped something); what they drop is counted and, once a write goes through
    again, noted in the stream itself."""

    def __init__(self, fd: int, timeout: float) -> None:
        super().__init__()
        self._fd = fd
        self._timeout = timeout
        self.dropped = 0
        self._noted = 0
        self._stuck = False

    def write(self, text: str) -> int:
        """Write ``text`` (or drop what does not go in time); its length."""
        timeout = 0.0 if self._stuck else self._timeout
        if self.dropped != self._noted:
            note = f"\n[{self.dropped - self._noted:,} bytes dropped: the stream was not read]\n"
            if write_within(self._fd, note, timeout) == 0:
                self._noted = self.dropped
        lost = write_within(self._fd, text, timeout)
        self.dropped += lost
        self._stuck = lost > 0
        return len(text)

    def fileno(self) -> int:
        """The descriptor written to."""
        return self._fd

    def writable(self) -> bool:
        """Always."""
        return True


def bounded(stream: IO[str], timeout: float) -> IO[str]:
    """``stream`` as a :class:`BoundedStream` over its descriptor; ``stream`` itself when
    it has none (an in-memory capture, which never blocks)."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both
        return stream
    return cast("IO[str]", BoundedStream(fd, timeout))
