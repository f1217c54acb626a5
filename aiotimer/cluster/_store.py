"""The store protocol: the few key-value operations the cluster layer needs.

The publisher, the job view and the job-wide restart coordinator talk to a
:class:`Store`, never to an etcd client, so the core has no gRPC dependency and unit
tests run on :class:`~aiotimer.testing.MemoryStore`. The semantics are etcd v3's:

- every write bumps a store-wide *revision*; an entry remembers the revision of its
  last write (``mod_revision``), and a missing key has ``mod_revision`` 0;
- a *lease* is granted with a time to live; keys written with it are deleted when it
  expires or is revoked; :meth:`Store.keep_alive` renews it and says whether it was
  still alive;
- :meth:`Store.put_if` is the transaction every coordination step uses: write only if
  the key's ``mod_revision`` is still the one the caller read (0: only if absent);
- :meth:`Store.watch` yields a key's current state, then every later change, so a
  watcher never misses a write made between its read and its watch.

Every operation that cannot reach the store raises
:class:`~aiotimer.errors.StoreUnavailableError`; callers retry.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Entry", "Store"]


@dataclass(frozen=True, slots=True)
class Entry:
    """One key's value as stored: its last write's revision and its lease (0: none)."""

    key: str
    value: bytes
    mod_revision: int
    lease: int = 0


class Store(Protocol):
    """An etcd v3-like key-value store (see the module docstring for the semantics)."""

    async def get(self, key: str) -> Entry | None:
        """The key's entry, or None when it does not exist."""
        ...

    async def get_prefix(self, prefix: str) -> list[Entry]:
        """Every entry whose key starts with ``prefix``, in key order."""
        ...

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> None:
        """Write the key unconditionally, attached to ``lease`` when non-zero."""
        ...

    async def put_if(self, key: str, value: bytes, *, mod_revision: int, lease: int = 0) -> bool:
        """Write the key only if its ``mod_revision`` is still ``mod_revision``.

        ``mod_revision=0`` writes only if the key does not exist. Returns whether it
        wrote (False: someone else wrote first; read again and decide again).
        """
        ...

    async def delete(self, key: str) -> None:
        """Delete the key (no error when it does not exist)."""
        ...

    async def grant_lease(self, ttl: int) -> int:
        """Grant a lease of ``ttl`` seconds; return its id (never 0)."""
        ...

    async def keep_alive(self, lease: int) -> bool:
        """Renew the lease for its full TTL; False when it has already expired."""
        ...

    async def revoke_lease(self, lease: int) -> None:
        """Revoke the lease now, deleting its keys (no error when already gone)."""
        ...

    def watch(self, key: str) -> AbstractAsyncContextManager[AsyncIterator[Entry | None]]:
        """Watch one key: ``async with store.watch(k) as changes: async for e in changes``.

        The first item is the key's current state (None: absent); each later item is
        the state after a change. The iterator raises
        :class:`~aiotimer.errors.StoreUnavailableError` when the store goes away.
        """
        ...

    async def aclose(self) -> None:
        """Release the connection. Idempotent."""
        ...
