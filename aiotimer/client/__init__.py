"""The worker side: ``expires()`` blocks, and which client they talk through.

>>> with expires(after=10):                # doctest: +SKIP
...     load_batch()

Transports: :class:`FifoClient` (the FIFO of ``aiotimer serve`` or torch's server),
:class:`QueueClient` (a ``multiprocessing`` queue), :class:`InProcessClient` (a server in
this process). The block itself is :class:`Expires` (see its docs for the two tiers of
an ``async with`` block).
"""

from __future__ import annotations

from aiotimer.client._expires import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_KILL_AFTER,
    DEFAULT_SIGNAL,
    DEFAULT_WRITE_TIMEOUT,
    MAX_DEADLINE_AHEAD,
    Expires,
    FifoClient,
    InProcessClient,
    QueueClient,
    QueueRequest,
    RequestSubmitter,
    TimerClient,
    configure,
    current_client,
    expires,
    expires_at,
    scope_site,
    under_timer_server,
    use_client,
)

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_KILL_AFTER",
    "DEFAULT_SIGNAL",
    "DEFAULT_WRITE_TIMEOUT",
    "MAX_DEADLINE_AHEAD",
    "Expires",
    "FifoClient",
    "InProcessClient",
    "QueueClient",
    "QueueRequest",
    "RequestSubmitter",
    "TimerClient",
    "configure",
    "current_client",
    "expires",
    "expires_at",
    "scope_site",
    "under_timer_server",
    "use_client",
]
