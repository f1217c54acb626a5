"""Request sources: the transports requests arrive on."""

from __future__ import annotations

from aiotimer.sources._base import RequestSink, Source
from aiotimer.sources.fifo import FifoSource
from aiotimer.sources.mpqueue import QueueSource
from aiotimer.sources.socket import SocketSource

__all__ = ["FifoSource", "QueueSource", "RequestSink", "SocketSource", "Source"]
