"""Decoding a byte stream of request lines: framing, recovery from torn lines, and a
:class:`Rejection` for every malformed line. Pure: no I/O.

Decoding never raises and a bad line never costs another line of the same chunk: each
becomes a :class:`Rejection` (reason plus a truncated copy of the bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, cast

import msgspec

from aiotimer.wire._request import MAX_LINE_BYTES, PROTOCOL_VERSION, Request

__all__ = ["REJECTED_BYTES_KEPT", "Decoded", "LineDecoder", "Rejection"]

#: How many bytes of an offending line a rejection keeps.
REJECTED_BYTES_KEPT: Final[int] = 200


@dataclass(frozen=True, slots=True)
class Rejection:
    """A line that was not a valid request: why, and (a prefix of) what it was."""

    reason: str
    line: bytes

    @classmethod
    def of(cls, reason: str, line: bytes) -> Rejection:
        """A rejection keeping at most ``REJECTED_BYTES_KEPT`` bytes of ``line``."""
        return cls(reason, bytes(line[:REJECTED_BYTES_KEPT]))


@dataclass(slots=True)
class Decoded:
    """What one :meth:`LineDecoder.feed` produced, in arrival order within each list."""

    requests: list[Request] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)


_decode_one = msgspec.json.Decoder(Request).decode
# The fast path's decoder (see LineDecoder._decode_block), and what it puts after each
# newline.
_decode_marked = msgspec.json.Decoder(Request | None).decode_lines
_MARKED_NEWLINE: Final = b"\nnull null"
_MARK_SIZE: Final = len(_MARKED_NEWLINE) - 1

#: What decoding hostile bytes can raise: msgspec's errors (a ``ValueError``), invalid
#: UTF-8 inside a string (``UnicodeDecodeError``, also a ``ValueError``) and nesting too
#: deep for msgspec's recursion limit (``RecursionError``).
_DECODE_ERRORS: Final = (ValueError, RecursionError)


def _decode_line(line: bytes, out: Decoded) -> None:
    """Decode one complete line (no newline) into ``out``; never raises."""
    try:
        out.requests.append(_decode_one(line))
    except _DECODE_ERRORS as exc:
        # A writer that died (or stalls) mid-line leaves a prefix that the next writer's
        # complete line is glued to. Well-formed lines start with '{"', so try to
        # recover a valid object starting at a later '{"' before giving up.
        recovered = _resync(line)
        if recovered is not None:
            cut, req = recovered
            partial = Rejection.of("partial line (writer stopped mid-line)", line[:cut])
            out.rejections.append(partial)
            out.requests.append(req)
            return
        out.rejections.append(Rejection.of(_reason(exc), line))


def _resync(line: bytes) -> tuple[int, Request] | None:
    start = line.find(b'{"', 1)
    while start != -1:
        try:
            req = _decode_one(line[start:])
        except _DECODE_ERRORS:
            start = line.find(b'{"', start + 1)
            continue
        return start, req
    return None


def _reason(exc: ValueError | RecursionError) -> str:
    text = str(exc)
    if isinstance(exc, msgspec.ValidationError):
        if text.endswith("at `$.version`"):
            return f"unsupported protocol version (only {PROTOCOL_VERSION} is known): {text}"
        return f"invalid request: {text}"
    # Invalid UTF-8 inside a string: a UnicodeDecodeError up to msgspec 0.22, a
    # DecodeError saying "Invalid UTF-8" from 0.23.
    if isinstance(exc, UnicodeDecodeError) or "UTF-8" in text:
        return f"invalid UTF-8: {text}"
    if isinstance(exc, RecursionError):
        return "malformed JSON: nested too deeply"
    return f"malformed JSON: {text}"


class LineDecoder:
    """Incremental decoder for a byte stream of request lines.

    Feed it chunks as they are read (any size, any split); each :meth:`feed` returns the
    complete lines' requests and rejections. A trailing partial line is kept until its
    newline arrives, but never more than ``max_line`` bytes of it: a longer line is
    rejected once and skipped up to its newline (a valid line glued to its end by
    another writer is still recovered).

    Chunks of only valid lines take a fast path that decodes them all in one call.
    """

    __slots__ = ("_buf", "_max_line", "_overflow")

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        if max_line < 2:
            raise ValueError("max_line must be at least 2 bytes")
        self._max_line = max_line
        self._buf = b""
        self._overflow = False

    @property
    def pending(self) -> int:
        """Bytes of an incomplete line currently held."""
        return len(self._buf)

    def feed(self, chunk: bytes) -> Decoded:
        """Decode every complete line in ``self``'s buffer plus ``chunk``."""
        out = Decoded()
        if not chunk:
            return out
        last_nl = chunk.rfind(b"\n")
        if last_nl == -1:
            self._hold(chunk)
            return out
        if self._overflow:
            first_nl = chunk.find(b"\n")
            self._hold(chunk[:first_nl])
            line = self._buf
            self._buf, self._overflow = b"", False
            self._finish_line(line, True, out)
            block = chunk[first_nl + 1 : last_nl + 1]
        else:
            # The held partial line (shorter than max_line) starts the block: the line
            # it begins is decoded with the others, in one call when all are valid.
            block = self._buf + chunk[: last_nl + 1]
            self._buf = b""
        if block:
            self._decode_block(block, out)
        if last_nl + 1 < len(chunk):
            self._hold(chunk[last_nl + 1 :])
        return out

    def flush(self) -> Decoded:
        """At end of stream: report a held partial line as a rejection and reset."""
        out = Decoded()
        if self._buf or self._overflow:
            reason = (
                f"line longer than {self._max_line} bytes"
                if self._overflow
                else "incomplete line at end of stream"
            )
            out.rejections.append(Rejection.of(reason, self._buf))
        self._buf, self._overflow = b"", False
        return out

    # -- internals ------------------------------------------------------------------

    def _hold(self, data: bytes) -> None:
        buf = self._buf + data
        limit = self._max_line - 1  # the newline counts toward the limit
        if len(buf) > limit:
            self._overflow = True
            buf = buf[-limit:]  # keep only a tail: enough to recover a glued valid line
        self._buf = buf

    def _finish_line(self, line: bytes, overflowed: bool, out: Decoded) -> None:
        if not overflowed:
            if line.strip():
                _decode_line(line, out)
            return
        out.rejections.append(Rejection.of(f"line longer than {self._max_line} bytes", line))
        start = line.find(b'{"')
        if start != -1:
            recovered = Decoded()
            _decode_line(line[start:], recovered)
            out.requests.extend(recovered.requests)

    def _decode_block(self, block: bytes, out: Decoded) -> None:
        """Decode ``block``: complete lines, each ending in a newline."""
        # The fast path decodes the whole block in one call, as a sequence of JSON values
        # with two nulls put after every newline. Such a sequence decodes only if every
        # newline lies between two top-level values: a newline cannot be inside a string
        # (JSON forbids a raw one there), nor be followed by two values (the nulls)
        # inside an object or an array (they would need a comma between them). So each
        # line holds whole values of its own, and when the values come as (request,
        # null, null) once per line, each line holds exactly one, a request: had a line
        # none, or more, the nulls after it would sit where the pattern wants a request
        # (after k lines holding d values too many, they sit at 3k + d - 2 and
        # 3k + d - 1, so d must stay a multiple of 3; it starts at 0, drops by at most 1
        # per line and ends at 0, so it stays 0). Other blocks (a blank line, a bad
        # line, an object split over lines, two on one line) take the exact line-by-line
        # path, as do those with a line longer than max_line.
        if self._lines_fit(block):
            marked = block.replace(b"\n", _MARKED_NEWLINE)
            count = (len(marked) - len(block)) // _MARK_SIZE
            try:
                values = _decode_marked(marked)
            except _DECODE_ERRORS:
                pass  # at least one bad line: fall back to line by line
            else:
                requests = values[::3]
                if (
                    len(values) == 3 * count
                    and all(requests)  # a request is true, a null None
                    and not any(values[1::3])
                    and not any(values[2::3])
                ):
                    out.requests.extend(cast("list[Request]", requests))  # no null left
                    return
        limit = self._max_line - 1
        lines = block.split(b"\n")
        lines.pop()  # the empty string after the final newline
        for line in lines:
            if len(line) > limit:
                self._finish_line(line[-limit:], True, out)
            elif line.strip():
                _decode_line(line, out)

    def _lines_fit(self, block: bytes) -> bool:
        """Whether every line of ``block`` (complete lines) is at most ``max_line`` bytes
        long, newline included. Exact, at memchr speed: each step jumps to the last
        newline within ``max_line`` bytes of a line's start, so two steps cover at least
        ``max_line`` bytes."""
        rfind, limit, end = block.rfind, self._max_line, len(block)
        start = 0
        while start < end:
            newline = rfind(b"\n", start, start + limit)
            if newline < 0:
                return False  # the line at start is longer
            start = newline + 1
        return True
