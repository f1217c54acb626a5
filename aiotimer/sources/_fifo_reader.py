"""Reading one FIFO: the read loop and the drain the server runs before an expiry.

Split from :mod:`aiotimer.sources.fifo` (which owns the path, the marker, the bell and
the source's lifecycle); that module's docs tell how reading, trickles, floods of
garbage and the drain work. Here: :class:`FifoReader`, one per open FIFO.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import fcntl
import logging
import math
import os
import termios
import time
from collections.abc import Set as AbstractSet
from typing import Final

from aiotimer.sources._backlog import Backlog
from aiotimer.sources._base import RequestSink
from aiotimer.sources._budget import lines_end
from aiotimer.sources._fifo_path import PIPE_SIZE
from aiotimer.sources._pipepeek import open_peek, read_exactly
from aiotimer.sources._trickle import (
    EMPTY_READS,
    LEAD_SHARE,
    Leads,
    next_interval,
    paced,
    shortest_lead,
)
from aiotimer.wire import Decoded, LineDecoder, Rejection, mentions_end, split_junk

__all__ = ["BACKLOG_LIMIT", "FLOODED", "JUNK_REPORT_INTERVAL", "MAX_READS_PER_WAKE", "FifoReader"]

#: Upper bound on reads per wake-up, so one busy FIFO cannot starve the event loop.
MAX_READS_PER_WAKE: Final[int] = 16
#: The most bytes a reader holds read from its pipe but not decoded yet (its backlog,
#: filled by the server's drain before an expiry; see :class:`FifoReader`). Clients count
#: these bytes as delivered, so the backlog is bounded: two pipes' worth, so that a
#: drain can always take in a full pipe on top of a backlog of one.
BACKLOG_LIMIT: Final[int] = 2 * PIPE_SIZE

#: A chunk with this many bad lines makes the reader set aside, in the next, the lines
#: that cannot be requests (a flood of garbage then costs a scan, not a decode).
FLOODED: Final[int] = 64
#: How often lines set aside in a flood are reported (seconds).
JUNK_REPORT_INTERVAL: Final[float] = 0.25
_NOT_A_REQUEST: Final[str] = (
    "not a request (no scope_id key); one of many such lines in a flood, counted, not decoded"
)

logger = logging.getLogger("aiotimer")


class FifoReader:
    """Reads one FIFO: the read loop, and the drain the server runs before an expiry
    (a :class:`~aiotimer.sources._base.Drain`).

    The drain's bound (:meth:`hold`) is the stream's offset at the decision: what was
    read so far plus what the pipe holds (``FIONREAD``). Each pass (:meth:`look`) scans
    what the pipe holds of it without taking it out (:mod:`aiotimer.sources._pipepeek`),
    moves into the backlog only the lines up to the last one that may name a due worker
    (:func:`~aiotimer.wire._mentions.mentions_end`), and its steps take out of the
    backlog, decode and return the lines that name one
    (:func:`~aiotimer.wire._mentions.take_due`), leaving the others in order for the read
    loop. The read loop decodes the backlog (:class:`~aiotimer.sources._backlog.Backlog`)
    before it reads the pipe again, so every byte is decoded once.
    """

    __slots__ = (
        "_backlog",
        "_bell_interval",
        "_chunk_size",
        "_decoder",
        "_fd",
        "_flooded",
        "_interval",
        "_junk",
        "_junk_due",
        "_junk_sample",
        "_last_read",
        "_leads",
        "_limit",
        "_lines",
        "_pause_end",
        "_peek",
        "_pids",
        "_pipe_done",
        "_read_at",
        "_read_total",
        "_rung",
        "_sink",
        "_trickle_max",
        "_waiting",
        "name",
    )

    def __init__(
        self,
        fd: int,
        sink: RequestSink,
        name: str,
        *,
        chunk_size: int,
        max_line: int,
        interval: float,
        bell_interval: float = 0.0,
    ) -> None:
        self._fd = fd
        # The longest intervals between the reads of a trickle: with a client that does
        # not ring among those read lately, and without (see aiotimer.sources._trickle;
        # no bell: ``interval`` alone).
        self._interval = interval
        self._bell_interval = bell_interval
        # Read every interval, the pipe holds at most a quarter of its capacity.
        self._trickle_max = _capacity(fd) // 4
        # The shortest times to their deadlines of the acquires read lately (see
        # aiotimer.sources._trickle).
        self._leads = Leads()
        # When the read before the current one began (monotonic): what is read now was
        # written since, or left in the pipe then (see shortest_lead).
        self._last_read = math.inf
        self._read_at = math.inf
        # The bell rang since the last read began: the pipe holds an acquire due soon.
        self._rung = False
        # When the read loop's pause between the reads of a trickle ends (monotonic;
        # math.inf: it is not pausing).
        self._pause_end = math.inf
        self._sink = sink
        self.name = name  # the source's, which its batches are applied under
        self._chunk_size = chunk_size
        self._decoder = LineDecoder(max_line)  # the stream's, in arrival order
        self._lines = LineDecoder(max_line)  # the drain's, for whole lines taken out
        # Read from the pipe, not decoded yet.
        self._backlog = Backlog()
        self._read_total = 0  # bytes read from the pipe so far
        self._limit = 0  # the drain's bound: the stream's offset at the decision
        self._pids: AbstractSet[int] | None = None  # the current pass's workers
        self._pipe_done = True  # the pass has taken in what it needs of the pipe
        self._waiting: asyncio.Future[None] | None = None  # the read loop's wait for input
        self._flooded = False  # the last chunk held at least FLOODED bad lines
        self._junk = 0  # lines set aside as junk, not reported yet
        self._junk_sample = b""  # the first of them
        self._junk_due = 0.0  # when to report them (monotonic)
        self._peek = open_peek(fd)  # None: the drain reads the pipe instead

    def close(self) -> None:
        """Release what the reader holds besides the FIFO (the peek's private pipe)."""
        if self._peek is not None:
            self._peek.close()
            self._peek = None

    def hold(self) -> None:
        """A decision begins: bound the drain to what was read so far and what the pipe
        holds now; what is written after this is the read loop's alone."""
        self._limit = self._read_total + _in_pipe(self._fd)

    def look(self, pids: AbstractSet[int] | None) -> bool:
        """Begin a pass for ``pids`` over the bounded input: take into the backlog the
        part of what the pipe held that may name one of them; ``True`` if there is input
        to step through (the backlog, or more of the pipe's part)."""
        self._pids = None if pids is None else frozenset(pids)
        self._backlog.rewind()
        self._pipe_done = False
        self._pull()
        partial = self._backlog.at_front and self._decoder.pending > 0
        return not self._pipe_done or self._backlog.names(pids, partial=partial)

    def step(self) -> Decoded | None:
        """Decode the next part of what this pass must apply and return it for the
        server to apply (possibly empty); ``None`` once the bounded input holds nothing
        more for the pass's workers."""
        backlog = self._backlog
        batch = backlog.pass_step(self._pids, self._decoder, self._lines, self._chunk_size)
        if batch is not None:
            return batch
        if self._pipe_done:
            return None
        if len(backlog) >= BACKLOG_LIMIT:
            # No room for the rest of the pipe's part: decode the front in order, as
            # the read loop would, to make some (late, never wrong).
            return self._decode(backlog.take(self._chunk_size))
        self._pull()
        return Decoded()

    def _pull(self) -> None:
        """Move into the backlog what the pipe still holds of the bound that the pass
        needs: up to its last line that may name one of the pass's workers (all of it
        without a peek), as much as the backlog has room for."""
        owed = self._limit - self._read_total
        room = BACKLOG_LIMIT - len(self._backlog)
        if owed <= 0 or self._pipe_done:
            self._pipe_done = True
            return
        if room <= 0:
            return
        need = owed
        if self._peek is not None:
            try:
                peeked = self._peek.peek(self._fd)
            except OSError as exc:
                logger.warning("cannot copy what the FIFO holds (%s); reading it instead", exc)
                self._peek.close()
                self._peek = None
            else:
                tail, newline = self._backlog.tail()
                view = tail + peeked[:owed]
                partial = not newline and self._decoder.pending > 0
                need = mentions_end(view, self._pids, partial=partial) - len(tail)
        if need <= 0:
            self._pipe_done = True
            return
        taken = read_exactly(self._fd, min(need, room))
        self._read_total += len(taken)
        if len(taken) >= need or len(taken) < min(need, room):
            self._pipe_done = True  # all it needs (or the pipe had less: another reader)
        if taken:
            self._backlog.append(taken)
            self._wake_loop()  # the backlog is to read

    def _feed(self, chunk: bytes, size: int) -> bool:
        """Decode ``chunk`` (read ``size`` bytes at a time) and submit what it held;
        ``True`` if it held anything."""
        batch = self._decode(chunk)
        if batch.requests or batch.rejections:
            if len(chunk) < size and self._interval > 0:
                # A short read (a trickle, maybe): how soon its acquires fall due.
                lead, mute = shortest_lead(batch.requests, self._last_read)
                self._leads.note(lead, time.monotonic(), mute=mute)
            self._sink.submit(batch, self.name)
            return True
        return False

    def _decode(self, chunk: bytes) -> Decoded:
        """Decode ``chunk``, the stream's next bytes (see :meth:`_decode_flooded`)."""
        if self._flooded:
            return self._decode_flooded(chunk)
        batch = self._decoder.feed(chunk)
        self._flooded = len(batch.rejections) >= FLOODED
        return batch

    def _decode_flooded(self, chunk: bytes) -> Decoded:
        """Decode ``chunk`` when the last one held :data:`FLOODED` bad lines or more:
        the lines that cannot be requests (:func:`~aiotimer.wire._mentions.split_junk`)
        cost a scan, not a decode; they are counted, and reported as rejections (the
        first with its exact reason) every :data:`JUNK_REPORT_INTERVAL` seconds, when
        the flood ends and when the pipe is read to its end, so a flood costs a bounded
        number of events too. Back to plain
        decoding once a chunk holds fewer."""
        candidates, junk = split_junk(chunk, partial=self._decoder.pending > 0)
        batch = self._decoder.feed(candidates)
        if junk:
            if not self._junk:
                self._junk_sample = junk[0]
            self._junk += len(junk)
        self._flooded = len(junk) >= FLOODED
        if self._junk:
            now = time.monotonic()
            if not self._flooded or now >= self._junk_due:
                self._junk_due = now + JUNK_REPORT_INTERVAL
                batch.rejections += self._junk_rejections()
        return batch

    def _report_junk(self) -> None:
        """Submit the rejections of the lines set aside and not reported yet, if any."""
        if self._junk:
            self._sink.submit(Decoded(rejections=self._junk_rejections()), self.name)

    def _junk_rejections(self) -> list[Rejection]:
        """The rejections of the lines set aside since the last report (and reset)."""
        sample, count = self._junk_sample, self._junk
        self._junk, self._junk_sample = 0, b""
        first = self._lines.feed(sample + b"\n").rejections[:1]
        return first + [Rejection.of(_NOT_A_REQUEST, sample)] * (count - len(first))

    async def run(self) -> None:
        """Decode the backlog, then what the pipe holds, a chunk at a time; forever."""
        loop = asyncio.get_running_loop()
        # Registered once for the whole run (a registration per wake-up costs two
        # epoll_ctl calls and, on uvloop, more than the rest of a short wake-up); while
        # the loop is busy with input, the pipe stays readable and the callback finds no
        # wait to end.
        loop.add_reader(self._fd, self._wake_loop)
        try:
            await self._run(loop)
        finally:
            loop.remove_reader(self._fd)
            self._report_junk()

    def _wake_loop(self) -> None:
        """End the read loop's wait for input, if it waits (the pipe is readable, or the
        drain moved its contents into the backlog)."""
        waiting = self._waiting
        if waiting is not None and not waiting.done():
            waiting.set_result(None)

    async def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            if self._backlog:
                await asyncio.sleep(0)  # what anyio's checkpoint does on asyncio
            else:
                self._report_junk()  # the flood (if any) is read: say how much of it
                self._waiting = waiting = loop.create_future()
                try:
                    await waiting
                finally:
                    self._waiting = None
                self._read_at = math.inf  # woken by the input: it was written just now
            if self._trickle(await self._read_available(self._chunk_size)):
                await self._coalesce(loop)

    def _trickle(self, read: int | None) -> bool:
        """Whether a turn that read ``read`` bytes and emptied the pipe (``None``: it
        did not) read a trickle, worth reading every interval instead: some input,
        little enough that the pipe holds that much several times over, and no acquire
        so close to its deadline that reading later could miss it."""
        return read is not None and 0 < read <= self._trickle_max and self._next_interval() > 0

    async def _read_available(self, chunk_size: int) -> int | None:
        """Decode the backlog, then what the pipe holds, ``chunk_size`` bytes at a time,
        each handed to the sink as one batch, up to ``MAX_READS_PER_WAKE`` chunks: the
        bytes read from the pipe if that emptied it, else ``None``."""
        fd, read = self._fd, os.read
        backlog = self._backlog
        self._rung = False  # what a ring so far was for is in the pipe: read below
        self._last_read, self._read_at = self._read_at, time.monotonic()
        total = 0
        short = False  # the last read(2) found less than a chunk: it emptied the pipe
        for _ in range(MAX_READS_PER_WAKE):
            if backlog:
                chunk = backlog.take(chunk_size)
            else:
                try:
                    chunk = read(fd, chunk_size)
                except BlockingIOError:
                    return total
                self._read_total += len(chunk)
                total += len(chunk)
                short = len(chunk) < chunk_size
                end = lines_end(chunk)
                if end < len(chunk):  # garbage: the rest waits for the next step
                    backlog.append(chunk[end:])
                    chunk = chunk[:end]
            emptied = short and not backlog
            if self._feed(chunk, chunk_size) and not emptied:
                # One chunk at a time: the sink handles the deadlines that fell
                # meanwhile, and the loop runs other work, before the next chunk.
                await asyncio.sleep(0)
            if emptied:
                return total  # a short read emptied the pipe; skip the read that says EAGAIN
        return None

    async def _coalesce(self, loop: asyncio.AbstractEventLoop) -> None:
        """Input trickles in: read it every ``interval`` seconds rather than at each
        line, until a read finds the pipe empty, or more than a trickle (see the
        module docs); sooner when the input's rate would fill a sixteenth of the pipe
        (writers keep room for a burst). Each such read takes up to that sixteenth in
        one chunk (at least ``chunk_size``), so that what came in over an interval is
        one batch, whose blocks begun and ended in it never reach the timer table
        (:mod:`aiotimer.core._fold`)."""
        fd, room = self._fd, self._trickle_max // 4
        size = max(self._chunk_size, room)
        loop.remove_reader(fd)
        try:
            empty = 0  # reads in a row that found nothing
            pace = math.inf  # the interval at which the input rate fills ``room``
            while empty < EMPTY_READS:
                slept = loop.time()
                await self._pause(loop, min(self._next_interval(), pace))
                read = await self._read_available(size)
                if read:
                    pace = paced(loop.time() - slept, read, room)
                if read == 0:
                    empty += 1
                elif self._trickle(read):
                    empty = 0
                else:
                    return
        finally:
            loop.add_reader(fd, self._wake_loop)

    async def _pause(self, loop: asyncio.AbstractEventLoop, interval: float) -> None:
        """Sleep ``interval`` seconds, or until the bell rings (or the drain fills the
        backlog): not at all if it rang since the last read began."""
        if self._rung:
            return
        self._waiting = waiting = loop.create_future()
        timer = loop.call_later(interval, self._wake_loop)
        self._pause_end = time.monotonic() + interval
        try:
            await waiting
        finally:
            timer.cancel()
            self._waiting = None
            self._pause_end = math.inf

    def ring(self, lead: float | None) -> None:
        """A client rang the bell after writing an acquire due in ``lead`` seconds
        (``None``: it did not say): note the lead, and read the pipe now (see
        :mod:`aiotimer.sources._bell`), unless the reader pauses and its pause ends
        within :data:`~aiotimer.sources._trickle.LEAD_SHARE` of that lead: the acquire
        is then read at the end of the pause with the rest, with as large a share of
        its lead to spare as the pacing leaves any acquire (a ring in a steady job
        costs no read of its own)."""
        if lead is not None:
            now = time.monotonic()
            self._leads.note(lead, now)
            if self._pause_end - now <= lead * LEAD_SHARE:
                return
        self._rung = True
        self._wake_loop()

    def _next_interval(self) -> float:
        now, leads = time.monotonic(), self._leads
        return next_interval(
            self._interval, self._bell_interval, leads.shortest(now), leads.mute(now)
        )


def _in_pipe(fd: int) -> int:
    """How many bytes pipe ``fd`` holds (``FIONREAD``)."""
    count = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, count)
    return count[0]


def _capacity(fd: int) -> int:
    """The capacity of pipe ``fd`` in bytes (Linux's default where it cannot tell)."""
    get_size = getattr(fcntl, "F_GETPIPE_SZ", None)
    if get_size is not None:
        with contextlib.suppress(OSError):
            return int(fcntl.fcntl(fd, get_size))
    return 65536
