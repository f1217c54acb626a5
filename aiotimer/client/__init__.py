"""The worker side: ``expires()`` blocks, and which client they talk through.

>>> with expires(after=10):                # doctest: +SKIP
...     load_batch()

Transports: :class:`FifoClient` (the FIFO of ``aiotimer serve`` or torch's server),
:class:`QueueClient` (a ``multiprocessing`` queue), :class:`InProcessClient` (a server in
this process). The block itself is :class:`Expires` (see its docs for the two tiers of
an ``async with`` block). :func:`launch_info` tells a worker what launched it
(``aiotimer run``, torchrun, or nothing) and its place in the run.
"""

from __future__ import annotations

from aiotimer._faces import face_getattr
from aiotimer.client._expires import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_KILL_AFTER,
    DEFAULT_SIGNAL,
    DEFAULT_WRITE_TIMEOUT,
    MAX_DEADLINE_AHEAD,
    Expires,
    FifoClient,
    InProcessClient,
    Learned,
    QueueClient,
    QueueRequest,
    RequestSubmitter,
    TimerClient,
    configure,
    current_client,
    expires,
    expires_at,
    learned,
    scope_site,
    timer_server_configured,
    use_client,
)
from aiotimer.client._launch import Launcher, LaunchInfo, launch_info

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_KILL_AFTER",
    "DEFAULT_SIGNAL",
    "DEFAULT_WRITE_TIMEOUT",
    "MAX_DEADLINE_AHEAD",
    "Expires",
    "FifoClient",
    "InProcessClient",
    "LaunchInfo",
    "Launcher",
    "Learned",
    "QueueClient",
    "QueueRequest",
    "RequestSubmitter",
    "TimerClient",
    "configure",
    "current_client",
    "expires",
    "expires_at",
    "launch_info",
    "learned",
    "scope_site",
    "timer_server_configured",
    "use_client",
]

__getattr__, __dir__ = face_getattr(
    "aiotimer.client",
    globals(),
)
