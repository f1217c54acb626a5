"""The bell's ring: one byte that says how soon the acquire it rings for falls due. Pure.

A client rings a FIFO's bell (:mod:`aiotimer.sources._bell`) after an acquire due
soon; the byte it writes carries that acquire's *lead* (seconds from the write to its
deadline), rounded down to a step of a geometric scale (each step ~19 % longer than
the one before), so the server learns the lead when the ring arrives, whatever chunk
the line itself is read in. A lead below the scale is the lowest code, which reads
back as ``0.0`` (read at every line); above it, the highest. An acquire already due
rings plainly (``b"!"``, as does any other byte): :func:`ring_lead` gives ``None``, and
the server reads at once without pacing by it (an acquire written late, such as an
expired one, says nothing of the leads to come: noted, it would make the server read at
every line for a minute).
"""

from __future__ import annotations

import math
from typing import Final

__all__ = ["PLAIN_RING", "ring_byte", "ring_lead"]

#: A ring that says nothing of its lead.
PLAIN_RING: Final[bytes] = b"!"
#: The codes: ``_FIRST`` (a lead under ``2 ** ((_FIRST + 1 - _ZERO) / _STEPS)`` s, read
#: back as 0) to ``_LAST``; code ``c`` above ``_FIRST`` stands for at least
#: ``2 ** ((c - _ZERO) / _STEPS)`` seconds.
_FIRST: Final[int] = 0x40
_LAST: Final[int] = 0x7F
_ZERO: Final[int] = 0x60  # the code of a 1 s lead
_STEPS: Final[int] = 4  # codes per doubling


def ring_byte(lead: float) -> bytes:
    """The ring of an acquire ``lead`` seconds from its deadline: one byte whose
    :func:`ring_lead` is at most ``lead``; a plain ring for an acquire already due (a
    late write says nothing of the leads to come)."""
    if not lead > 0.0:
        return PLAIN_RING
    if not math.isfinite(lead):
        return bytes((_LAST,))
    code = min(max(_ZERO + math.floor(math.log2(lead) * _STEPS), _FIRST), _LAST)
    if code > _FIRST and 2.0 ** ((code - _ZERO) / _STEPS) > lead:  # log2's rounding
        code -= 1
    return bytes((code,))


def ring_lead(code: int) -> float | None:
    """The lead a ring byte ``code`` stands for (a lower bound), or ``None`` for a
    plain ring."""
    if not _FIRST <= code <= _LAST:
        return None
    if code == _FIRST:
        return 0.0
    return float(2.0 ** ((code - _ZERO) / _STEPS))
