"""Job-wide restarts through the store: the shell around :func:`~._generation.next_generation`.

:class:`JobRestarts` does two things for a supervisor in job scope:

- :meth:`JobRestarts.request` — one of this node's workers failed during generation
  ``g``: bump the generation with a compare-and-set (or record that the job gives up),
  unless another node already did;
- :meth:`JobRestarts.give_up` — this node gave up on its own (its budget, or a
  no-restart exit code): end the job on every node;
- :meth:`JobRestarts.follow` — yields each record the node must act on (a newer
  generation, or a give-up), surviving store outages by re-reading and re-watching, and
  writing back what the node knows when the key was lost, rewound or overwritten with
  garbage (see :mod:`._generation`).

A value that is not a valid record is logged (one line per value) and taken as absent:
it never stops a node.
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator, Callable

import anyio
import msgspec

from aiotimer._edges.clock import Clock, MonotonicClock
from aiotimer.cluster._generation import GenerationFollower, GenerationRecord, next_generation
from aiotimer.cluster._record import encode, generation_key, parse
from aiotimer.cluster._store import Entry, Store
from aiotimer.errors import StoreUnavailableError
from aiotimer.supervisor import RestartPolicy

__all__ = ["JobRestarts"]

logger = logging.getLogger("aiotimer.cluster")

#: Pause between attempts while the store is unreachable.
RETRY_INTERVAL = 1.0


class JobRestarts:
    """The job-wide restart generation of ``job``, shared by every node through ``store``.

    Args:
        store: the shared store.
        job: the job id.
        node: this node's name (recorded with the restarts it causes).
        policy: the job-wide budget (``max_restarts`` within ``window``) and back-off.
        clock: wall time for the budget window, monotonic time for retries.
        rng: uniform ``[0, 1)`` for the back-off jitter.
    """

    def __init__(
        self,
        store: Store,
        *,
        job: str,
        node: str,
        policy: RestartPolicy,
        clock: Clock | None = None,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.store = store
        self.job = job
        self.node = node
        self.policy = policy
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._rng = rng
        self._garbage_logged: tuple[int, bytes] | None = None

    @property
    def key(self) -> str:
        """The generation key."""
        return generation_key(self.job)

    async def current(self) -> GenerationRecord:
        """The generation record now (``GenerationRecord()`` when none was written, or
        the key holds no valid record)."""
        return self._read(await self.store.get(self.key)) or GenerationRecord()

    def _read(self, entry: Entry | None) -> GenerationRecord | None:
        """The record ``entry`` holds; ``None`` when absent or not a valid record (said
        once per value, in one line)."""
        if entry is None:
            return None
        record = parse(GenerationRecord, entry.value)
        if isinstance(record, GenerationRecord):
            return record
        if self._garbage_logged != (entry.mod_revision, entry.value):
            self._garbage_logged = (entry.mod_revision, entry.value)
            logger.warning("job %s: %s holds %s; taken as absent", self.job, entry.key, record)
        return None

    async def request(self, *, seen: int, rank: int | None, reason: str) -> GenerationRecord:
        """A worker failed during generation ``seen``: restart the job (or give it up).

        Retries until the store answers. Returns the record that now holds: the one
        this call wrote, or the one another node wrote first.
        """
        while True:
            try:
                entry = await self.store.get(self.key)
                current = self._read(entry) or GenerationRecord()
                new = next_generation(
                    current,
                    seen=seen,
                    policy=self.policy,
                    now=self._clock.time(),
                    u=self._rng(),
                    node=self.node,
                    rank=rank,
                    reason=reason,
                )
                if new is None:
                    return current
                revision = 0 if entry is None else entry.mod_revision
                if await self.store.put_if(self.key, encode(new), mod_revision=revision):
                    return new
            except StoreUnavailableError as exc:
                logger.warning(
                    "cannot restart job %s (node %s rank %s: %s): %s; retrying in %gs",
                    self.job,
                    self.node,
                    rank,
                    reason,
                    exc,
                    RETRY_INTERVAL,
                )
                await self._clock.sleep_until(self._clock.monotonic() + RETRY_INTERVAL)

    async def give_up(self, reason: str) -> GenerationRecord:
        """End the job on every node (a node gave up on its own). Retries until stored.

        Returns the record that now holds (an earlier give-up is kept).
        """
        while True:
            try:
                entry = await self.store.get(self.key)
                current = self._read(entry) or GenerationRecord()
                if current.gave_up is not None:
                    return current
                new = msgspec.structs.replace(
                    current, at=self._clock.time(), node=self.node, rank=None, gave_up=reason
                )
                revision = 0 if entry is None else entry.mod_revision
                if await self.store.put_if(self.key, encode(new), mod_revision=revision):
                    return new
            except StoreUnavailableError as exc:
                logger.warning(
                    "cannot record that job %s gives up: %s; retrying in %gs",
                    self.job,
                    exc,
                    RETRY_INTERVAL,
                )
                await self._clock.sleep_until(self._clock.monotonic() + RETRY_INTERVAL)

    async def follow(
        self, known: GenerationRecord | None = None
    ) -> AsyncIterator[GenerationRecord]:
        """Each record this node must act on: a newer generation (its ``delay`` clamped
        to the policy's back-off cap) or a give-up.

        Args:
            known: the record the node's workers started under; ``None``: the current
                record is yielded first (a node catching up).

        Never ends by itself; store outages are logged and the key is watched again. A
        key found lost, rewound or garbled is written back (see :mod:`._generation`).
        """
        follower = GenerationFollower(self.policy, known)
        while True:
            try:
                async with self.store.watch(self.key) as changes:
                    async for entry in changes:
                        step = follower.observe(self._read(entry), now=self._clock.monotonic())
                        if step.note is not None:
                            logger.warning("job %s: %s", self.job, step.note)
                        if step.write is not None:
                            await self._write_back(entry, step.write)
                        if step.act is not None:
                            yield step.act
            except StoreUnavailableError as exc:
                logger.warning(
                    "lost the watch on job %s's restart generation: %s; watching again in %gs",
                    self.job,
                    exc,
                    RETRY_INTERVAL,
                )
                await self._clock.sleep_until(self._clock.monotonic() + RETRY_INTERVAL)
            await anyio.lowlevel.checkpoint()

    async def _write_back(self, read: Entry | None, record: GenerationRecord) -> None:
        """Write ``record`` if the key still holds what was ``read``. Whether it was
        written or not, the next value comes through the watch (after an outage, the
        value read again is judged again)."""
        revision = 0 if read is None else read.mod_revision
        try:
            await self.store.put_if(self.key, encode(record), mod_revision=revision)
        except StoreUnavailableError as exc:
            logger.warning(
                "job %s: cannot write generation %d back: %s", self.job, record.generation, exc
            )

    def __repr__(self) -> str:
        return f"<JobRestarts {self.key} node={self.node}>"
