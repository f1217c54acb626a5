"""What a FIFO's reader has read from its pipe and not decoded yet, and a drain's pass
over it. Pure: no I/O.

The backlog is filled by the server's drain before an expiry (the bytes the pipe held
at the decision that may concern a due worker, see :mod:`aiotimer.sources.fifo`), and
by the read loop with the rest of a read it could not decode in one step. The read loop
decodes it from the front, in arrival order, before it reads the pipe again.

It is two runs of bytes, in arrival order: *done*, complete lines the drain's current
pass has looked at and left (they hold no request for the workers it looks for), then
*todo*, the rest. A pass of the drain begins by putting *done* back in front of *todo*
(:meth:`Backlog.rewind`), then takes complete lines from the front of *todo*
(:meth:`Backlog.next_lines`), takes out those it must apply, and puts the others at the
end of *done* (:meth:`Backlog.put_done`). So the read loop and the drain share one
queue: whatever either takes, it takes from a front, and nothing is ever read twice or
skipped. Both runs are queues of pieces of at most :data:`PIECE` bytes, so taking from a
front copies at most a piece.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Set as AbstractSet
from typing import Final

from aiotimer.sources._budget import lines_end
from aiotimer.wire import Decoded, LineDecoder, mentions_end, scanned, take_due

__all__ = ["PIECE", "Backlog"]

#: The largest piece the backlog keeps (bigger appends are cut).
PIECE: Final[int] = 1 << 16


class Backlog:
    """Bytes read and not decoded yet: *done*, then *todo* (see the module docs)."""

    __slots__ = ("_done", "_size", "_todo")

    def __init__(self) -> None:
        self._done: deque[bytes] = deque()
        self._todo: deque[bytes] = deque()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    @property
    def at_front(self) -> bool:
        """Whether *todo* starts the backlog (*done* is empty)."""
        return not self._done

    def append(self, data: bytes) -> None:
        """Add ``data``, just read, at the end of *todo*."""
        for start in range(0, len(data), PIECE):
            self._todo.append(data[start : start + PIECE])
        self._size += len(data)

    def take(self, size: int) -> bytes:
        """Up to ``size`` bytes from the front, and no more than one step's lines
        (:func:`~aiotimer.sources._budget.lines_end`); ``b""`` when empty."""
        queue = self._done or self._todo
        if not queue:
            return b""
        piece = queue[0]
        chunk = piece[:size]
        end = lines_end(chunk)
        if end < len(chunk):
            chunk = chunk[:end]
        if len(chunk) == len(piece):
            queue.popleft()
        else:
            queue[0] = piece[len(chunk) :]
        self._size -= len(chunk)
        return chunk

    def rewind(self) -> None:
        """A new pass: *done* goes back to the front of *todo*."""
        if self._done:
            self._todo.extendleft(reversed(self._done))
            self._done.clear()

    def first_line(self) -> bytes | None:
        """Take *todo*'s bytes up to its first newline (included): the end of a line a
        decoder holds the start of; ``None`` when *todo* holds no newline."""
        return self._cut(0)

    def next_lines(self, size: int) -> bytes | None:
        """Take complete lines from the front of *todo*: about ``size`` bytes (at least
        one line, at most one step's lines); ``None`` when *todo* holds no complete
        line (what it holds, if anything, is the start of a line still being written)."""
        return self._cut(size)

    def _cut(self, size: int) -> bytes | None:
        todo = self._todo
        parts: list[bytes] = []
        held = 0
        newline = False
        while todo and (held < size or not newline):
            piece = todo.popleft()
            parts.append(piece)
            held += len(piece)
            newline = newline or b"\n" in piece
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        end = data.rfind(b"\n", 0, size) + 1 if size else 0
        if not end:
            end = data.find(b"\n") + 1
        if end:
            end = min(end, lines_end(data[:end]))
        if end < len(data):
            todo.appendleft(data[end:])
        self._size -= end
        return data[:end] if end else None

    def pass_step(
        self,
        pids: AbstractSet[int] | None,
        decoder: LineDecoder,
        lines: LineDecoder,
        size: int,
    ) -> Decoded | None:
        """One step of a drain's pass for ``pids`` (``None``: anyone) over *todo*: what
        to apply now, decoded; ``None`` when *todo* holds no complete line.

        ``decoder`` is the stream's (it may hold the start of the line the backlog's
        front ends); ``lines`` decodes whole lines taken out of the middle
        (:func:`~aiotimer.wire._mentions.take_due`). At the stream's front (*done*
        empty) a line the stream's decoder began is finished first, in order; for
        anyone, or too many workers to scan for, the lines are decoded in order from
        the front (such a pass leaves nothing in *done*)."""
        if self.at_front and decoder.pending:
            line = self.first_line()
            if line is not None:
                return decoder.feed(line)
        data = self.next_lines(size)
        if data is None:
            return None
        if scanned(pids) is None:
            return decoder.feed(data)
        taken, left = take_due(data, pids, lines)
        self.put_done(left)
        return taken

    def names(self, pids: AbstractSet[int] | None, *, partial: bool) -> bool:
        """Whether a complete line of *todo* may hold a request for one of ``pids``
        (:func:`~aiotimer.wire._mentions.mentions_end`); ``partial``: a decoder holds
        the start of the line *todo* begins with (counted when complete)."""
        carry = b""
        for piece in self._todo:
            data = carry + piece if carry else piece
            cut = data.rfind(b"\n") + 1
            if cut:
                if mentions_end(data[:cut], pids, partial=partial):
                    return True
                partial = False
            carry = data[cut:]
        return False

    def put_done(self, data: bytes) -> None:
        """Add ``data`` (complete lines a pass left) at the end of *done*."""
        if data:
            self._done.append(data)
            self._size += len(data)

    def tail(self) -> tuple[bytes, bool]:
        """The bytes after the backlog's last newline (the start of a line the pipe may
        continue), and whether the backlog holds a newline at all."""
        parts: list[bytes] = []
        for piece in reversed(self._todo):
            at = piece.rfind(b"\n")
            if at != -1:
                parts.append(piece[at + 1 :])
                return b"".join(reversed(parts)), True
            parts.append(piece)
        return b"".join(reversed(parts)), bool(self._done)
