"""Naming the supervised rank that is slower than its peers, while the job runs.

The embedded server shows :class:`Stragglers` every batch of requests it reads
(:mod:`aiotimer.server._observed`); :class:`~aiotimer.core._blocks.BlockTimes` pairs
them into blocks (the worker's own times, the ``at`` extension) and the pid's rank
feeds the pure :class:`~aiotimer.core._straggler.StragglerDetector`. Each change is
told as a :class:`~aiotimer.events.StragglerDetected` or
:class:`~aiotimer.events.StragglerRecovered` event, and the ranks' slowness goes into
their :class:`~aiotimer.events.RankStatus` (``slowness``, ``straggler``), which the
status table, ``/metrics`` and a cluster node's record show.

A block from a new process of a rank (it was restarted) first drops what the detector
knew of the rank: the new process starts from an empty window. With the
``restart-rank`` policy (:data:`ON_STRAGGLER`), a rank named a straggler is handed to
``restart`` (the supervisor restarts it, charged to the restart budget).

How the detector decides, and what it cannot see: docs/stragglers.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Final

import msgspec

from aiotimer.core import BlockTimes, StragglerChange, StragglerDetector
from aiotimer.events import Event, RankStatus, StragglerDetected, StragglerRecovered
from aiotimer.wire import Request

__all__ = ["ON_STRAGGLER", "Stragglers"]

#: What the supervisor does with a straggler: say so, or also restart it.
ON_STRAGGLER: Final = ("report", "restart-rank")
#: The most scope sites whose medians a rank's status carries (a node's record).
TIMED_SITES: Final = 8


class Stragglers:
    """The supervisor's straggler detection (see the module docs). Loop thread only."""

    def __init__(
        self,
        *,
        ranks_by_pid: Mapping[int, int],
        emit: Callable[[Event], None],
        wall: Callable[[], float],
        detector: StragglerDetector | None = None,
        restart: Callable[[int], None] | None = None,
    ) -> None:
        self._ranks_by_pid = ranks_by_pid
        self._emit = emit
        self._wall = wall
        self._restart = restart
        self.detector = detector if detector is not None else StragglerDetector()
        self._blocks = BlockTimes(ranks_by_pid.__contains__)
        self._pid_of: dict[int, int] = {}  # rank -> the process its blocks come from

    def observe(self, requests: Sequence[Request], read_at: float) -> None:
        """A batch the server read (its :data:`~aiotimer.server._observed.RequestObserver`)."""
        for block in self._blocks.feed(requests, read_at):
            rank = self._ranks_by_pid.get(block.pid)
            if rank is None:
                continue
            if self._pid_of.get(rank, block.pid) != block.pid:
                self._told(self.detector.forget(rank), "its process was replaced")
            self._pid_of[rank] = block.pid
            self._told(self.detector.block(rank, block.site, block.start, block.end))

    def _told(self, changes: list[StragglerChange], reason: str = "recovered") -> None:
        for change in changes:
            if change.slow:
                self._emit(
                    StragglerDetected(
                        time=self._wall(),
                        rank=change.rank,
                        pid=self._pid_of.get(change.rank),
                        scope=change.site,
                        ratio=round(change.ratio, 3),
                        basis=change.basis,
                        excess=round(change.excess, 6),
                        window=change.window,
                    )
                )
                if self._restart is not None:
                    self._restart(change.rank)
            else:
                self._emit(
                    StragglerRecovered(
                        time=self._wall(),
                        rank=change.rank,
                        scope=change.site,
                        ratio=round(change.ratio, 3),
                        window=change.window,
                        reason=reason,
                    )
                )

    def annotate(self, rows: Sequence[RankStatus]) -> tuple[RankStatus, ...]:
        """``rows`` with each rank's ``slowness``, ``straggler`` scopes and ``timings``
        (of at most :data:`TIMED_SITES` sites) filled in."""
        ratios = self.detector.ratios()
        flagged = self.detector.stragglers()
        timings = self.detector.timings()
        return tuple(
            msgspec.structs.replace(
                row,
                slowness=None if row.rank not in ratios else round(ratios[row.rank], 3),
                straggler=tuple(site for site, _ in flagged.get(row.rank, ())),
                timings={
                    site: (round(t.cycle, 6), round(t.gap, 6), round(t.duration, 6))
                    for site, t in list(timings.get(row.rank, {}).items())[:TIMED_SITES]
                },
            )
            if row.rank in ratios or row.rank in timings
            else row
            for row in rows
        )
