"""A supervised node in the cluster: its published record and, in job scope, job restarts.

:func:`cluster_session` gives ``aiotimer run`` (or an embedding agent) a
:class:`ClusterSession`: without etcd it does nothing; with etcd it publishes the
supervisor's record and, with ``--restart-scope job``, is the supervisor's
:class:`~aiotimer.supervisor.RestartCoordinator`:

- a worker failure is not restarted locally: :meth:`JobCoordinator.decide` bumps the
  job-wide generation (or finds that another node already did) and defers;
- a follower task restarts every worker of the node with ``AIOTIMER_RESTART_COUNT`` set
  to each new generation, on every node alike, and gives the run up when the job does;
- the node's first workers start with the current generation (late or restarted nodes
  catch up), and a node that gives up on its own ends the job everywhere.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import anyio.abc

from aiotimer._edges.lifecycle import LifecycleState
from aiotimer.cluster._args import NodeConfig
from aiotimer.cluster._cli import MAX_RECORD_WORKERS
from aiotimer.cluster._connect import connect
from aiotimer.cluster._generation import GenerationRecord
from aiotimer.cluster._hang import publish_part
from aiotimer.cluster._job import JobRestarts
from aiotimer.cluster._learned import LearnedSharing, sharing_learned
from aiotimer.cluster._publisher import NodePublisher, NodeStatus
from aiotimer.cluster._store import Store
from aiotimer.errors import ClusterError, ServerStateError
from aiotimer.events import Event, HangReported, SupervisorGaveUp, WorkerStarted
from aiotimer.supervisor import (
    Decision,
    RestartPolicy,
    Supervisor,
    SupervisorActions,
    WorkerFailure,
)

__all__ = ["ClusterSession", "JobCoordinator", "cluster_session", "supervisor_status"]

logger = logging.getLogger("aiotimer.cluster")

#: How long a node that gave up on its own may spend telling the job.
GIVE_UP_TIMEOUT = 5.0


def supervisor_status(supervisor: Supervisor, generation: int | None = None) -> NodeStatus:
    """A supervisor's :class:`~aiotimer.cluster.NodeStatus`: its ranks, and the workers
    its embedded server watches, from the server's bounded
    :meth:`~aiotimer.TimerServer.snapshot` (the timer table is never copied)."""
    state = supervisor.get_state(server=False)
    server = supervisor.server
    doc = None
    if server is not None and server.state in (LifecycleState.RUNNING, LifecycleState.STOPPING):
        doc = server.snapshot(MAX_RECORD_WORKERS, sites=0).document
    return NodeStatus(
        role="supervisor",
        ranks=state.workers,
        workers=() if doc is None else doc.workers,
        workers_total=0 if doc is None else doc.workers_total,
        restarts=sum(max(0, w.attempts - 1) for w in state.workers),
        live_timers=0 if doc is None else doc.timers_total,
        counters={} if doc is None else doc.counters,
        generation=generation,
    )


@dataclass(eq=False)
class JobCoordinator:
    """The :class:`~aiotimer.supervisor.RestartCoordinator` of ``--restart-scope job``.

    ``start`` is the generation record the node's first workers start under.
    """

    job: JobRestarts
    start: GenerationRecord = field(default_factory=GenerationRecord)
    generation: int = field(init=False)
    _rank_generation: dict[int, int] = field(default_factory=dict)
    _gave_up: str | None = None
    _hang_generation: int | None = None  # the hung generation of a report to publish
    _hang_taken: anyio.Event = field(default_factory=anyio.Event)

    def __post_init__(self) -> None:
        self.generation = self.start.generation

    async def decide(
        self, supervisor: SupervisorActions, failure: WorkerFailure, proposal: Decision
    ) -> Decision | None:
        """Bump the job's generation for ``failure`` (unless done already) and defer."""
        seen = self._rank_generation.get(failure.rank, self.generation)
        record = await self.job.request(
            seen=seen, rank=failure.rank, reason=failure.reason.describe()
        )
        logger.info(
            "job %s: worker %d failed in generation %d; job generation now %d%s",
            self.job.job,
            failure.rank,
            seen,
            record.generation,
            "" if record.gave_up is None else " (the job gives up)",
        )
        return None  # the follower restarts this node with every other one

    def on_event(self, event: Event) -> None:
        """Track each worker's generation; note a give-up of this node's own."""
        if isinstance(event, WorkerStarted):
            self._rank_generation[event.rank] = event.restarts
        elif isinstance(event, SupervisorGaveUp) and self._gave_up is None:
            self._gave_up = event.reason
        elif isinstance(event, HangReported):
            # Taken before the restart: the ranks still run the generation that hung.
            self._hang_generation = max(self._rank_generation.values(), default=self.generation)
            self._hang_taken.set()

    async def publish_hang_reports(self, supervisor: Supervisor) -> None:
        """Write each hang report of this node as its part of the job's report."""
        while True:
            await self._hang_taken.wait()
            self._hang_taken = anyio.Event()
            report, generation = supervisor.hang_report, self._hang_generation
            if report is not None and generation is not None:
                await publish_part(
                    self.job.store, job=self.job.job, node=self.job.node,
                    generation=generation, report=report,
                )  # fmt: skip

    async def follow(self, supervisor: Supervisor) -> None:
        """Restart the node's workers at each new generation; give up when the job does."""
        async for record in self.job.follow(known=self.start):
            if record.gave_up is not None:
                self._gave_up = self._gave_up or record.gave_up
                with contextlib.suppress(ServerStateError):
                    supervisor.give_up(record.gave_up)
                return
            if record.generation <= self.generation:
                continue
            self.generation = record.generation
            cause = "" if record.node is None else f", after node {record.node}"
            cause += "" if record.rank is None else f" rank {record.rank}"
            cause += f": {record.reason}" if record.reason else ""
            logger.warning(
                "job %s restarts (generation %d%s); restarting this node's workers in %.1fs",
                self.job.job,
                record.generation,
                cause,
                record.delay,
            )
            if record.delay > 0:
                await anyio.sleep(record.delay)
            if supervisor.state is not LifecycleState.RUNNING:
                return
            with contextlib.suppress(ServerStateError):
                await supervisor.restart_workers(count=record.generation)

    async def tell_job_if_gave_up(self) -> None:
        """If this node gave up on its own, end the job everywhere (bounded)."""
        if self._gave_up is None:
            return
        with anyio.move_on_after(GIVE_UP_TIMEOUT) as scope:
            await self.job.give_up(f"node {self.job.node} gave up: {self._gave_up}")
        if scope.cancelled_caught:
            logger.error("could not tell job %s that node %s gave up", self.job.job, self.job.node)


@dataclass(eq=False)
class ClusterSession:
    """What ``aiotimer run`` needs from the cluster (all no-ops without etcd)."""

    store: Store | None = None
    config: NodeConfig | None = None
    coordinator: JobCoordinator | None = None
    publisher: NodePublisher | None = None
    sharing: LearnedSharing | None = None

    @property
    def restart_count(self) -> int:
        """The restart count the node's first workers start with (the job generation)."""
        return 0 if self.coordinator is None else self.coordinator.generation

    def on_event(self, event: Event) -> None:
        """Feed the supervisor's events (pass as its ``on_event``)."""
        if self.coordinator is not None:
            self.coordinator.on_event(event)
        if self.publisher is not None:
            self.publisher.on_event(event)
        if self.sharing is not None:
            self.sharing.on_event(event)

    @asynccontextmanager
    async def publishing(self, supervisor: Supervisor) -> AsyncIterator[None]:
        """Publish ``supervisor``'s node record for the duration (enter it first).

        Raises:
            NodeNameTakenError: a live node of the job already has this name.
            StoreUnavailableError: etcd cannot be reached.
        """
        if self.store is None or self.config is None:
            yield
            return
        coordinator = self.coordinator
        self.publisher = NodePublisher(
            self.store,
            job=self.config.job,
            node=self.config.node,
            describe=lambda: supervisor_status(
                supervisor, None if coordinator is None else coordinator.generation
            ),
            ttl=self.config.ttl,
        )
        async with (
            self.publisher,
            sharing_learned(self.store, self.config, supervisor) as self.sharing,
        ):
            try:
                yield
            finally:
                outcome = supervisor.outcome
                self.publisher.outcome = "stopped" if outcome is None else outcome.name.lower()

    @asynccontextmanager
    async def coordinating(self, supervisor: Supervisor) -> AsyncIterator[None]:
        """Follow the job's generation while the (started) supervisor runs."""
        if self.coordinator is None:
            yield
            return
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.coordinator.follow, supervisor)
            tg.start_soon(self.coordinator.publish_hang_reports, supervisor)
            try:
                yield
            finally:
                await self.coordinator.tell_job_if_gave_up()
                tg.cancel_scope.cancel()


@asynccontextmanager
async def cluster_session(
    config: NodeConfig | None, job_policy: RestartPolicy | None
) -> AsyncIterator[ClusterSession]:
    """Connect to etcd (if ``config``) and read the job's generation (if ``job_policy``).

    ``job_policy`` is the job-wide restart policy of ``--restart-scope job`` (None:
    node-local restarts).

    Raises:
        MissingExtraError: ``aiotimer[etcd]`` is not installed.
        StoreUnavailableError: etcd cannot be reached.
        ClusterError: the job has already given up, or job scope without a config.
    """
    if config is None:
        if job_policy is not None:
            raise ClusterError("--restart-scope job needs --etcd HOST:PORT and --job ID")
        yield ClusterSession()
        return
    store = connect(config.endpoints)
    try:
        coordinator = None
        if job_policy is not None:
            job = JobRestarts(store, job=config.job, node=config.node, policy=job_policy)
            current = await job.current()
            if current.gave_up is not None:
                raise ClusterError(
                    f"job {config.job} has given up ({current.gave_up}); start a new job id, "
                    f"or delete {job.key} to reset it"
                )
            coordinator = JobCoordinator(job, start=current)
        yield ClusterSession(store, config, coordinator)
    finally:
        await store.aclose()
