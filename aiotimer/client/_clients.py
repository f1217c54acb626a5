"""Transport clients: how a worker's requests reach a timer server.

Every client implements :class:`TimerClient` (``_transport``, with the wait drivers they
share); one module per transport: :class:`FifoClient` (``_fifo``, over ``_fifo_peer``,
which server reads the path, and ``_fifo_link``, the descriptor to it: the named pipe of
``aiotimer serve`` or of torch's ``FileTimerServer``), :class:`QueueClient` (``_queue``:
a ``multiprocessing`` queue, torch's ``TimerRequest`` shape), :class:`InProcessClient`
(``_inprocess``: a server embedded in this process). ``_discovery`` decides which client
a block uses when it names none.
"""

from __future__ import annotations

from aiotimer.client._discovery import (
    configure,
    current_client,
    timer_server_configured,
    use_client,
)
from aiotimer.client._fifo import FifoClient
from aiotimer.client._inprocess import InProcessClient, RequestSubmitter
from aiotimer.client._queue import QueueClient, QueueRequest
from aiotimer.client._transport import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_SIGNAL,
    DEFAULT_WRITE_TIMEOUT,
    TimerClient,
    release_failed,
    release_undelivered,
)

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_SIGNAL",
    "DEFAULT_WRITE_TIMEOUT",
    "FifoClient",
    "InProcessClient",
    "QueueClient",
    "QueueRequest",
    "RequestSubmitter",
    "TimerClient",
    "configure",
    "current_client",
    "release_failed",
    "release_undelivered",
    "timer_server_configured",
    "use_client",
]
