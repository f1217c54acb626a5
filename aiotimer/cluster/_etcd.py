"""The etcd v3 :class:`~aiotimer.cluster.Store`, on the ``aetcd`` asyncio client.

Imported only through :func:`aiotimer.cluster.connect`, which turns a missing
``aetcd`` into a clear :class:`~aiotimer.errors.MissingExtraError`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import aetcd
import aetcd.exceptions
import grpc

from aiotimer.cluster._store import Entry
from aiotimer.errors import LeaseLostError, StoreUnavailableError

__all__ = ["EtcdStore", "parse_endpoints"]

_T = TypeVar("_T")

#: gRPC reconnects to a restarted etcd within this (its default backs off to 120 s,
#: far past a node lease's time to live).
_RECONNECT_BACKOFF_MS = 500

_UNAVAILABLE = (
    aetcd.exceptions.ConnectionFailedError,
    aetcd.exceptions.ConnectionTimeoutError,
    aetcd.exceptions.InternalError,
)


def parse_endpoints(text: str | Sequence[str]) -> tuple[tuple[str, int], ...]:
    """``"HOST:PORT[,HOST:PORT...]"`` (an ``http://`` prefix is tolerated) to pairs.

    Raises:
        ValueError: an endpoint is not ``HOST:PORT`` with a numeric port.
    """
    items = text.split(",") if isinstance(text, str) else list(text)
    endpoints = []
    for raw in items:
        item = raw.strip().removeprefix("http://").rstrip("/")
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(
                f"etcd endpoint {raw.strip()!r} is not HOST:PORT (e.g. 127.0.0.1:2379)"
            )
        endpoints.append((host.strip("[]"), int(port)))
    if not endpoints:
        raise ValueError("no etcd endpoint given (expected HOST:PORT[,HOST:PORT...])")
    return tuple(endpoints)


class EtcdStore:
    """A :class:`~aiotimer.cluster.Store` on etcd v3 (``aetcd``, asyncio loops only).

    Talks to one endpoint at a time; when it cannot be reached the operation raises
    :class:`~aiotimer.errors.StoreUnavailableError` and the next operation tries the
    next endpoint. ``timeout`` bounds every call.
    """

    def __init__(self, endpoints: str | Sequence[str], *, timeout: float = 5.0) -> None:
        self._endpoints = parse_endpoints(endpoints)
        self._timeout = timeout
        self._index = 0
        self._client: Any = None

    @property
    def endpoint(self) -> str:
        """The endpoint in use (or tried next)."""
        host, port = self._endpoints[self._index]
        return f"{host}:{port}"

    def _connect(self) -> Any:
        if self._client is None:
            host, port = self._endpoints[self._index]
            self._client = aetcd.Client(
                host=host,
                port=port,
                timeout=self._timeout,
                options={
                    "grpc.initial_reconnect_backoff_ms": _RECONNECT_BACKOFF_MS,
                    "grpc.min_reconnect_backoff_ms": _RECONNECT_BACKOFF_MS,
                    "grpc.max_reconnect_backoff_ms": _RECONNECT_BACKOFF_MS,
                },
            )
        return self._client

    async def _failover(self) -> None:
        client, self._client = self._client, None
        self._index = (self._index + 1) % len(self._endpoints)
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()

    async def _call(self, operation: Callable[[Any], Awaitable[_T]]) -> _T:
        endpoint = self.endpoint
        try:
            return await operation(self._connect())
        except _UNAVAILABLE as exc:
            if len(self._endpoints) > 1:
                await self._failover()
            raise StoreUnavailableError(
                f"etcd at {endpoint} is unavailable ({exc}); check that it runs and that "
                "--etcd names its client URL"
            ) from exc
        except aetcd.exceptions.ClientError as exc:
            if _is_lease_not_found(exc):
                raise LeaseLostError(f"etcd lease not found ({exc})") from exc
            raise

    async def get(self, key: str) -> Entry | None:
        """See :meth:`aiotimer.cluster.Store.get`."""
        kv = await self._call(lambda c: c.get(key.encode()))
        return None if kv is None else _entry(kv)

    async def get_prefix(self, prefix: str) -> list[Entry]:
        """See :meth:`aiotimer.cluster.Store.get_prefix`."""
        result = await self._call(lambda c: c.get_prefix(prefix.encode()))
        return sorted((_entry(kv) for kv in result), key=lambda e: e.key)

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> None:
        """See :meth:`aiotimer.cluster.Store.put`."""
        await self._call(lambda c: c.put(key.encode(), value, lease=lease or None))

    async def put_if(self, key: str, value: bytes, *, mod_revision: int, lease: int = 0) -> bool:
        """See :meth:`aiotimer.cluster.Store.put_if`."""

        async def txn(c: Any) -> bool:
            ops = c.transactions
            succeeded, _ = await c.transaction(
                compare=[ops.mod(key.encode()) == mod_revision],
                success=[ops.put(key.encode(), value, lease=lease or None)],
                failure=[],
            )
            return bool(succeeded)

        return await self._call(txn)

    async def delete(self, key: str) -> None:
        """See :meth:`aiotimer.cluster.Store.delete`."""
        await self._call(lambda c: c.delete(key.encode()))

    async def grant_lease(self, ttl: int) -> int:
        """See :meth:`aiotimer.cluster.Store.grant_lease`."""
        lease = await self._call(lambda c: c.lease(ttl))
        return int(lease.id)

    async def keep_alive(self, lease: int) -> bool:
        """See :meth:`aiotimer.cluster.Store.keep_alive`."""
        reply = await self._call(lambda c: c.refresh_lease(lease))
        return reply is not None and int(reply.TTL) > 0

    async def revoke_lease(self, lease: int) -> None:
        """See :meth:`aiotimer.cluster.Store.revoke_lease`."""
        with contextlib.suppress(LeaseLostError):
            await self._call(lambda c: c.revoke_lease(lease))

    @asynccontextmanager
    async def watch(self, key: str) -> AsyncIterator[AsyncIterator[Entry | None]]:
        """See :meth:`aiotimer.cluster.Store.watch`."""
        raw = key.encode()
        # Read at a known revision, then watch from the next one: nothing is missed.
        current = await self._call(lambda c: c.get_range(raw, raw + b"\0"))
        revision = int(current.header.revision)
        first = _entry(current[0]) if len(current) else None
        watch = await self._call(lambda c: c.watch(raw, start_revision=revision + 1))

        async def changes() -> AsyncIterator[Entry | None]:
            yield first
            try:
                async for event in watch:
                    yield None if event.kind == "DELETE" else _entry(event.kv)
            except _UNAVAILABLE as exc:
                raise StoreUnavailableError(f"etcd watch on {key} ended ({exc})") from exc

        try:
            yield changes()
        finally:
            with contextlib.suppress(Exception):
                await watch.cancel()

    async def aclose(self) -> None:
        """Close the gRPC channel. Idempotent."""
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()

    def __repr__(self) -> str:
        return f"<EtcdStore {self.endpoint}>"


def _entry(kv: Any) -> Entry:
    return Entry(kv.key.decode(), bytes(kv.value), int(kv.mod_revision), int(kv.lease))


def _is_lease_not_found(exc: BaseException) -> bool:
    cause = exc.__cause__
    if isinstance(cause, grpc.aio.AioRpcError):
        return cause.code() is grpc.StatusCode.NOT_FOUND
    return "lease not found" in str(exc)
