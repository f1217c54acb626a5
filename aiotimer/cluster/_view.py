"""The job view: every node's record, merged and judged. Pure: no I/O, no clock reads.

A node is

- ``running`` when its record is there and fresh;
- ``stale`` when its record is there but older than :data:`STALE_HEARTBEATS`
  heartbeats (its lease still lives, yet it stopped writing: a blocked loop, a
  partition);
- ``lost`` when it joined (``members/<node>``), never said it left, and its record is
  gone: its lease expired, so it died or lost the store for longer than the TTL;
- ``left`` when it said it left (with its outcome).

Ages compare the reader's wall clock with the writers': clocks skewed by more than a
heartbeat or so make fresh nodes look stale (never lost: that comes from etcd's lease).
"""

from __future__ import annotations

import time as _time
from collections import Counter
from collections.abc import Iterable

import msgspec

from aiotimer.cluster._generation import GenerationRecord
from aiotimer.cluster._record import MemberRecord, NodeRecord, ReapRecord
from aiotimer.cluster._stragglers import JobStraggler, format_stragglers, job_stragglers
from aiotimer.events import WorkerInfo, by_rank

__all__ = ["STALE_HEARTBEATS", "JobView", "NodeRow", "build_view", "format_view", "worker_rows"]

#: A record older than this many of its node's heartbeats (plus one second) is stale.
STALE_HEARTBEATS = 3
#: How many of the job's most recent reaps the view keeps.
RECENT_REAPS = 10


class NodeRow(msgspec.Struct, frozen=True, kw_only=True):
    """One node in the view: its status, its record's age, and the record (if any)."""

    node: str
    status: str
    host: str
    pid: int
    age: float | None = None
    record: NodeRecord | None = None
    outcome: str | None = None


class JobReap(msgspec.Struct, frozen=True, kw_only=True):
    """A reap, with the node it happened on."""

    node: str
    reap: ReapRecord


class JobView(msgspec.Struct, frozen=True, kw_only=True):
    """The whole job at ``now``: nodes (by name), totals, generation and recent reaps;
    ``skipped`` names the stored records that were not valid, and why."""

    job: str
    now: float
    nodes: tuple[NodeRow, ...]
    generation: GenerationRecord | None = None
    totals: dict[str, int] = msgspec.field(default_factory=dict)
    worker_states: dict[str, int] = msgspec.field(default_factory=dict)
    recent_reaps: tuple[JobReap, ...] = ()
    skipped: tuple[str, ...] = ()
    stragglers: tuple[JobStraggler, ...] = ()

    def to_json(self) -> dict[str, object]:
        """The ``--json`` form: ``nodes`` is a list of node records, each with ``node``;
        a record's ``workers`` are its :func:`worker_rows` (a supervisor's ranks, else its
        server's workers) and ``workers_total`` counts them."""
        nodes = []
        for row in self.nodes:
            item: dict[str, object] = {"node": row.node}
            if row.record is not None:
                item = msgspec.to_builtins(row.record)
                del item["ranks"]
                item.update(
                    workers=msgspec.to_builtins(worker_rows(row.record)),
                    workers_total=_worker_count(row.record),
                )
            item.update(node=row.node, status=row.status, host=row.host, pid=row.pid)
            item["age"] = row.age
            if row.outcome is not None:
                item["outcome"] = row.outcome
            nodes.append(item)
        return {
            "job": self.job,
            "time": self.now,
            "generation": msgspec.to_builtins(self.generation),
            "nodes": nodes,
            "totals": self.totals,
            "worker_states": self.worker_states,
            "recent_reaps": [
                {"node": r.node, **msgspec.to_builtins(r.reap)} for r in self.recent_reaps
            ],
            "skipped": list(self.skipped),
            "stragglers": msgspec.to_builtins(self.stragglers),
        }


def build_view(
    job: str,
    records: Iterable[NodeRecord],
    members: Iterable[MemberRecord],
    generation: GenerationRecord | None,
    now: float,
) -> JobView:
    """Merge the stored records into a :class:`JobView` at wall-clock ``now``."""
    rows: dict[str, NodeRow] = {}
    for rec in records:
        age = max(0.0, now - rec.updated_at)
        stale = age > STALE_HEARTBEATS * rec.heartbeat + 1.0
        rows[rec.node] = NodeRow(
            node=rec.node,
            status="stale" if stale else "running",
            host=rec.host,
            pid=rec.pid,
            age=age,
            record=rec,
        )
    reaps: list[JobReap] = []
    for member in members:
        if member.node in rows:
            continue
        reaps.extend(JobReap(node=member.node, reap=r) for r in member.last_reaps)
        left = member.left_at is not None
        rows[member.node] = NodeRow(
            node=member.node,
            status="left" if left else "lost",
            host=member.host,
            pid=member.pid,
            outcome=member.outcome,
        )
    ordered = tuple(rows[name] for name in sorted(rows))
    statuses = Counter(row.status for row in ordered)
    states: Counter[str] = Counter()
    totals = Counter(
        nodes=len(ordered),
        running=statuses["running"],
        stale=statuses["stale"],
        lost=statuses["lost"],
        left=statuses["left"],
    )
    for row in ordered:
        if row.record is None:
            continue
        rec = row.record
        totals["workers"] += _worker_count(rec)
        totals["live_timers"] += rec.live_timers
        totals["restarts"] += rec.restarts
        totals["reaped"] += rec.counters.get("reaped", 0)
        states.update(w.state for w in worker_rows(rec))
        reaps.extend(JobReap(node=row.node, reap=r) for r in rec.last_reaps)
    reaps.sort(key=lambda r: r.reap.at, reverse=True)
    for name in ("workers", "live_timers", "restarts", "reaped"):
        totals.setdefault(name, 0)
    return JobView(
        job=job,
        now=now,
        nodes=ordered,
        generation=generation,
        totals=dict(totals),
        worker_states=dict(sorted(states.items())),
        recent_reaps=tuple(reaps[:RECENT_REAPS]),
        stragglers=job_stragglers(row.record for row in ordered if row.record is not None),
    )


def _worker_count(rec: NodeRecord) -> int:
    """A node's workers: a supervisor's ranks, else every worker its server watches."""
    return len(rec.ranks) if rec.ranks else max(rec.workers_total, len(rec.workers))


def worker_rows(rec: NodeRecord) -> tuple[WorkerInfo, ...]:
    """A node's workers as the job view shows them (the rows ``/v1/state`` serves): one
    per rank of a supervisor (with its live timers, from its server's workers), else the
    workers its server watches."""
    return by_rank(rec.ranks, rec.workers)[0] if rec.ranks else rec.workers


def _worker_line(w: WorkerInfo) -> str:
    pid = "-" if w.pid is None else str(w.pid)
    rank = "-" if w.rank is None else str(w.rank)
    return f"  rank {rank:<4} pid {pid:>8}  {w.state:<10} restarts {w.restarts or 0}" + (
        f", {w.timers} timers" if w.timers else ""
    )


def format_view(view: JobView) -> str:
    """The human view: a job line, a row per node and its workers, the recent reaps."""
    t = view.totals
    gen = view.generation
    lines = [
        f"job {view.job}: {t['nodes']} nodes ({t['running']} running, {t['stale']} stale, "
        f"{t['lost']} lost, {t['left']} left), {t['workers']} workers, "
        f"{t['live_timers']} live timers, {t['restarts']} restarts"
        + ("" if gen is None else f", generation {gen.generation}")
    ]
    if gen is not None and gen.gave_up:
        lines.append(f"  GAVE UP: {gen.gave_up}")
    elif gen is not None and gen.generation:
        lines.append(f"  last job restart: node {gen.node} rank {gen.rank}: {gen.reason}")
    if view.worker_states:
        lines.append(
            "  workers: " + ", ".join(f"{n} {state}" for state, n in view.worker_states.items())
        )
    lines.append(f"{'NODE':<16} {'STATUS':<8} {'HOST':<20} {'PID':>8} {'AGE':>7}  DETAIL")
    for row in view.nodes:
        age = "-" if row.age is None else f"{row.age:.1f}s"
        rec = row.record
        if rec is None:
            detail = f"outcome {row.outcome}" if row.outcome else "record gone (lease expired)"
        else:
            detail = f"{rec.role}, {_worker_count(rec)} workers, {rec.live_timers} timers"
        lines.append(
            f"{row.node:<16} {row.status:<8} {row.host:<20} {row.pid:>8} {age:>7}  {detail}"
        )
        if rec is not None:
            lines += map(_worker_line, worker_rows(rec))
    lines += format_stragglers(view.stragglers)
    if view.recent_reaps:
        lines.append("recent reaps:")
        for item in view.recent_reaps:
            r = item.reap
            when = _time.strftime("%H:%M:%S", _time.localtime(r.at))
            rank = "?" if r.rank is None else str(r.rank)
            scopes = ", ".join(r.scopes) or "?"
            lines.append(
                f"  {when}  node {item.node} rank {rank} pid {r.pid}  {r.signal}  scopes: {scopes}"
            )
    lines += (f"skipped {line}" for line in view.skipped)
    return "\n".join(lines) + "\n"
