"""A worker's blocks from its requests: which block of which scope ran from when to
when. Pure: no I/O, no clock.

:meth:`BlockTimes.feed` takes requests in arrival order and the time they were read
(the reader's monotonic clock); it pairs each release with its acquire (same pid and
scope id) and returns the finished blocks. A block's times are the ones its requests
carry (the ``at`` extension: the worker's clock when it wrote them, immune to when the
server read them, see :mod:`aiotimer.wire._request`); a request without ``at`` is timed
by when it was read. Only pids ``wanted`` says yes to are followed. The open blocks
are bounded (``capacity``; beyond it the oldest are forgotten).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import NamedTuple

from aiotimer.core._scope import scope_site
from aiotimer.wire import Request

__all__ = ["BlockTimes", "FinishedBlock"]


class FinishedBlock(NamedTuple):
    """One block of worker ``pid`` in scope site ``site``, from ``start`` to ``end``."""

    pid: int
    site: str
    start: float
    end: float


class BlockTimes:
    """Pairs acquires and releases into blocks (see the module docs). Not thread-safe."""

    __slots__ = ("_capacity", "_open", "_wanted")

    def __init__(self, wanted: Callable[[int], bool], *, capacity: int = 100_000) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._wanted = wanted
        self._capacity = capacity
        self._open: OrderedDict[tuple[int, str], float] = OrderedDict()

    def feed(self, requests: Iterable[Request], read_at: float) -> list[FinishedBlock]:
        """The blocks that ``requests``, read at ``read_at``, finished."""
        out: list[FinishedBlock] = []
        opened = self._open
        wanted = self._wanted
        for req in requests:
            if not wanted(req.pid):
                continue
            at = read_at if req.at is None else req.at
            key = (req.pid, req.scope_id)
            if req.expiration_time >= 0:
                opened[key] = at
                opened.move_to_end(key)
                if len(opened) > self._capacity:
                    opened.popitem(last=False)
                continue
            start = opened.pop(key, None)
            if start is not None:
                out.append(FinishedBlock(req.pid, scope_site(req.scope_id), start, at))
        return out

    def forget(self, pid: int) -> None:
        """Drop the open blocks of ``pid`` (it exited)."""
        for key in [k for k in self._open if k[0] == pid]:
            del self._open[key]

    def __len__(self) -> int:
        return len(self._open)
