"""The job's stragglers, from every node's record. Pure: no I/O, no clock reads.

Each node's supervisor names its own slow ranks (docs/stragglers.md) and publishes them
in its record's ranks (:class:`~aiotimer.events.RankStatus` ``straggler`` and
``slowness``); the job view lists them with their node, slowest first.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from aiotimer.cluster._record import NodeRecord

__all__ = ["JobStraggler", "format_stragglers", "job_stragglers"]


class JobStraggler(msgspec.Struct, frozen=True, kw_only=True):
    """A rank a node named a straggler: where, how slow, in which scopes."""

    node: str
    rank: int
    pid: int | None
    slowness: float | None
    scopes: tuple[str, ...]


def job_stragglers(records: Iterable[NodeRecord]) -> tuple[JobStraggler, ...]:
    """Every straggler of ``records``, slowest first."""
    found = [
        JobStraggler(node=rec.node, rank=r.rank, pid=r.pid, slowness=r.slowness, scopes=r.straggler)
        for rec in records
        for r in rec.ranks
        if r.straggler
    ]
    found.sort(key=lambda s: (-(s.slowness or 0.0), s.node, s.rank))
    return tuple(found)


def format_stragglers(stragglers: Iterable[JobStraggler]) -> list[str]:
    """The job view's lines about ``stragglers`` (none when there are none)."""
    lines = [
        f"  node {s.node} rank {s.rank} pid {'-' if s.pid is None else s.pid}  "
        f"{s.slowness or 0:.2f}x its peers in {', '.join(s.scopes)}"
        for s in stragglers
    ]
    return ["stragglers:", *lines] if lines else []
