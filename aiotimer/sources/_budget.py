"""How much input to decode in one step, so that garbage costs a step no more than lines do.

A step's cost is its lines', and a bad line costs more than a good one (the decoder
tries it, then builds a rejection; the server counts and reports it). 32 KiB of valid
lines (about 70 bytes each) decode in under a millisecond; 32 KiB of two-byte garbage
lines are 16,384 rejections, over 100 ms of one loop step during which no expiry is
handled. So a source decodes at most :data:`LINES_PER_STEP` lines at a time:
:func:`lines_end` says where to cut what it read (at a line's end; one ``count`` of the
newlines, in C, when the chunk holds fewer, which valid input always does), and the
rest waits for the next step, after the loop has run other work.

Pure: no I/O.
"""

from __future__ import annotations

from typing import Final

__all__ = ["LINES_PER_STEP", "lines_end"]

#: The most lines decoded in one step: a few milliseconds even if every one is garbage.
LINES_PER_STEP: Final[int] = 1024


def lines_end(data: bytes, most: int = LINES_PER_STEP) -> int:
    """Where to cut ``data`` so the part before holds about ``most`` complete lines at
    most (never fewer than one line, never more than ``2 * most``): ``len(data)`` when
    it holds no more than that."""
    lines = data.count(b"\n")
    if lines <= most:
        return len(data)
    # The newlines' density tells where the most-th one lies, about; cut at the last
    # newline before that place (or the first after it).
    guess = len(data) * most // lines
    end = data.rfind(b"\n", 0, guess)
    if end < 0:
        end = data.find(b"\n", guess)
    return end + 1
