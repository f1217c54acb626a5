"""A bounded copy of a stack dump read as it streams (pure: no I/O).

A dump read from outside the worker (py-spy's) is as large as the worker makes it: 300
threads 100 frames deep in functions with 4,000-character names make ~120 MB of text.
:class:`StackTextBound` takes such output as it streams and keeps a bounded copy
(:class:`StackCaps`: characters per line, frames per thread, threads, bytes read), so
the reader holds at most about ``threads * (frames + 1) * line`` characters whatever
comes, and the parser (:mod:`aiotimer.hang`) works on that.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiotimer.wire import FAULT_THREAD_HEADER, SPY_THREAD_HEADER

__all__ = ["StackCaps", "StackTextBound"]


@dataclass(frozen=True, slots=True)
class StackCaps:
    """How much of a streamed stack dump :class:`StackTextBound` keeps.

    ``line``: characters of one line (a longer one keeps its head and its last ``tail``
    characters, where a frame names its file and line); ``frames``: frame lines per
    thread; ``threads``: thread blocks (py-spy's ``MainThread`` is kept wherever it
    comes); ``read``: bytes read in all, after which the reader stops.

    With the defaults a kept dump is at most about 50 * 51 * 512 characters (1.3 MB).
    """

    line: int = 512
    tail: int = 200
    frames: int = 50
    threads: int = 50
    read: int = 16 * 1024 * 1024


class StackTextBound:
    """A bounded copy of a stack dump fed in chunks of bytes (see :class:`StackCaps`).

    :meth:`feed` returns ``False`` once ``caps.read`` bytes came (stop reading);
    :meth:`text` is what was kept, ending with a note of what was left out.
    """

    __slots__ = (
        "_caps",
        "_cut_lines",
        "_dropped_frames",
        "_dropped_threads",
        "_frames",
        "_head",
        "_keeping",
        "_kept",
        "_read",
        "_tail",
        "_threads",
        "_whole",
    )

    def __init__(self, caps: StackCaps | None = None) -> None:
        self._caps = caps if caps is not None else StackCaps()
        self._kept: list[str] = []
        self._head = bytearray()  # the line in progress: its head ...
        self._tail = b""  # ... and, once past the cap, its last bytes
        self._whole = True  # the line in progress is all in _head
        self._read = 0
        self._threads = 0
        self._frames = 0
        self._keeping = True  # the current thread block is kept
        self._dropped_threads = 0
        self._dropped_frames = 0
        self._cut_lines = 0

    @property
    def full(self) -> bool:
        """Whether ``caps.read`` bytes came: the rest is not read."""
        return self._read >= self._caps.read

    def feed(self, data: bytes) -> bool:
        """Take the next bytes; ``False`` once the read cap is reached."""
        room = self._caps.read - self._read
        if room <= 0:
            return False
        data = data[:room]
        self._read += len(data)
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end == -1:
                self._extend(data[start:])
                break
            self._extend(data[start:end])
            self._line_done()
            start = end + 1
        return not self.full

    def _extend(self, piece: bytes) -> None:
        if not piece:
            return
        head_cap = self._caps.line - self._caps.tail
        if self._whole and len(self._head) + len(piece) <= self._caps.line:
            self._head += piece
            return
        if self._whole:
            self._whole = False
            joined = bytes(self._head) + piece
            self._head = bytearray(joined[:head_cap])
            rest = joined[head_cap:]
        else:
            rest = self._tail + piece
        self._tail = rest[-self._caps.tail :]

    def _line_done(self) -> None:
        if self._whole:
            line = self._head.decode("utf-8", "replace")
        else:
            self._cut_lines += 1
            line = (
                self._head.decode("utf-8", "replace")
                + "..."
                + self._tail.decode("utf-8", "replace")
            )
        self._head.clear()
        self._tail = b""
        self._whole = True
        self._take(line.rstrip("\r"))

    def _take(self, line: str) -> None:
        if line[:1] not in (" ", "\t", ""):  # a header: a new thread block, or not one
            if FAULT_THREAD_HEADER.match(line) or SPY_THREAD_HEADER.match(line):
                self._threads += 1
                self._frames = 0
                main = line.endswith('"MainThread"')
                self._keeping = self._threads <= self._caps.threads or main
                if not self._keeping:
                    self._dropped_threads += 1
                    return
            else:
                self._keeping = True
            self._kept.append(line)
            return
        if not self._keeping:
            return
        if line.strip():
            self._frames += 1
            if self._frames > self._caps.frames:
                self._dropped_frames += 1
                return
        self._kept.append(line)

    def text(self) -> str:
        """What was kept, and a last line saying what was left out, if anything."""
        kept = list(self._kept)
        if self._head or self._tail:
            kept.append(self._head.decode("utf-8", "replace"))  # an unfinished last line
        cuts = []
        if self._dropped_threads:
            cuts.append(f"{self._dropped_threads} more thread(s) left out")
        if self._dropped_frames:
            cuts.append(f"{self._dropped_frames} more frame(s) left out")
        if self._cut_lines:
            cuts.append(f"{self._cut_lines} line(s) cut to {self._caps.line} characters")
        if self.full:
            cuts.append(f"the rest not read (after {self._caps.read} bytes)")
        if cuts:
            kept.append(f"[aiotimer: stacks bounded: {'; '.join(cuts)}]")
        return "\n".join(kept) + "\n" if kept else ""
