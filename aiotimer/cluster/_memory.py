"""An in-memory :class:`~aiotimer.cluster.Store` for tests (exported by aiotimer.testing)."""

from __future__ import annotations

import itertools
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
from anyio.streams.memory import MemoryObjectSendStream

from aiotimer._edges.clock import Clock
from aiotimer.cluster._store import Entry
from aiotimer.errors import LeaseLostError, StoreUnavailableError

__all__ = ["MemoryStore"]

_Change = Entry | None | StoreUnavailableError


@dataclass(slots=True)
class _Lease:
    ttl: int
    expires_at: float
    keys: set[str] = field(default_factory=set)


class MemoryStore:
    """A :class:`~aiotimer.cluster.Store` held in memory, with etcd's semantics.

    Leases expire on ``clock`` (inject a :class:`~aiotimer.testing.FakeClock` to move
    time by hand); expiry is applied at every operation and by :meth:`expire_leases`.
    :meth:`go_down` makes every operation raise
    :class:`~aiotimer.errors.StoreUnavailableError` and ends every watch with it, as a
    crashed etcd would; :meth:`come_back` restores service with the data intact.
    Several users may share one instance, as nodes share one etcd. Use it from one
    event loop.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._entries: dict[str, Entry] = {}
        self._leases: dict[int, _Lease] = {}
        self._lease_ids = itertools.count(0x1000)
        self._revision = 1
        self._watchers: dict[str, set[MemoryObjectSendStream[_Change]]] = {}
        self.available = True

    # -- test controls ---------------------------------------------------------------

    def go_down(self) -> None:
        """Refuse every operation and end every watch until :meth:`come_back`."""
        self.available = False
        for senders in self._watchers.values():
            for sender in senders:
                sender.send_nowait(StoreUnavailableError("the in-memory store is down"))

    def come_back(self) -> None:
        """Serve again, with the data (and leases) as they were."""
        self.available = True

    def expire_leases(self) -> None:
        """Delete the keys of every lease whose time to live has run out."""
        now = self._clock.monotonic()
        for lease_id, lease in list(self._leases.items()):
            if lease.expires_at <= now:
                self._drop_lease(lease_id)

    @property
    def revision(self) -> int:
        """The store-wide revision (bumped by every write)."""
        return self._revision

    # -- the Store protocol ----------------------------------------------------------

    async def get(self, key: str) -> Entry | None:
        """See :meth:`aiotimer.cluster.Store.get`."""
        self._check()
        return self._entries.get(key)

    async def get_prefix(self, prefix: str) -> list[Entry]:
        """See :meth:`aiotimer.cluster.Store.get_prefix`."""
        self._check()
        return [self._entries[k] for k in sorted(self._entries) if k.startswith(prefix)]

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> None:
        """See :meth:`aiotimer.cluster.Store.put`."""
        self._check()
        self._write(key, value, lease)

    async def put_if(self, key: str, value: bytes, *, mod_revision: int, lease: int = 0) -> bool:
        """See :meth:`aiotimer.cluster.Store.put_if`."""
        self._check()
        current = self._entries.get(key)
        if (0 if current is None else current.mod_revision) != mod_revision:
            return False
        self._write(key, value, lease)
        return True

    async def delete(self, key: str) -> None:
        """See :meth:`aiotimer.cluster.Store.delete`."""
        self._check()
        self._remove(key)

    async def grant_lease(self, ttl: int) -> int:
        """See :meth:`aiotimer.cluster.Store.grant_lease`."""
        self._check()
        lease_id = next(self._lease_ids)
        self._leases[lease_id] = _Lease(ttl, self._clock.monotonic() + ttl)
        return lease_id

    async def keep_alive(self, lease: int) -> bool:
        """See :meth:`aiotimer.cluster.Store.keep_alive`."""
        self._check()
        held = self._leases.get(lease)
        if held is None:
            return False
        held.expires_at = self._clock.monotonic() + held.ttl
        return True

    async def revoke_lease(self, lease: int) -> None:
        """See :meth:`aiotimer.cluster.Store.revoke_lease`."""
        self._check()
        self._drop_lease(lease)

    @asynccontextmanager
    async def watch(self, key: str) -> AsyncIterator[AsyncIterator[Entry | None]]:
        """See :meth:`aiotimer.cluster.Store.watch`."""
        self._check()
        sender, receiver = anyio.create_memory_object_stream[_Change](math.inf)
        sender.send_nowait(self._entries.get(key))
        self._watchers.setdefault(key, set()).add(sender)

        async def changes() -> AsyncIterator[Entry | None]:
            async for change in receiver:
                if isinstance(change, StoreUnavailableError):
                    raise change
                yield change

        try:
            yield changes()
        finally:
            self._watchers[key].discard(sender)
            sender.close()
            receiver.close()

    async def aclose(self) -> None:
        """Nothing to release (the data stays for other users)."""

    # -- internals -------------------------------------------------------------------

    def _check(self) -> None:
        if not self.available:
            raise StoreUnavailableError("the in-memory store is down (go_down() was called)")
        self.expire_leases()

    def _write(self, key: str, value: bytes, lease: int) -> None:
        if lease and lease not in self._leases:
            raise LeaseLostError(f"lease {lease:x} not found (it expired or was revoked)")
        old = self._entries.get(key)
        if old is not None and old.lease in self._leases:
            self._leases[old.lease].keys.discard(key)
        self._revision += 1
        entry = Entry(key, value, self._revision, lease)
        self._entries[key] = entry
        if lease:
            self._leases[lease].keys.add(key)
        self._notify(key, entry)

    def _remove(self, key: str) -> None:
        if self._entries.pop(key, None) is not None:
            self._revision += 1
            self._notify(key, None)

    def _drop_lease(self, lease_id: int) -> None:
        lease = self._leases.pop(lease_id, None)
        if lease is not None:
            for key in sorted(lease.keys):
                self._remove(key)

    def _notify(self, key: str, entry: Entry | None) -> None:
        for sender in self._watchers.get(key, ()):
            sender.send_nowait(entry)
