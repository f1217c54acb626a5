"""The bell: a second FIFO beside the server's, rung by a client after an acquire due soon.

Why it exists: while input trickles in, the FIFO's reader reads the pipe once per
interval rather than at every line (:mod:`aiotimer.sources._trickle`: a wake-up costs
the server ~50x a line). An acquire written just after a read then waits in the pipe
for up to that interval (2 s at most), and while it waits the server knows nothing of
it: no timer, no deadline, nothing the expiry could drain for. An acquire due sooner than
that was therefore read, and its worker reaped, up to the interval late. The reader
learns short leads from what it reads, but only after the first one: a 0.05 s block
after a run of 10 s ones was reaped ~150 ms late.

How it works: the server makes ``<fifo>.bell`` (:data:`BELL_SUFFIX`), a FIFO of the
same mode, reads it at every byte (the loop watches it all the time), and names it in
the marker with the lead below which a client rings and how long a ring's lead is kept
(``bell``, ``bell_lead`` and ``bell_window``, see docs/protocol.md): ``bell_lead`` is
``bell_interval / LEAD_SHARE`` (2.5 s by default), since an acquire with a longer lead
is read within one interval with ``1 - LEAD_SHARE`` of its lead to spare. aiotimer's
client writes such an acquire to the FIFO as usual, then one byte to the bell that says
its lead (:mod:`aiotimer._edges.ring`); the ring ends the reader's pause, so the
acquire is read as soon as the loop runs (unless the pause ends within ``LEAD_SHARE``
of that lead anyway: then it is read at its end, with the rest, as an acquire the
pacing saw coming would be; a ring in a steady job costs no read of its own; a plain
ring always ends the pause), and the reader paces its reads by the lead
for at least ``bell_window`` (:class:`~aiotimer.sources._trickle.Leads`), during which
the client does not ring again for a lead as long or longer. The line itself stays in
the FIFO, in order with the worker's other lines: the release can never overtake its
acquire, and the drain before an expiry sees everything as before.

What it costs: one ``write(2)`` of the client, and one wake-up of the server, per
client, per minute and per shorter lead; nothing for blocks longer than ``bell_lead``.
Whoever may write the FIFO may ring (same mode); a ring only makes the reader read the
pipe now and pace by the lead it says, as a short acquire read would. A bell that
cannot be made (its path is taken) is reported in one line, and the server serves
without it: the marker then names none, the reads of a trickle stay at most
``read_interval`` apart, and short blocks are paced as before.

Other designs, and why not: a mark on the wire (an extra key for short leads) is read
only when the line is, which is the very delay; a lead remembered per worker helps only
from its second short block on; reading the pipe at least every 50 ms would cost a
trickle up to 6x the wake-ups of the longest interval, for every load. torch's client
knows no bell: its short blocks are paced as before (the reader learns their leads).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pathlib
from collections.abc import Callable
from typing import Final

from aiotimer._edges.ring import ring_lead
from aiotimer.errors import SourceError
from aiotimer.sources._fifo_path import OpenFifo

__all__ = ["BELL_SUFFIX", "Bell", "open_bell"]

#: The bell of the FIFO at ``P`` is ``P + BELL_SUFFIX``.
BELL_SUFFIX: Final[str] = ".bell"
#: The most bytes one read takes off the bell (rings are one byte each; what is left
#: keeps it readable, so the loop comes back for it).
_READ: Final[int] = 4096

logger = logging.getLogger("aiotimer")


class Bell:
    """The bell of one FIFO source: made at ``fifo_path + BELL_SUFFIX`` with ``mode``,
    removed by :meth:`close` (see the module docs).

    Raises:
        SourceError: the path cannot be claimed (as the FIFO's own, see
            :mod:`aiotimer.sources._fifo_path`).
    """

    __slots__ = ("_fifo", "_loop")

    def __init__(self, fifo_path: pathlib.Path, mode: int) -> None:
        path = fifo_path.with_name(fifo_path.name + BELL_SUFFIX)
        self._fifo = OpenFifo(path, mode, grow=False)
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def path(self) -> pathlib.Path:
        """Where the bell is."""
        return self._fifo.path

    def listen(self, loop: asyncio.AbstractEventLoop, rung: Callable[[float | None], None]) -> None:
        """Call ``rung(lead)`` in ``loop`` whenever a client rings (rings that arrive
        together are at most two calls): ``lead``, the shortest lead the rings say
        (:mod:`aiotimer._edges.ring`), then ``None`` if one of them says none (a plain
        ring: read now)."""
        fd = self._fifo.read_fd

        def ringing() -> None:
            rings = b""
            with contextlib.suppress(BlockingIOError):
                rings = os.read(fd, _READ)
            said = [ring_lead(code) for code in set(rings)]
            leads = [lead for lead in said if lead is not None]
            if leads:
                rung(min(leads))
            if len(leads) < len(said) or not said:
                rung(None)

        self._loop = loop
        loop.add_reader(fd, ringing)

    def close(self) -> None:
        """Stop listening; close and remove the bell."""
        if self._loop is not None:
            self._loop.remove_reader(self._fifo.read_fd)
            self._loop = None
        self._fifo.close()


def open_bell(fifo_path: pathlib.Path, mode: int) -> Bell | None:
    """The bell of the FIFO at ``fifo_path``, or ``None`` (logged) if it cannot be made."""
    try:
        return Bell(fifo_path, mode)
    except SourceError as exc:
        logger.error(
            "serving %s without a bell (short blocks may be read late): %s", fifo_path, exc
        )
        return None
