"""What a node publishes, where, and when. Pure: no I/O, no clock reads.

Layout under ``/aiotimer/v1/<job>/``:

- ``nodes/<node>`` — the node's :class:`NodeRecord`, attached to the node's lease: it
  disappears by itself when the node dies (its lease is no longer kept alive);
- ``members/<node>`` — a :class:`MemberRecord` without lease: a node that joined and
  never said it left, but whose record is gone, is *lost*;
- ``generation`` — the job-wide restart generation (see :mod:`._generation`).

Records are JSON (msgspec), so ``etcdctl get --prefix /aiotimer/v1/`` is readable.
:class:`PublishSchedule` decides when to write: soon after a change but at most once
per ``min_interval``, and at least every ``heartbeat`` (which also refreshes
``updated_at``, so a reader can tell a live node from a stalled one).
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from aiotimer.events import RankStatus

__all__ = [
    "KEY_ROOT",
    "MemberRecord",
    "NodeRecord",
    "PublishSchedule",
    "ReapRecord",
    "WorkerRecord",
    "decode",
    "encode",
    "generation_key",
    "job_prefix",
    "member_key",
    "node_key",
]

KEY_ROOT = "/aiotimer/v1"


def job_prefix(job: str) -> str:
    """``/aiotimer/v1/<job>/``."""
    return f"{KEY_ROOT}/{job}/"


def node_key(job: str, node: str) -> str:
    """Where node ``node`` of ``job`` publishes its record."""
    return f"{job_prefix(job)}nodes/{node}"


def member_key(job: str, node: str) -> str:
    """Where node ``node`` of ``job`` records that it joined (and left)."""
    return f"{job_prefix(job)}members/{node}"


def generation_key(job: str) -> str:
    """The job-wide restart generation every node of ``job`` watches."""
    return f"{job_prefix(job)}generation"


class WorkerRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One worker the node's timer server watches: its pid, its state there (``timed``,
    ``idle``, ``reaping``) and how many live timers it has."""

    pid: int
    state: str = "unknown"
    live_timers: int = 0


class ReapRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A worker the node's timer server reaped: when (epoch), whom, which scopes, how."""

    at: float
    pid: int
    rank: int | None = None
    scopes: tuple[str, ...] = ()
    signal: str = ""


class NodeRecord(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a node publishes about itself (times are epoch seconds).

    ``heartbeat`` is how often the node rewrites the record at the latest: a record
    older than a few heartbeats belongs to a stalled node. ``ranks`` are a supervisor's
    ranks (none for a bare server); ``workers`` the processes its timer server watches,
    maybe only some of them: ``workers_total`` counts them all.
    """

    node: str
    job: str
    host: str
    pid: int
    role: str = "server"
    started_at: float
    updated_at: float
    heartbeat: float
    generation: int | None = None
    ranks: tuple[RankStatus, ...] = ()
    workers: tuple[WorkerRecord, ...] = ()
    workers_total: int = 0
    restarts: int = 0
    live_timers: int = 0
    counters: dict[str, int] = msgspec.field(default_factory=dict)
    last_reaps: tuple[ReapRecord, ...] = ()


class MemberRecord(msgspec.Struct, frozen=True, kw_only=True):
    """That a node joined the job, and whether it left cleanly (``left_at``).

    A node that leaves keeps its last reaps here, so the job view still shows them.
    """

    node: str
    host: str
    pid: int
    joined_at: float
    left_at: float | None = None
    outcome: str | None = None
    last_reaps: tuple[ReapRecord, ...] = ()


_R = TypeVar("_R", bound=msgspec.Struct)


def encode(record: msgspec.Struct) -> bytes:
    """A record as the JSON stored in etcd."""
    return msgspec.json.encode(record)


def decode(kind: type[_R], data: bytes) -> _R | None:
    """Decode a stored record; None when it is not a valid ``kind`` (never raises)."""
    try:
        return msgspec.json.decode(data, type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


class PublishSchedule:
    """When to write the node record next (pure; ``now`` is monotonic seconds).

    A change (:meth:`changed`) is published at once unless the last write was less than
    ``min_interval`` ago, then as soon as that interval has passed; without changes the
    record is rewritten every ``heartbeat``. :meth:`due` is the time of the next write.
    """

    def __init__(self, *, min_interval: float, heartbeat: float) -> None:
        if not 0 <= min_interval <= heartbeat:
            raise ValueError(
                f"need 0 <= min_interval <= heartbeat, got {min_interval} and {heartbeat}"
            )
        self.min_interval = min_interval
        self.heartbeat = heartbeat
        self.dirty = True
        self._last: float | None = None

    def changed(self) -> None:
        """The node's state changed since the last write."""
        self.dirty = True

    def due(self, now: float) -> float:
        """When the next write should happen (``<= now``: write now)."""
        if self._last is None:
            return now
        if self.dirty:
            return max(now, self._last + self.min_interval)
        return self._last + self.heartbeat

    def published(self, now: float) -> None:
        """A write succeeded at ``now``."""
        self._last = now
        self.dirty = False

    def failed(self) -> None:
        """A write failed: the state is still unpublished."""
        self.dirty = True
