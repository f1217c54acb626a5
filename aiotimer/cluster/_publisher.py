"""The node publisher: keeps a node's record in the store while the node runs.

The shell around :class:`~._record.PublishSchedule`: it claims the node's name under
its own lease, rewrites the record on change (at most once per ``min_interval``) and
every ``heartbeat``, keeps the lease alive from the event loop, re-claims the name with
a new lease when the old one expired (etcd was down longer than its time to live), and
on a clean stop marks the node as left and revokes its lease. Store outages are logged
and retried; they never stop the node's workers.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import anyio
import anyio.abc
import msgspec

from aiotimer._edges.clock import Clock, MonotonicClock
from aiotimer.cluster._record import (
    MemberRecord,
    NodeRecord,
    PublishSchedule,
    ReapRecord,
    decode,
    encode,
    member_key,
    node_key,
)
from aiotimer.cluster._store import Store
from aiotimer.errors import LeaseLostError, NodeNameTakenError, StoreUnavailableError
from aiotimer.events import Event, RankStatus, WorkerInfo, WorkerReaped, signal_name

__all__ = ["NodePublisher", "NodeStatus"]

logger = logging.getLogger("aiotimer.cluster")

#: How many recent reaps a node record carries.
MAX_REAPS = 10
#: How long a clean stop may spend telling the store the node left.
LEAVE_TIMEOUT = 3.0
#: Pause between attempts while the store is unreachable.
RETRY_INTERVAL = 1.0


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """What a node reports about itself right now (built by its supervisor or server).

    ``ranks`` are a supervisor's ranks; ``workers`` the processes its timer server
    watches, maybe a bounded selection: ``workers_total`` counts them all (0: as many as
    listed). ``generation`` is the job-wide restart generation its workers run
    under (job scope only).
    """

    role: str = "server"
    ranks: tuple[RankStatus, ...] = ()
    workers: tuple[WorkerInfo, ...] = ()
    workers_total: int = 0
    restarts: int = 0
    live_timers: int = 0
    counters: Mapping[str, int] = field(default_factory=dict)
    generation: int | None = None


class NodePublisher:
    """Publishes node ``node`` of job ``job`` under ``/aiotimer/v1/<job>/nodes/<node>``.

    Args:
        store: where to publish (see :func:`aiotimer.cluster.connect`).
        job: the job id.
        node: this node's name, unique among the job's live nodes.
        describe: returns the node's current :class:`NodeStatus` (called in the loop,
            at most every ``min_interval``).
        ttl: the lease's time to live in seconds: the record disappears this long after
            the node dies.
        min_interval: the shortest time between two writes of the record.
        clock: the time source.
        host: the host name recorded (default: this machine's).

    Use ``async with publisher:`` or ``await task_group.start(publisher.run)``; feed
    :meth:`on_event` the node's events so reaps appear at once with their scopes.
    """

    def __init__(
        self,
        store: Store,
        *,
        job: str,
        node: str,
        describe: Callable[[], NodeStatus],
        ttl: int = 10,
        min_interval: float = 1.0,
        clock: Clock | None = None,
        host: str | None = None,
    ) -> None:
        if ttl < 1:
            raise ValueError(f"ttl must be at least 1 second, got {ttl}")
        self.store = store
        self.job = job
        self.node = node
        self.ttl = ttl
        self.outcome = "stopped"
        self._describe = describe
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._host = host if host is not None else socket.gethostname()
        self._pid = os.getpid()
        heartbeat = ttl / 3
        self._schedule = PublishSchedule(
            min_interval=min(min_interval, heartbeat), heartbeat=heartbeat
        )
        self._reaps: collections.deque[ReapRecord] = collections.deque(maxlen=MAX_REAPS)
        self._ranks: dict[int, int] = {}
        self._wake = anyio.Event()
        self._lease = 0
        self._started_at = self._clock.time()
        self._last_content: NodeRecord | None = None
        self._outage_since: float | None = None
        self._group: anyio.abc.TaskGroup | None = None
        self.published = 0

    @property
    def key(self) -> str:
        """The node record's key."""
        return node_key(self.job, self.node)

    @property
    def lease(self) -> int:
        """The lease the record is attached to (0 before the first claim)."""
        return self._lease

    def on_event(self, event: Event) -> None:
        """Note a server or supervisor event: reaps are recorded, every event wakes up."""
        if isinstance(event, WorkerReaped):
            self._reaps.append(
                ReapRecord(
                    at=event.time,
                    pid=event.pid,
                    rank=self._ranks.get(event.pid),
                    scopes=event.scopes,
                    signal=signal_name(event.signal),
                )
            )
        self.changed()

    def changed(self) -> None:
        """The node's state changed: publish it soon (within ``min_interval``)."""
        self._schedule.changed()
        self._wake.set()

    # -- lifecycle --------------------------------------------------------------------

    async def __aenter__(self) -> NodePublisher:
        await self._claim()
        self._group = anyio.create_task_group()
        await self._group.__aenter__()
        self._group.start_soon(self._serve)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._group is not None
        self._group.cancel_scope.cancel()
        await self._group.__aexit__(None, None, None)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Claim the name, report started, then publish until cancelled; leave cleanly.

        Raises:
            NodeNameTakenError: a live node already publishes under this name.
            StoreUnavailableError: the store could not be reached for the first claim.
        """
        await self._claim()
        task_status.started()
        await self._serve()

    async def _serve(self) -> None:
        try:
            await self._loop()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(LEAVE_TIMEOUT):
                await self._leave()

    async def _loop(self) -> None:
        while True:
            now = self._clock.monotonic()
            try:
                await self._tick(now)
                if self._outage_since is not None:
                    logger.warning(
                        "cluster store reachable again after %.1fs; node %s republished",
                        now - self._outage_since,
                        self.node,
                    )
                    self._outage_since = None
                wake = min(self._schedule.due(now), now + self._schedule.min_interval)
            except (StoreUnavailableError, LeaseLostError) as exc:
                self._schedule.failed()
                if self._outage_since is None:
                    self._outage_since = now
                    logger.warning(
                        "cannot publish node %s of job %s: %s; retrying every %gs "
                        "(workers keep running)",
                        self.node,
                        self.job,
                        exc,
                        RETRY_INTERVAL,
                    )
                wake = now + RETRY_INTERVAL
            await self._sleep_until(wake)

    async def _sleep_until(self, deadline: float) -> None:
        """Sleep until ``deadline`` on the clock, or until :meth:`changed` is called."""
        self._wake = wake = anyio.Event()
        async with anyio.create_task_group() as tg:

            async def sleep() -> None:
                await self._clock.sleep_until(deadline)
                wake.set()

            tg.start_soon(sleep)
            await wake.wait()
            tg.cancel_scope.cancel()

    async def _tick(self, now: float) -> None:
        """Keep the lease, then write the record if it changed or the heartbeat is due."""
        record = self._record()
        if msgspec.structs.replace(record, updated_at=0.0) != self._last_content:
            self._schedule.changed()
        if self._schedule.due(now) > now:
            return
        if not self._lease or not await self.store.keep_alive(self._lease):
            if self._lease:
                logger.warning("lease of node %s expired; claiming the name again", self.node)
            await self._claim()
            return
        try:
            await self.store.put(self.key, encode(record), lease=self._lease)
        except LeaseLostError:
            await self._claim()
            return
        self._written(record)

    def _written(self, record: NodeRecord) -> None:
        self._schedule.published(self._clock.monotonic())
        self._last_content = msgspec.structs.replace(record, updated_at=0.0)
        self.published += 1

    def _record(self) -> NodeRecord:
        status = self._describe()
        self._ranks = {r.pid: r.rank for r in status.ranks if r.pid is not None}
        return NodeRecord(
            node=self.node,
            job=self.job,
            host=self._host,
            pid=self._pid,
            role=status.role,
            started_at=self._started_at,
            updated_at=self._clock.time(),
            heartbeat=self._schedule.heartbeat,
            generation=status.generation,
            ranks=status.ranks,
            workers=status.workers,
            workers_total=max(status.workers_total, len(status.workers)),
            restarts=status.restarts,
            live_timers=status.live_timers,
            counters=dict(status.counters),
            last_reaps=tuple(self._reaps),
        )

    async def _claim(self) -> None:
        """Attach a fresh lease and create the record; refuse a name a live node holds."""
        lease = await self.store.grant_lease(self.ttl)
        self._lease = lease
        record = self._record()
        value = encode(record)
        while not await self.store.put_if(self.key, value, mod_revision=0, lease=lease):
            existing = await self.store.get(self.key)
            if existing is None:
                continue  # it just expired: try again
            other = decode(NodeRecord, existing.value)
            if other is not None and not self._is_own_predecessor(other):
                with contextlib.suppress(StoreUnavailableError):
                    await self.store.revoke_lease(lease)
                self._lease = 0
                raise NodeNameTakenError(
                    f"node name {self.node!r} of job {self.job!r} is already published by a "
                    f"live node (host {other.host}, pid {other.pid}); give this node another "
                    f"--node, or stop that one (its record expires {self.ttl}s after it dies)"
                )
            if await self.store.put_if(
                self.key, value, mod_revision=existing.mod_revision, lease=lease
            ):
                break
        member = MemberRecord(
            node=self.node, host=self._host, pid=self._pid, joined_at=self._started_at
        )
        await self.store.put(member_key(self.job, self.node), encode(member))
        self._written(record)

    def _is_own_predecessor(self, other: NodeRecord) -> bool:
        """A record left by this process, or by a dead process on this host."""
        if other.host != self._host:
            return False
        if other.pid == self._pid:
            return True
        try:
            os.kill(other.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    async def _leave(self) -> None:
        """Record that the node left (with :attr:`outcome`) and revoke its lease."""
        member = MemberRecord(
            node=self.node,
            host=self._host,
            pid=self._pid,
            joined_at=self._started_at,
            left_at=self._clock.time(),
            outcome=self.outcome,
            last_reaps=tuple(self._reaps),
        )
        try:
            await self.store.put(member_key(self.job, self.node), encode(member))
            if self._lease:
                await self.store.revoke_lease(self._lease)
        except (StoreUnavailableError, LeaseLostError) as exc:
            logger.warning("node %s could not record that it left: %s", self.node, exc)

    def __repr__(self) -> str:
        return f"<NodePublisher {self.key} lease={self._lease:x} writes={self.published}>"
