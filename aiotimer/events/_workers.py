"""The one record of a worker, shared by the server's view, the control plane and the
cluster's node records. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated

import msgspec

from aiotimer.events._supervisor import RankStatus

__all__ = ["WorkerInfo", "by_rank"]

_Count = Annotated[int, msgspec.Meta(ge=0)]


class WorkerInfo(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One worker, the one record of it: a server's snapshot lists these, ``GET
    /v1/state`` serves them as they are (``workers``), and a cluster node record carries
    them.

    A worker's row has its ``pid``, ``state``, how many live ``timers`` it has and (up to
    ``SCOPES_PER_WORKER`` of) their ``scopes``; ``state`` is ``"timed"`` (it has live
    timers), ``"idle"`` (watched, none live) or ``"reaping"`` (an expired timer's reap is
    in progress). Under a supervisor there is one row per rank: its
    :class:`~aiotimer.events.RankStatus`'s ``rank``, ``state`` (``"healthy"``,
    ``"backoff"``, ...), ``restarts`` and ``pid`` (``None`` between attempts), with the
    timers the server lists for that pid; ``rank`` and ``restarts`` are ``None`` in a
    worker's row. A rank's ``slowness`` is its ratio against its peers and
    ``straggler`` the scopes it is a straggler in (docs/stragglers.md). Decoding checks
    the counts are not negative (a node record is read from a shared store).
    """

    pid: Annotated[int, msgspec.Meta(gt=0)] | None
    state: str
    timers: _Count
    scopes: tuple[str, ...] = ()
    restarts: _Count | None = None
    rank: _Count | None = None
    slowness: float | None = None
    straggler: tuple[str, ...] = ()


def by_rank(
    ranks: Iterable[RankStatus], workers: Iterable[WorkerInfo]
) -> tuple[tuple[WorkerInfo, ...], tuple[WorkerInfo, ...]]:
    """Supervised ``ranks`` as worker rows, and the ``workers`` no rank names.

    One row per rank: its ``rank``, ``state``, ``restarts`` and current ``pid``, with the
    ``timers`` and ``scopes`` that ``workers`` (a server's rows) list for that pid. O(n).
    """
    by_pid = {w.pid: w for w in workers}
    rows = []
    for r in ranks:
        listed = None if r.pid is None else by_pid.pop(r.pid, None)
        rows.append(
            WorkerInfo(
                pid=r.pid,
                state=r.state.value,
                timers=0 if listed is None else listed.timers,
                scopes=() if listed is None else listed.scopes,
                restarts=r.restarts,
                rank=r.rank,
                slowness=r.slowness,
                straggler=r.straggler,
            )
        )
    return tuple(rows), tuple(by_pid.values())
