"""The FIFO source: torch-compatible request lines over a named pipe.

How it works:

* **The path** (:mod:`aiotimer.sources._fifo_path`): a missing path gets a new FIFO of
  exactly ``mode``, a stale FIFO of this user is replaced, anything else is refused; the
  marker beside it tells clients an aiotimer server reads it; the path is watched, and a
  FIFO removed from under the server is made anew (the old one is still read).
* **Reading.** Each FIFO is read ``O_NONBLOCK``, with a dummy writer descriptor kept
  open, so the reader never sees end-of-file when clients come and go (no spinning).
  Each wake-up (the loop's ``add_reader``) reads chunks until the pipe is empty or
  ``MAX_READS_PER_WAKE`` chunks were read, feeds each to a
  :class:`~aiotimer.wire.LineDecoder` and hands its batch to the sink, then lets
  the loop run other work: a flood costs other work at most one chunk's decoding. A
  chunk is ``chunk_size`` bytes and at most ``LINES_PER_STEP`` lines
  (:mod:`aiotimer.sources._budget`; the rest of a read waits in the backlog), so
  two-byte garbage lines cost a step what valid lines do.
  The loop is asyncio's (or uvloop), used directly, with the pipe registered once per
  run: a wake-up through it costs a fraction of one through ``anyio.wait_readable`` in
  a cancel scope, which shows when a server that keeps up reads a few lines per
  wake-up (``python -m benchmarks.bench_fifo_wake``). Cancellation is asyncio's own, so
  anyio's cancel scopes around the reader work as usual.
  The decoder bounds a partial line and recovers lines glued to it, so a writer that
  stops mid-line delays nobody.
* **A trickle** (a read that emptied the pipe found little): the reader stops waking at
  every line and reads the pipe once per interval while input keeps trickling in, an
  interval bounded by how soon the acquires it read fall due
  (:mod:`aiotimer.sources._trickle`); the drain below keeps releases from being late.
  Each such read takes up to a sixteenth of the pipe at once (the most the pacing lets
  pile up), so what came in over an interval is one batch, whose blocks begun and
  ended in it never reach the timer table.
  An acquire due sooner than the interval could allow comes with a ring of the bell
  beside the FIFO (:mod:`aiotimer.sources._bell`), which ends the pause at once
  (unless it ends within ``LEAD_SHARE`` of that lead anyway) and says the acquire's
  lead; while every acquire read lately came from a client that
  rings, the interval may grow to ``bell_interval`` (2 s), else ``read_interval``.
* **A flood of garbage.** Once a chunk held :data:`FLOODED` bad lines, the reader sets
  aside, in the next ones, the lines that cannot be requests (no ``scope_id`` key, see
  :mod:`aiotimer.wire._mentions`): they cost a scan, not a decode, and are counted and
  reported as rejections every :data:`JUNK_REPORT_INTERVAL` seconds (the first with its
  exact reason). So a flood of ``{"pid": N}`` lines costs the server about 10 ms of CPU
  per MiB, and the requests among them are not read seconds late.
* **Before an expiry** the server's drain (:class:`FifoReader`) applies what the FIFO held
  for the due workers when the server decided to act (see :mod:`aiotimer.sources._base`):
  its bound (:meth:`FifoReader.hold`) is what was read so far plus what the pipe held then
  (``FIONREAD``: at most the pipe's capacity); what is written later is never waited
  for. It scans what the pipe holds of that bound for the due workers' pids through a
  copy (Linux ``tee(2)``, :mod:`aiotimer.sources._pipepeek`), leaving it in the pipe,
  so clients waiting for room do not all wake and compete with the reap for a CPU; only
  the lines up to the last one that may name a due worker are taken out, into the
  reader's backlog (:mod:`aiotimer.sources._backlog`, at most ``BACKLOG_LIMIT`` bytes).
  Without ``tee`` the drain moves the bound's bytes into the backlog. Then the drain
  takes out of the backlog, decodes and returns only the lines that name a due worker
  (:func:`~aiotimer.wire._mentions.take_due`), leaving the others in order for the read
  loop, which decodes the backlog, a chunk at a time, before it reads the pipe again.
  A backlog full to its limit is decoded from its front, in order, to make room: late,
  never wrong.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
from collections.abc import Mapping
from typing import Final

import anyio
import anyio.abc

from aiotimer.sources._base import RequestSink, draining
from aiotimer.sources._bell import open_bell
from aiotimer.sources._fifo_path import PIPE_SIZE, FifoPath, OpenFifo, check_fifo_mode, grow_pipe
from aiotimer.sources._fifo_reader import (
    BACKLOG_LIMIT,
    MAX_READS_PER_WAKE,
    FifoReader,
)
from aiotimer.sources._trickle import (
    BELL_INTERVAL,
    LEAD_WINDOW,
    READ_INTERVAL,
    bell_lead,
)
from aiotimer.wire import MAX_LINE_BYTES, LineDecoder

__all__ = [
    "BACKLOG_LIMIT",
    "CHUNK_SIZE",
    "MAX_READS_PER_WAKE",
    "PIPE_SIZE",
    "READ_INTERVAL",
    "FifoSource",
    "grow_pipe",
]

#: Bytes per ``read(2)``: also the most input decoded before other work gets a turn.
#: Each read and batch has a fixed cost (the syscall, a loop iteration, the batch's
#: bookkeeping), so bigger reads cost less per line; but 32 KiB of garbage lines
#: costs a few milliseconds to reject (valid lines under 1 ms), and twice that at 64 KiB.
#: See ``python -m benchmarks.bench_ingest_cpu --chunk 16384,32768,65536``. The paced
#: reads of a trickle take up to a sixteenth of the pipe at once (see ``FifoReader``).
CHUNK_SIZE: Final[int] = 32768
logger = logging.getLogger("aiotimer")


class FifoSource:
    """Requests from a named pipe, in torch's line format (implements ``Source``).

    Args:
        path: where the FIFO lives. A missing path is created; a stale FIFO of this user
            is replaced; anything else is refused with :class:`~aiotimer.errors.SourceError`.
        mode: the FIFO's permission bits, applied exactly (umask does not apply); never
            read for group or others (a reader would take the server's requests).
        max_line: the longest accepted line, newline included.
        chunk_size: bytes per ``read(2)``.
        read_interval: while input trickles in, read it at most this often (seconds;
            ``0``: at every line, and no bell), see the module docs.
        bell_interval: the same, while every acquire read lately came from a client
            that rings the bell (aiotimer's); never less than ``read_interval``.
        marker: extra keys for the marker file (e.g. where stack dumps go).

    Raises:
        ValueError: ``mode`` grants read to group or others (or is not permission
            bits), ``chunk_size`` is not positive, ``read_interval`` or
            ``bell_interval`` is negative or
            ``max_line`` is out of range.

    :meth:`serve` may be called again after it returned.
    """

    __slots__ = (
        "_bell_interval",
        "_chunk_size",
        "_marker",
        "_max_line",
        "_mode",
        "_name",
        "_path",
        "_published",
        "_read_interval",
        "_readers",
        "_ringing_interval",
    )

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        mode: int = 0o600,
        max_line: int = MAX_LINE_BYTES,
        chunk_size: int = CHUNK_SIZE,
        read_interval: float = READ_INTERVAL,
        bell_interval: float = BELL_INTERVAL,
        marker: Mapping[str, object] | None = None,
    ) -> None:
        check_fifo_mode(mode)
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        if not read_interval >= 0:
            raise ValueError(f"read_interval must be >= 0 seconds, got {read_interval!r}")
        if not bell_interval >= 0:
            raise ValueError(f"bell_interval must be >= 0 seconds, got {bell_interval!r}")
        LineDecoder(max_line)  # validates max_line now rather than in serve()
        self._path = pathlib.Path(path)
        self._mode = mode
        self._max_line = max_line
        self._chunk_size = chunk_size
        self._read_interval = read_interval
        self._bell_interval = max(read_interval, bell_interval)
        # The readers' limit while their clients ring: the bell's, once it listens.
        self._ringing_interval = read_interval
        self._marker: dict[str, object] = dict(marker or {})
        self._name = f"fifo:{self._path}"
        self._published: FifoPath | None = None
        self._readers: set[FifoReader] = set()  # those reading now: a ring wakes each

    @property
    def name(self) -> str:
        """``"fifo:<path>"``."""
        return self._name

    @property
    def path(self) -> pathlib.Path:
        """The FIFO's path."""
        return self._path

    async def serve(
        self,
        sink: RequestSink,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Create the FIFO, publish the marker, then feed ``sink`` until cancelled.

        Raises:
            SourceError: the path cannot be claimed or opened (see the class docstring).
        """
        hold = FifoPath(self._path, self._mode, self._marker)
        # The bell (made first, so the first marker names it) is rung by clients after
        # an acquire due too soon for the pacing of a trickle; none without pacing.
        bell = open_bell(self._path, self._mode) if self._read_interval > 0 else None
        try:
            if bell is not None:
                self._marker["bell"] = str(bell.path)
                self._marker["bell_lead"] = bell_lead(self._bell_interval)
                self._marker["bell_window"] = LEAD_WINDOW
                bell.listen(asyncio.get_running_loop(), self._ring_readers)
                self._ringing_interval = self._bell_interval
            first = hold.open()
            async with anyio.create_task_group() as tg:

                def read(fifo: OpenFifo) -> None:
                    tg.start_soon(self._read, fifo, sink)

                read(first)
                self._published = hold
                task_status.started()
                await hold.keep(read)
        finally:
            self._published = None
            try:
                hold.close()
            finally:
                if bell is not None:
                    self._ringing_interval = self._read_interval
                    for key in ("bell", "bell_lead", "bell_window"):
                        self._marker.pop(key, None)
                    bell.close()

    def advertise(self, keys: Mapping[str, object | None]) -> None:
        """Set extra keys of the marker (a ``None`` value removes its key); the marker
        is published again at once while the source serves. Call it in the loop's thread."""
        for key, value in keys.items():
            if value is None:
                self._marker.pop(key, None)
            else:
                self._marker[key] = value
        if self._published is not None:
            self._published.republish()

    async def _read(self, fifo: OpenFifo, sink: RequestSink) -> None:
        with fifo.reading:
            reader = FifoReader(
                fifo.read_fd,
                sink,
                self._name,
                chunk_size=self._chunk_size,
                max_line=self._max_line,
                interval=self._read_interval,
                bell_interval=self._ringing_interval,
            )
            self._readers.add(reader)
            try:
                with draining(sink, reader):
                    await reader.run()
            finally:
                self._readers.discard(reader)
                reader.close()
                if fifo.reading.cancel_called:  # evicted (or the run ends): close it
                    fifo.close()

    def _ring_readers(self, lead: float | None) -> None:
        for reader in self._readers:
            reader.ring(lead)

    def __repr__(self) -> str:
        return f"<FifoSource {str(self._path)!r} mode={self._mode:#o}>"
