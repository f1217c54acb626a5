"""Which undecoded request lines may concern a worker: a byte scan, without decoding.
Pure: no I/O.

Why a scan is enough
--------------------
A request for worker ``P`` names ``P`` in its ``pid`` key, and the codec accepts only a
JSON integer literal there (``1234``; never ``1234.0``, ``1.234e3``, ``"1234"`` or
``01234``). So every line that decodes to a request for ``P`` contains the ASCII digits
``str(P)`` as a whole JSON number: not preceded by a digit, ``.``, ``+``, ``-``, ``e`` or
``E`` (it would be part of a longer number) and not followed by a digit, ``.``, ``e`` or
``E`` (it would be a longer integer, or a float). Lines without such a *mention* of any
pid of a set cannot act on those workers' timers, whatever else they hold. The reverse
does not hold (the same digits in a scope id, or as another key's value), which only
costs decoding lines that turn out not to matter.

Scanning one pid is one C-level ``rfind`` pass over the bytes (a few hundred
microseconds per MiB); past :data:`MAX_SCANNED_PIDS` pids the scan would cost more than
decoding, so every complete line counts as a mention then.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

__all__ = ["MAX_SCANNED_PIDS", "mentions_end"]

#: The most pids one scan looks for; with more, every complete line may concern them.
MAX_SCANNED_PIDS: Final[int] = 8

_DIGITS: Final = frozenset(b"0123456789")
_NOT_BEFORE: Final = _DIGITS | frozenset(b".+-eE")
_NOT_AFTER: Final = _DIGITS | frozenset(b".eE")


def _last_mention(data: bytes, digits: bytes, start: int, end: int) -> int:
    """The index of the last whole-number occurrence of ``digits`` in
    ``data[start:end]``, or -1."""
    at = data.rfind(digits, start, end)
    while at != -1:
        after = at + len(digits)
        if (at == 0 or data[at - 1] not in _NOT_BEFORE) and (
            after >= len(data) or data[after] not in _NOT_AFTER
        ):
            return at
        at = data.rfind(digits, start, at + len(digits) - 1)
    return -1


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
    if pids is None or len(pids) > MAX_SCANNED_PIDS:
        return end - start
    if not pids:
        return 0
    last = max(_last_mention(data, str(pid).encode(), start, end) for pid in pids)
    if last != -1:
        return data.index(b"\n", last) + 1 - start
    return data.index(b"\n", start) + 1 - start if partial else 0
