"""Which undecoded request lines may concern a worker: a byte scan, without decoding;
and taking the lines that concern due workers out of a run of lines without changing
the order of any worker's requests. Pure: no I/O.

Why a scan is enough
--------------------
A request for worker ``P`` names ``P`` in its ``pid`` key, and the codec accepts only a
JSON integer literal there (``1234``; never ``1234.0``, ``1.234e3``, ``"1234"`` or
``01234``). So every line that decodes to a request for ``P`` contains the ASCII digits
``str(P)`` as a whole JSON number: not preceded by a digit, ``.``, ``+``, ``-``, ``e`` or
``E`` (it would be part of a longer number) and not followed by a digit, ``.``, ``e`` or
``E`` (it would be a longer integer, or a float). A request also has every key the codec
requires, ``scope_id`` among them, spelt out or with JSON escapes (a backslash). A
line *mentions* ``P`` when it holds both: a line that does not cannot act on ``P``'s
timers, whatever else it holds (a flood of ``{"pid": P}`` lines is garbage to be
rejected by the reader, in order, not work for a drain). The reverse does not hold (the
same digits in a scope id, or as another key's value), which only costs decoding lines
that turn out not to matter.

Scanning is one compiled regular expression over the bytes (C speed: about a
millisecond per MiB for a handful of pids), and a look at each line it finds; past
:data:`MAX_SCANNED_PIDS` pids every complete line counts as a mention.

Taking out the due workers' lines
---------------------------------
Before an expiry the server must apply every request for the due workers that a
transport held, and no more than it must: under a flood, decoding everything costs
far more than decoding the few lines that name a due worker. :func:`take_due` cuts a
run of complete lines in two: the lines that mention a due pid, decoded, applied now;
and the rest, left undecoded, in order, for the reader. A request for a worker is
applied out of the stream's order only together with *every* earlier request for that
worker (all of them mention it, so all were taken), so each worker's requests keep their
order. A taken line that turns out to hold a request for a worker that is not due (its
pid's digits appear elsewhere in the line) is put back where it was, undecoded, so that
worker's requests keep their order too; only lines that hold nothing but requests for
due workers and rejections are taken. What crosses workers is the order of rejections'
reports and of applying caps, which no worker's timers depend on beyond the caps.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator
from functools import lru_cache
from typing import Final

from aiotimer.wire._decoder import Decoded, LineDecoder

__all__ = ["MAX_SCANNED_PIDS", "due_lines", "mentions_end", "scanned", "split_junk", "take_due"]

#: The most pids one scan looks for; with more, every complete line may concern them.
MAX_SCANNED_PIDS: Final[int] = 64


_NOT_BEFORE: Final = frozenset(b"0123456789.+-eE")
#: A key every request has; a line without it (or a backslash, which could spell it
#: with escapes) decodes to no request.
_KEY: Final = b"scope_id"


@lru_cache(maxsize=64)
def _pattern(pids: frozenset[int]) -> re.Pattern[bytes]:
    """The digits of any of ``pids`` not followed by what would make them part of a
    longer number; what precedes them is checked by :func:`_search` (a look-behind in
    the pattern would cost the scan its fast search for the digits)."""
    alternatives = b"|".join(str(pid).encode() for pid in sorted(pids, reverse=True))
    return re.compile(rb"(?:" + alternatives + rb")(?![0-9.eE])")


def _mention_lines(
    data: bytes, pattern: re.Pattern[bytes], pos: int, end: int
) -> Iterator[tuple[int, int]]:
    """The spans of the lines of ``data[pos:end]`` (``end`` ends a line; a line that
    ``pos`` cuts starts at ``pos``) that mention a pid of ``pattern``, in order."""
    skip = pos  # matches before this are in a line already judged
    for found in pattern.finditer(data, pos, end):
        at = found.start()
        if at < skip or (at and data[at - 1] in _NOT_BEFORE):
            continue  # in a line judged already, or part of a longer number
        begin = max(pos, data.rfind(b"\n", 0, at) + 1)
        skip = data.index(b"\n", at) + 1
        if data.find(_KEY, begin, skip) != -1 or data.find(b"\\", begin, skip) != -1:
            yield begin, skip


def scanned(pids: Collection[int] | None) -> frozenset[int] | None:
    """``pids`` as a scan looks for them; ``None`` when every line counts as a mention
    (``pids`` is ``None``, or holds more than :data:`MAX_SCANNED_PIDS`)."""
    if pids is None or len(pids) > MAX_SCANNED_PIDS:
        return None
    return frozenset(pids)


def mentions_end(
    data: bytes, pids: Collection[int] | None, *, partial: bool, start: int = 0
) -> int:
    """How many bytes of ``data`` from ``start`` on must be decoded so that no complete
    line left after them may hold a request for one of ``pids`` (``None``: for anyone;
    0: none may).

    The bytes before ``start`` were decoded already. The result always ends a line (it
    is 0 or reaches just past a newline); an incomplete last line is never counted, as
    it cannot be decoded yet. ``partial``: the decoder holds the start of a line that
    ``data[start:]`` continues; that line may name anyone, so when it is complete it is
    counted too.
    """
    end = data.rfind(b"\n", start) + 1
    if not end:
        return 0
    key = scanned(pids)
    if key is None:
        return end - start
    if not key:
        return 0
    last = _last_mention(data, _pattern(key), start, end)
    if last != -1:
        return data.index(b"\n", last) + 1 - start
    return data.index(b"\n", start) + 1 - start if partial else 0


#: How far back :func:`_last_mention` searches at a time.
_BLOCK: Final[int] = 1 << 16


def _last_mention(data: bytes, pattern: re.Pattern[bytes], start: int, end: int) -> int:
    """Where the last line of ``data[start:end]`` that mentions a pid begins, or -1:
    blocks of lines are scanned from the end."""
    high = end
    while high > start:
        low = max(start, data.rfind(b"\n", start, max(start, high - _BLOCK)) + 1)
        last = -1
        for begin, _ in _mention_lines(data, pattern, low, high):
            last = begin
        if last != -1:
            return last
        high = low
    return -1


def due_lines(data: bytes, pids: Collection[int] | None) -> list[tuple[int, int]]:
    """The ``(start, end)`` spans, in order, of the complete lines of ``data`` (``end``
    past the newline) that mention one of ``pids`` (``None``: every line)."""
    spans: list[tuple[int, int]] = []
    limit = data.rfind(b"\n") + 1
    key = scanned(pids)
    if key is None:
        pos = 0
        while pos < limit:
            end = data.index(b"\n", pos) + 1
            spans.append((pos, end))
            pos = end
        return spans
    if not key:
        return spans
    return list(_mention_lines(data, _pattern(key), 0, limit))


def take_due(
    data: bytes, pids: Collection[int] | None, decoder: LineDecoder
) -> tuple[Decoded, bytes]:
    """Cut ``data``, complete lines only (it ends with a newline, or is empty), into what
    to apply now for the workers ``pids`` (``None``: everyone) and what to leave, in
    order, for later (see the module docs): ``(decoded, left)``.

    ``decoder`` decodes the lines taken; it must hold no partial line, and holds none
    afterwards. Every request for one of ``pids`` in ``data`` is in ``decoded``, in order,
    and none is left in ``left``; ``left`` holds the other lines, in their order.
    """
    if pids is None:
        return decoder.feed(data), b""
    spans = due_lines(data, pids)
    if not spans:
        return Decoded(), data
    taken = decoder.feed(b"".join(data[start:end] for start, end in spans))
    if all(req.pid in pids for req in taken.requests):
        return taken, _without(data, spans)
    # Some taken line holds a request of a worker that is not due: decide line by line.
    out, kept = Decoded(), []
    for start, end in spans:
        one = decoder.feed(data[start:end])
        if all(req.pid in pids for req in one.requests):
            out.requests += one.requests
            out.rejections += one.rejections
        else:
            kept.append((start, end))
    taken_spans = [span for span in spans if span not in kept]
    return out, _without(data, taken_spans)


def _without(data: bytes, spans: list[tuple[int, int]]) -> bytes:
    """``data`` without the byte ranges ``spans`` (in order, not overlapping)."""
    if not spans:
        return data
    parts, pos = [], 0
    for start, end in spans:
        if start > pos:
            parts.append(data[pos:start])
        pos = end
    parts.append(data[pos:])
    return b"".join(parts)


def split_junk(data: bytes, *, partial: bool) -> tuple[bytes, list[bytes]]:
    """Cut ``data`` into what may hold requests, in order, and the complete lines that
    cannot (no ``scope_id`` key spelt out and no backslash, see the module docs; blank
    lines, which decode to nothing, are dropped): ``(candidates, junk)``.

    ``candidates`` keeps an incomplete last line, and, when ``partial`` (a decoder
    holds the start of a line that ``data`` continues), the first line whatever it
    holds. Decoding ``candidates`` yields exactly the requests decoding ``data`` would,
    in the same order; ``junk`` holds only lines that decode to a rejection each.
    """
    if data.find(_KEY) == -1 and data.find(b"\\") == -1:
        keep: list[bytes] = []
        lines = data.split(b"\n")
        tail = lines.pop()
        if partial and lines:
            keep.append(lines[0] + b"\n")
            del lines[0]
        junk = [line for line in lines if line and not line.isspace()]
        keep.append(tail)
        return b"".join(keep), junk
    lines = data.split(b"\n")
    tail = lines.pop()
    kept, junk = [], []
    for i, line in enumerate(lines):
        if (partial and i == 0) or _KEY in line or b"\\" in line:
            kept.append(line)
        elif line and not line.isspace():
            junk.append(line)
    if kept:
        kept.append(tail)
        return b"\n".join(kept), junk
    return tail, junk
