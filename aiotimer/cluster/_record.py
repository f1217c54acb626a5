"""What a node publishes, where, and when. Pure: no I/O, no clock reads.

Layout under ``/aiotimer/v1/<job>/``:

- ``nodes/<node>`` — the node's :class:`NodeRecord`, attached to the node's lease: it
  disappears by itself when the node dies (its lease is no longer kept alive);
- ``members/<node>`` — a :class:`MemberRecord` without lease: a node that joined and
  never said it left, but whose record is gone, is *lost*;
- ``generation`` — the job-wide restart generation (see :mod:`._generation`).

Records are JSON (msgspec), so ``etcdctl get --prefix /aiotimer/v1/`` is readable.
Whoever can write to etcd can write anything there, so every record read back is
validated as it is decoded (:func:`parse`): pids are ``pid_t`` values, times are epoch
seconds a calendar can show, counts are not negative. A record that fails is skipped
with one line saying why, never a traceback.
:class:`PublishSchedule` decides when to write: soon after a change but at most once
per ``min_interval``, and at least every ``heartbeat`` (which also refreshes
``updated_at``, so a reader can tell a live node from a stalled one).
"""

from __future__ import annotations

from typing import Annotated, Final, TypeVar

import msgspec

from aiotimer.events import RankStatus, WorkerInfo

__all__ = [
    "KEY_ROOT",
    "MAX_TIME",
    "Count",
    "MemberRecord",
    "NodeRecord",
    "Pid",
    "PublishSchedule",
    "ReapRecord",
    "Seconds",
    "Time",
    "decode",
    "encode",
    "generation_key",
    "job_prefix",
    "member_key",
    "node_key",
    "parse",
]

KEY_ROOT = "/aiotimer/v1"

#: The latest epoch time a record may carry (in the year 5138: far from any real clock,
#: well inside what ``time.localtime`` can show).
MAX_TIME: Final[float] = 1e11
_PID_MAX: Final[int] = 2**31 - 1

#: A process id as stored: a positive ``pid_t``.
Pid = Annotated[int, msgspec.Meta(ge=1, le=_PID_MAX)]
#: Epoch seconds as stored.
Time = Annotated[float, msgspec.Meta(ge=0, le=MAX_TIME)]
#: A duration in seconds as stored (at most ~31 years).
Seconds = Annotated[float, msgspec.Meta(ge=0, le=1e9)]
#: A count as stored.
Count = Annotated[int, msgspec.Meta(ge=0)]


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


class ReapRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A worker the node's timer server reaped: when (epoch), whom, which scopes, how."""

    at: Time
    pid: Pid
    rank: Count | None = None
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
    pid: Pid
    role: str = "server"
    started_at: Time
    updated_at: Time
    heartbeat: Seconds
    generation: Count | None = None
    ranks: tuple[RankStatus, ...] = ()
    workers: tuple[WorkerInfo, ...] = ()
    workers_total: Count = 0
    restarts: Count = 0
    live_timers: Count = 0
    counters: dict[str, Count] = msgspec.field(default_factory=dict)
    last_reaps: tuple[ReapRecord, ...] = ()

    def __post_init__(self) -> None:
        # RankStatus is the supervisor's record (no bounds of its own): checked here.
        for r in self.ranks:
            if r.rank < 0 or r.restarts < 0 or r.attempts < 0 or r.start_failures < 0:
                raise ValueError(f"rank {r.rank} has a negative number")
            if r.pid is not None and not 1 <= r.pid <= _PID_MAX:
                raise ValueError(f"rank {r.rank} has pid {r.pid}, not a pid_t")


class MemberRecord(msgspec.Struct, frozen=True, kw_only=True):
    """That a node joined the job, and whether it left cleanly (``left_at``).

    A node that leaves keeps its last reaps here, so the job view still shows them.
    """

    node: str
    host: str
    pid: Pid
    joined_at: Time
    left_at: Time | None = None
    outcome: str | None = None
    last_reaps: tuple[ReapRecord, ...] = ()


_R = TypeVar("_R", bound=msgspec.Struct)


def encode(record: msgspec.Struct) -> bytes:
    """A record as the JSON stored in etcd."""
    return msgspec.json.encode(record)


def parse(kind: type[_R], data: bytes) -> _R | str:
    """Decode and validate a stored record; when it is not a valid ``kind``, why not
    (one line, with a sample of the value). Never raises."""
    try:
        return msgspec.json.decode(data, type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return f"not a valid {kind.__name__} ({exc}): {data[:80]!r}"


def decode(kind: type[_R], data: bytes) -> _R | None:
    """Decode and validate a stored record; None when it is not a valid ``kind``."""
    record = parse(kind, data)
    return None if isinstance(record, str) else record


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
