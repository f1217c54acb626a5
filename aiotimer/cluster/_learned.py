"""Learned timeouts shared by every node of a job (``expires(after=learned(...))``).

Each node's timer server learns its scopes' values from its own workers' durations
(:mod:`aiotimer.core._learned`). With etcd, each node also publishes them, under
``/aiotimer/v1/<job>/learned/<node>`` (a :class:`LearnedRecord`, attached to a lease of
its own, so it goes with the node), and reads every other node's: a scope's value on
every node is then the **widest** any node learned (:func:`widest`). Why the widest: the
ranks of a job wait on one another (collectives), so a step that is slow on one node is
slow for the job; a value that covers the slowest node never kills a healthy rank, and
it still tightens as fast as the node that set it tightens its own. A node that starts
late (or restarts) starts from the job's values, not from ``initial``.

:class:`LearnedSharing` does it every ``interval`` seconds (default 2), in the node's
loop: a write when its own values changed, one prefix read, and a widen of its server's
values (:meth:`~aiotimer.server.TimerServer.widen_learned`). The first exchange happens
before the node's supervisor starts its server, which takes the job's values as it
starts (:meth:`LearnedSharing.on_event`, on ``server_started``), before its first
worker is launched. An unreachable store is logged once per outage and retried; the
server keeps its own values meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager, suppress
from typing import Annotated, Final

import anyio
import anyio.abc
import msgspec

from aiotimer._edges.lifecycle import LifecycleState
from aiotimer.cluster._args import NodeConfig
from aiotimer.cluster._record import job_prefix, parse
from aiotimer.cluster._store import Store
from aiotimer.errors import LeaseLostError, StoreUnavailableError
from aiotimer.events import Event, ServerStarted
from aiotimer.server import TimerServer
from aiotimer.supervisor import Supervisor

__all__ = [
    "SHARE_INTERVAL",
    "LearnedRecord",
    "LearnedSharing",
    "learned_key",
    "server_values",
    "sharing_learned",
    "widest",
]

logger = logging.getLogger("aiotimer.cluster")

#: Seconds between two exchanges of learned values with the job.
SHARE_INTERVAL: Final[float] = 2.0
#: The most scopes a node publishes (those it knows; the rest stay local).
MAX_SHARED: Final[int] = 1000

_Value = Annotated[float, msgspec.Meta(gt=0, le=1e9)]


class LearnedRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One node's learned values, by scope site, in seconds."""

    node: str
    values: dict[str, _Value] = {}


def learned_prefix(job: str) -> str:
    """Where the nodes of ``job`` publish their learned values."""
    return f"{job_prefix(job)}learned/"


def learned_key(job: str, node: str) -> str:
    """Where node ``node`` of ``job`` publishes its learned values."""
    return learned_prefix(job) + node


def widest(records: Iterable[LearnedRecord], *, skip: str | None = None) -> dict[str, float]:
    """Each scope's widest value among ``records`` (but node ``skip``'s own). Pure."""
    out: dict[str, float] = {}
    for record in records:
        if record.node == skip:
            continue
        for site, value in record.values.items():
            if value > out.get(site, 0.0):
                out[site] = value
    return out


class LearnedSharing:
    """Publishes a node's learned values and widens them to the job's (module docs).

    Args:
        store: the job's store.
        job: the job id.
        node: this node's name.
        read: this node's learned values, by site (called in the loop).
        widen: takes the job's values (called in the loop).
        interval: seconds between exchanges.
        ttl: the lease of the node's record, in seconds.
    """

    def __init__(
        self,
        store: Store,
        *,
        job: str,
        node: str,
        read: Callable[[], Mapping[str, float]],
        widen: Callable[[Mapping[str, float]], None],
        interval: float = SHARE_INTERVAL,
        ttl: int = 10,
    ) -> None:
        self.store = store
        self.job = job
        self.node = node
        self._read = read
        self._widen = widen
        self.interval = interval
        self.ttl = ttl
        self._lease = 0
        self._published: dict[str, float] | None = None
        self._down = False
        self.exchanges = 0
        #: The job's values as last read (the other nodes' widest).
        self.job_values: dict[str, float] = {}

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Exchange values every ``interval`` seconds, until cancelled."""
        task_status.started()
        try:
            while True:
                try:
                    await self.exchange()
                    if self._down:
                        logger.warning("learned timeouts of job %s shared again", self.job)
                        self._down = False
                except (StoreUnavailableError, LeaseLostError) as exc:
                    self._lease, self._published = 0, None
                    if not self._down:
                        logger.warning(
                            "cannot share the learned timeouts of node %s: %s; retrying",
                            self.node,
                            exc,
                        )
                        self._down = True
                await anyio.sleep(self.interval)
        finally:
            if self._lease:
                with (
                    anyio.CancelScope(shield=True),
                    anyio.move_on_after(2.0),
                    suppress(StoreUnavailableError, LeaseLostError),
                ):
                    await self.store.revoke_lease(self._lease)

    async def exchange(self) -> None:
        """One exchange: publish this node's values if they changed, widen to the job's."""
        own = dict(sorted(self._read().items())[:MAX_SHARED])
        if not self._lease or not await self.store.keep_alive(self._lease):
            self._lease = await self.store.grant_lease(self.ttl)
            self._published = None
        if own != self._published:
            record = LearnedRecord(node=self.node, values=own)
            await self.store.put(
                learned_key(self.job, self.node), msgspec.json.encode(record), lease=self._lease
            )
            self._published = own
        records = []
        for entry in await self.store.get_prefix(learned_prefix(self.job)):
            parsed = parse(LearnedRecord, entry.value)
            if isinstance(parsed, str):
                logger.warning("skipping the learned record at %s: %s", entry.key, parsed)
                continue
            records.append(parsed)
        self.job_values = values = widest(records, skip=self.node)
        if values:
            self._widen(values)
        self.exchanges += 1

    def on_event(self, event: Event) -> None:
        """Feed the node's events: a server that has just started (before its workers)
        takes the job's values at once."""
        if isinstance(event, ServerStarted) and self.job_values:
            self._widen(self.job_values)

    def __repr__(self) -> str:
        return f"<LearnedSharing node {self.node} of job {self.job}: {self.exchanges} exchanges>"


def server_values(server: TimerServer | None) -> dict[str, float]:
    """The learned values ``server`` has (past their warm-up), by site; in its loop."""
    if server is None or server.state is not LifecycleState.RUNNING:
        return {}
    return {s.site: s.value for s in server.snapshot(0, sites=0).document.learned if not s.learning}


@asynccontextmanager
async def sharing_learned(
    store: Store, config: NodeConfig, supervisor: Supervisor
) -> AsyncIterator[LearnedSharing]:
    """Share the learned timeouts of ``supervisor``'s server with the job while inside."""

    def widen(values: Mapping[str, float]) -> None:
        server = supervisor.server
        if server is not None:
            server.widen_learned(values)

    sharing = LearnedSharing(
        store,
        job=config.job,
        node=config.node,
        read=lambda: server_values(supervisor.server),
        widen=widen,
        ttl=config.ttl,
    )
    with suppress(StoreUnavailableError, LeaseLostError):  # run() reports an outage
        await sharing.exchange()  # the job's values, for the server about to start
    async with anyio.create_task_group() as tg:
        await tg.start(sharing.run)
        try:
            yield sharing
        finally:
            tg.cancel_scope.cancel()
