"""The sources a :class:`~aiotimer.server.TimerServer` makes of its own from its
``fifo=``, ``queue=`` and ``socket=`` arguments (the others are given as ``sources=``)."""

from __future__ import annotations

import logging
import multiprocessing.queues
import os

from aiotimer.reapers import fifo_mode_warning
from aiotimer.sources import Source
from aiotimer.sources.fifo import FifoSource
from aiotimer.sources.mpqueue import QueueSource
from aiotimer.sources.socket import SocketSource

__all__ = ["own_sources"]

logger = logging.getLogger("aiotimer")


def own_sources(
    *,
    fifo: str | os.PathLike[str] | None,
    queue: multiprocessing.queues.Queue[object] | None,
    socket: str | os.PathLike[str] | None,
    fifo_mode: int,
    socket_mode: int | None,
) -> tuple[list[Source], FifoSource | None]:
    """The sources asked for (socket, FIFO, queue, in that order) and the FIFO's source,
    if any. A FIFO mode others may write is warned of in the log; one that lets them read
    is refused (``ValueError``, by :class:`~aiotimer.sources.FifoSource`)."""
    own: list[Source] = []
    fifo_source: FifoSource | None = None
    if socket is not None:
        own.append(SocketSource(socket, mode=fifo_mode if socket_mode is None else socket_mode))
    if fifo is not None:
        if (warning := fifo_mode_warning(fifo_mode)) is not None:
            logger.warning("%s: %s", fifo, warning)
        marker = {} if socket is None else {"socket": os.fspath(socket)}
        fifo_source = FifoSource(fifo, mode=fifo_mode, marker=marker)
        own.append(fifo_source)
    if queue is not None:
        own.append(QueueSource(queue))
    return own, fifo_source
