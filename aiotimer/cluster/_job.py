"""Job-wide restarts through the store: the shell around :func:`~._generation.next_generation`.

:class:`JobRestarts` does two things for a supervisor in job scope:

- :meth:`JobRestarts.request` — one of this node's workers failed during generation
  ``g``: bump the generation with a compare-and-set (or record that the job gives up),
  unless another node already did;
- :meth:`JobRestarts.give_up` — this node gave up on its own (its budget, or a
  no-restart exit code): end the job on every node;
- :meth:`JobRestarts.follow` — yields the generation record now (a late or restarted
  node catches up) and then every new generation, surviving store outages by
  re-reading and re-watching.
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator, Callable

import anyio
import msgspec

from aiotimer._edges.clock import Clock, MonotonicClock
from aiotimer.cluster._generation import GenerationRecord, next_generation
from aiotimer.cluster._record import decode, encode, generation_key
from aiotimer.cluster._store import Entry, Store
from aiotimer.errors import ClusterError, StoreUnavailableError
from aiotimer.supervisor._restart import RestartPolicy

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

    @property
    def key(self) -> str:
        """The generation key."""
        return generation_key(self.job)

    async def current(self) -> GenerationRecord:
        """The generation record now (``GenerationRecord()`` when none was written)."""
        return _decode(await self.store.get(self.key))

    async def request(self, *, seen: int, rank: int | None, reason: str) -> GenerationRecord:
        """A worker failed during generation ``seen``: restart the job (or give it up).

        Retries until the store answers. Returns the record that now holds: the one
        this call wrote, or the one another node wrote first.
        """
        while True:
            try:
                entry = await self.store.get(self.key)
                current = _decode(entry)
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
                current = _decode(entry)
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

    async def follow(self) -> AsyncIterator[GenerationRecord]:
        """The current record, then each record with a higher generation or a give-up.

        Never ends by itself; store outages are logged and the key is watched again.
        """
        last: GenerationRecord | None = None
        while True:
            try:
                async with self.store.watch(self.key) as changes:
                    async for entry in changes:
                        record = _decode(entry)
                        if last is None or _newer(record, last):
                            last = record
                            yield record
            except StoreUnavailableError as exc:
                logger.warning(
                    "lost the watch on job %s's restart generation: %s; watching again in %gs",
                    self.job,
                    exc,
                    RETRY_INTERVAL,
                )
                await self._clock.sleep_until(self._clock.monotonic() + RETRY_INTERVAL)
            await anyio.lowlevel.checkpoint()

    def __repr__(self) -> str:
        return f"<JobRestarts {self.key} node={self.node}>"


def _decode(entry: Entry | None) -> GenerationRecord:
    if entry is None:
        return GenerationRecord()
    record = decode(GenerationRecord, entry.value)
    if record is None:
        raise ClusterError(
            f"the value of {entry.key} is not a generation record: {entry.value[:80]!r}; "
            "delete the key (etcdctl del) to restart the job's count"
        )
    return record


def _newer(record: GenerationRecord, last: GenerationRecord) -> bool:
    if record.generation != last.generation:
        return record.generation > last.generation
    return record.gave_up is not None and last.gave_up is None
