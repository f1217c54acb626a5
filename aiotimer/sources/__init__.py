"""Request sources: the transports requests arrive on."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from aiotimer._faces import face_getattr
from aiotimer.sources._base import RequestSink, Source
from aiotimer.sources.fifo import FifoSource
from aiotimer.sources.mpqueue import QueueSource
from aiotimer.sources.socket import SocketSource

if TYPE_CHECKING:
    from aiotimer.sources._base import Drain, serve_source
    from aiotimer.sources._fifo_path import check_fifo_mode

__all__ = [
    "Drain",
    "FifoSource",
    "QueueSource",
    "RequestSink",
    "SocketSource",
    "Source",
    "check_fifo_mode",
    "serve_source",
]

_LAZY: Final[dict[str, str]] = {
    "Drain": "aiotimer.sources._base",
    "check_fifo_mode": "aiotimer.sources._fifo_path",
    "serve_source": "aiotimer.sources._base",
}

__getattr__, __dir__ = face_getattr("aiotimer.sources", globals(), lazy=_LAZY)
