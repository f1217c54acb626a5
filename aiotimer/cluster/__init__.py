"""A job's state across nodes, and job-wide restarts, through etcd v3.

Each node (a supervisor or a server) publishes its record under
``/aiotimer/v1/<job>/nodes/<node>``, attached to its own lease; ``aiotimer status
--etcd`` reads the job view from there. Everything talks to a :class:`Store` (the few
etcd v3 operations it needs); :func:`connect` opens the etcd one, which needs the
``aiotimer[etcd]`` extra, and :class:`aiotimer.testing.MemoryStore` is the in-memory one
for tests.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiotimer.cluster._store import Entry, Store
from aiotimer.errors import MissingExtraError

__all__ = ["Entry", "Store", "connect"]

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
