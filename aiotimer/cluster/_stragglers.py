"""The job's stragglers, from every node's record. Pure: no I/O, no clock reads.

Each node's supervisor names its own slow ranks (docs/stragglers.md) and publishes them
in its record's ranks (:class:`~aiotimer.events.RankStatus` ``straggler`` and
``slowness``), with each rank's medians per scope site (``timings``). The job view
lists the ranks the nodes named, and compares every rank of the job with every other
in each site (:func:`~aiotimer.core._straggler.compare_ranks` over the published
medians): a rank at least :data:`~aiotimer.core._straggler.THRESHOLD` times slower than
the job's other ranks is listed too, ``job_wide`` (a rank alone on its node, or a node
whose ranks are all slow, is named this way). The job-wide comparison is of the medians
of each rank's last blocks, as the records hold them, without the detector's run of
evaluations in a row.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from aiotimer.cluster._record import NodeRecord
from aiotimer.core import MIN_EXCESS, THRESHOLD, Timing, compare_ranks

__all__ = ["JobStraggler", "format_stragglers", "job_stragglers"]


class JobStraggler(msgspec.Struct, frozen=True, kw_only=True):
    """A rank named a straggler: where, how slow, in which scopes; ``job_wide`` when
    only the comparison across the job's nodes names it."""

    node: str
    rank: int
    pid: int | None
    slowness: float | None
    scopes: tuple[str, ...]
    job_wide: bool = False


def job_stragglers(records: Iterable[NodeRecord]) -> tuple[JobStraggler, ...]:
    """Every straggler of ``records``, slowest first (see the module docs)."""
    records = list(records)
    found: dict[tuple[str, int], JobStraggler] = {}
    for rec in records:
        for r in rec.ranks:
            if r.straggler:
                found[rec.node, r.rank] = JobStraggler(
                    node=rec.node, rank=r.rank, pid=r.pid, slowness=r.slowness, scopes=r.straggler
                )
    by_site: dict[str, dict[tuple[str, int], Timing]] = {}
    pids = {}
    for rec in records:
        for r in rec.ranks:
            pids[rec.node, r.rank] = r.pid
            for site, timing in r.timings.items():
                by_site.setdefault(site, {})[rec.node, r.rank] = Timing(*timing)
    for site, timings in sorted(by_site.items()):
        for key, (ratio, _, excess) in compare_ranks(timings).items():
            if ratio < THRESHOLD or excess < MIN_EXCESS or key in found:
                continue
            node, rank = key
            found[key] = JobStraggler(
                node=node,
                rank=rank,
                pid=pids[key],
                slowness=round(ratio, 3),
                scopes=(site,),
                job_wide=True,
            )
    return tuple(sorted(found.values(), key=lambda s: (-(s.slowness or 0.0), s.node, s.rank)))


def format_stragglers(stragglers: Iterable[JobStraggler]) -> list[str]:
    """The job view's lines about ``stragglers`` (none when there are none)."""
    lines = [
        f"  node {s.node} rank {s.rank} pid {'-' if s.pid is None else s.pid}  "
        f"{s.slowness or 0:.2f}x its peers in {', '.join(s.scopes)}"
        + (" (across nodes)" if s.job_wide else "")
        for s in stragglers
    ]
    return ["stragglers:", *lines] if lines else []
