"""Connecting to etcd and reading a job's view: the two entry points of the cluster
layer (:func:`connect`, :func:`read_view`), apart from the face so that the package's
own modules can use them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import msgspec

from aiotimer.cluster._generation import GenerationRecord
from aiotimer.cluster._record import (
    MemberRecord,
    NodeRecord,
    generation_key,
    member_key,
    node_key,
    parse,
)
from aiotimer.cluster._store import Entry, Store
from aiotimer.cluster._view import JobView, build_view
from aiotimer.errors import MissingExtraError

__all__ = ["MISSING_ETCD", "connect", "read_view"]


_R = TypeVar("_R", bound=msgspec.Struct)

#: What to tell a user who asked for etcd without the client library.
MISSING_ETCD = "aiotimer[etcd] is required for --etcd: pip install 'aiotimer[etcd]'"


def connect(endpoints: str | Sequence[str], *, timeout: float = 5.0) -> Store:
    """An etcd v3 :class:`Store` on ``endpoints`` (``"HOST:PORT[,HOST:PORT...]"``).

    Connects lazily: the first operation reaches etcd (and raises
    :class:`~aiotimer.errors.StoreUnavailableError` if it cannot).

    Raises:
        MissingExtraError: the ``aiotimer[etcd]`` extra (``aetcd``) is not installed.
        ValueError: an endpoint is not ``HOST:PORT``.
    """
    try:
        from aiotimer.cluster._etcd import EtcdStore  # noqa: PLC0415  (optional extra)
    except ImportError as exc:
        raise MissingExtraError(MISSING_ETCD) from exc
    return EtcdStore(endpoints, timeout=timeout)


async def read_view(store: Store, job: str, *, now: float) -> JobView:
    """Read job ``job``'s records from ``store`` and build its view at wall time ``now``.

    Records that are not valid (garbage, or values out of range such as a pid past
    ``pid_t``) are skipped; :attr:`JobView.skipped` says which and why, one line each.

    Raises:
        StoreUnavailableError: the store cannot be reached.
    """
    # Members first: a node writes its record before its member entry, so a member read
    # first always finds its record read after (a joining node never shows as lost).
    members = await store.get_prefix(member_key(job, ""))
    nodes = await store.get_prefix(node_key(job, ""))
    generation = await store.get(generation_key(job))
    skipped: list[str] = []

    def valid(kind: type[_R], entry: Entry | None) -> _R | None:
        if entry is None:
            return None
        record = parse(kind, entry.value)
        if isinstance(record, str):
            skipped.append(f"{entry.key}: {record}")
            return None
        return record

    view = build_view(
        job,
        [r for e in nodes if (r := valid(NodeRecord, e)) is not None],
        [m for e in members if (m := valid(MemberRecord, e)) is not None],
        valid(GenerationRecord, generation),
        now,
    )
    return msgspec.structs.replace(view, skipped=tuple(skipped))
